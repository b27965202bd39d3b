"""An MCP server that puts one redisbus agent in the hands of any MCP-speaking model.

Not a Python API: the command and its tools are the interface (docs/reference/cli.md); its
Python names may change in any release.

MCP cannot tell its callers apart, so one server process serves exactly one agent identity:
``--as NAME`` is bound when the process starts and every message the tools send carries it.
No tool takes a sender argument (docs/security.md#identity).

    redisbus mcp --channel team-1 --as writer --parent director \\
        --description "writes scripts" --skill writing --skill dialogue
    REDISBUS_MCP_TOKEN=... redisbus mcp --channel team-1 --as critic --transport http --port 8765
    python -m redisbus.integrations.mcp ...     # the same command

Tools: ``agent_send_message``, ``agent_read_messages``, ``agent_list_messages``,
``agent_mark_done``, ``agent_wait``, ``agent_discover``. Each result comes as JSON text and as
structured content matching the tool's output schema; a refused call is an MCP tool error
(``isError``) whose text starts with the typed reason, e.g. ``inbox_full: ...``,
``rate_limited: ... (retry_after_s=0.8)``, or ``invalid_input: ...`` for an unknown argument.

- ``agent_wait`` waits 25 s by default and at most 100 s (MCP clients give up on a call after
  about 120 s); each result carries a ``cursor`` that the next wait resumes from.
- When Redis comes back empty, the next tool call joins the agent (and its channel) again.
- The server declares MCP logging and honours ``logging/setLevel`` per session.
- Over HTTP a bearer token (``--token``/``REDISBUS_MCP_TOKEN``) guards every request; without
  one the server only binds to a loopback address.

Built on the official ``mcp`` SDK, version 2 (``MCPServer``; v1 called it ``FastMCP``). This
package imports the SDK only when one of the names below is used, so ``redisbus --help`` works
without the ``mcp`` extra.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._schema import TOOL_NAMES

if TYPE_CHECKING:
    from ._server import build_server, serve, serve_async
    from ._tools import AgentTools, Card

__all__ = [
    "TOOL_NAMES",
    "AgentTools",
    "Card",
    "build_server",
    "serve",
    "serve_async",
]

# the MCP SDK is an optional extra: imported when one of these names is first used
_LAZY = {
    "AgentTools": "._tools",
    "Card": "._tools",
    "build_server": "._server",
    "serve": "._server",
    "serve_async": "._server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
