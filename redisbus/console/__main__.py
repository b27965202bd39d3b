"""``python -m redisbus.console``: the same as ``redisbus console``."""

import sys

from . import main

sys.exit(main())
