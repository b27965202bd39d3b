"""``python -m redisbus.integrations.mcp ARGS`` runs ``redisbus mcp ARGS``."""

import sys

from ..._commands import program
from ._command import mcp

sys.exit(program(mcp, "mcp"))
