"""``python -m redisbus.cli``: the same as the ``redisbus`` command."""

from . import main

main()
