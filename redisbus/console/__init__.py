"""``redisbus console``: a live web console for a bus (the ``redisbus[console]`` extra).

Not a Python API: the command and its HTTP API are the interface (docs/console.md); its
Python names may change in any release.

A page per channel shows the family tree with live statuses, the conversations grouped by
reply thread, each message's receipt timeline per recipient, unread and stuck messages, and
the dead letters; server-sent events keep it current. It never joins a channel and never
marks anything: looking changes nothing. Changes (replay a dead letter, pause, resume) need
the token the console was started with; without one it is read-only. It binds to loopback
unless told otherwise.

    redisbus console [--url URL] [--host 127.0.0.1] [--port 8484] [--token TOKEN]

The command (its options and their checks) is ``_command``, which imports the web app
(``_app``) and its server (``_serve``) only when it runs: this package imports neither until
one of its names below is used, so ``redisbus --help`` works without the extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._app import ConsoleConfig, create_app
    from ._serve import serve

__all__ = ["ConsoleConfig", "create_app", "serve"]

# starlette and uvicorn are an optional extra: imported when one of these names is first used
_LAZY = {"ConsoleConfig": "._app", "create_app": "._app", "serve": "._serve"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
