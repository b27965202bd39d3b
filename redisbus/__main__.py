"""``python -m redisbus``: the same as the ``redisbus`` command."""

from .cli import main

main()
