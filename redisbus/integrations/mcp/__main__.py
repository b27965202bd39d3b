"""``python -m redisbus.integrations.mcp ARGS`` runs ``redisbus mcp ARGS``."""

import sys

from . import main

sys.exit(main())
