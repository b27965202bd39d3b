"""``python -m redisbus.console``: the same as ``redisbus console``."""

import sys

from ..cli import main

main(["console", *sys.argv[1:]])
