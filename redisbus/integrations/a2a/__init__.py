"""An A2A bridge for a redisbus channel, both ways, on the official ``a2a-sdk``.

Not a Python API: the command and the A2A endpoints are the interface (docs/a2a.md); its
Python names may change in any release.

Inbound, every member of the channel is an A2A agent: its card (name, description and skills
from ``join()``) at ``/agents/NAME/.well-known/agent-card.json``, and A2A JSON-RPC at
``/agents/NAME/``. A caller authenticates with a bearer token; the bridge maps each token to
the member name the caller speaks as, so no caller chooses its name. ``SendMessage`` /
``SendStreamingMessage`` (``message/send`` / ``message/stream`` in A2A 0.3) send one bus
message; the task's state follows its receipt and completes with the member's reply.

Outbound, ``--external URL`` adds the A2A agent at URL to the channel as a member: messages
to it are forwarded through the a2a-sdk client, and its answers come back as replies.

    export REDISBUS_URL=redis://localhost:6379/0
    export REDISBUS_A2A_TOKENS='{"s3cret-token": "alice"}'
    redisbus a2a --channel team-1 --port 8700 --external http://localhost:9999

Every bridged message goes through the ordinary send path: inbox caps, rate limits, chain
depth and the pause switch refuse it exactly as they refuse any other, and a refusal is an
A2A error carrying the redisbus reason (see ``docs/a2a.md``).
"""

from __future__ import annotations

import json

from ..._errors import InvalidInput
from ._convert import card_for, refusal
from ._inbound import BusRequestHandler
from ._outbound import External, Forwarder
from ._server import BridgeConfig, build_app

__all__ = [
    "BridgeConfig",
    "BusRequestHandler",
    "External",
    "Forwarder",
    "build_app",
    "card_for",
    "refusal",
]


def load_tokens(path: str | None, inline: str | None) -> dict[str, str]:
    """Tokens from a JSON file or text: ``{"TOKEN": "member-name", ...}``."""
    raw = inline
    if path:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    if not raw:
        return {}
    try:
        tokens = json.loads(raw)
    except json.JSONDecodeError as e:
        raise InvalidInput(f"tokens must be a JSON object of token -> member name: {e}") from e
    if not isinstance(tokens, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in tokens.items()
    ):
        raise InvalidInput("tokens must be a JSON object of token -> member name")
    return tokens


def parse_external(spec: str, parent: str | None = None) -> External:
    """``URL`` or ``NAME=URL``."""
    name, sep, url = spec.partition("=")
    if not sep or "://" in name:
        name, url = "", spec
    if not url.startswith(("http://", "https://")):
        raise InvalidInput(f"--external wants URL or NAME=URL with an http(s) URL, got {spec!r}")
    return External(url=url, name=name or None, parent=parent)
