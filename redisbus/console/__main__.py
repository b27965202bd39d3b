"""``python -m redisbus.console``: the same as ``redisbus console``."""

import sys

from .._commands import program
from ._command import console

sys.exit(program(console, "console"))
