"""``python -m redisbus.integrations.mcp ARGS`` runs ``redisbus mcp ARGS``."""

import sys

from ..._cli_run import run_command

sys.exit(run_command("mcp"))
