"""Run one ``redisbus`` command from a ``python -m redisbus.X`` entry point.

``python -m redisbus.exporter``, ``python -m redisbus.janitor`` and ``python -m
redisbus.integrations.mcp`` run the same command as ``redisbus exporter`` (one parser, one
help, the CLI's exit statuses). This module imports the CLI at the top, so nothing in the
package may import it: only those entry points do, from code that runs as ``__main__``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from .cli import main

__all__ = ["run_command"]


def run_command(name: str, argv: Sequence[str] | None = None) -> int:
    """Run ``redisbus NAME ARGV...`` (``ARGV`` defaults to ``sys.argv[1:]``) and return its
    exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        main([name, *args])
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0
