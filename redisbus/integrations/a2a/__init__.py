"""An A2A bridge for a redisbus channel, both ways, on the official ``a2a-sdk``.

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

import argparse
import json
import os
import sys
from collections.abc import Sequence

from ..._errors import InvalidInput, RedisbusError
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
    "main",
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


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="redisbus a2a",
        description="Serve a channel's members as A2A agents; add external A2A agents to it.",
    )
    p.add_argument(
        "--channel",
        default=env("REDISBUS_A2A_CHANNEL"),
        required=not env("REDISBUS_A2A_CHANNEL"),
        help="channel to bridge (env REDISBUS_A2A_CHANNEL)",
    )
    p.add_argument("--host", default=env("REDISBUS_A2A_HOST", "127.0.0.1"), help="bind address")
    p.add_argument("--port", type=int, default=int(env("REDISBUS_A2A_PORT", "8700")))
    p.add_argument(
        "--public-url",
        default=env("REDISBUS_A2A_PUBLIC_URL"),
        help="base URL the cards advertise (default http://HOST:PORT)",
    )
    p.add_argument(
        "--tokens-file",
        default=env("REDISBUS_A2A_TOKENS_FILE"),
        help='JSON {"TOKEN": "member-name"}: callers and the names they speak as '
        "(or the JSON itself in env REDISBUS_A2A_TOKENS)",
    )
    p.add_argument(
        "--external",
        action="append",
        default=[x for x in env("REDISBUS_A2A_EXTERNAL", "").split(",") if x],
        help="URL or NAME=URL of an A2A agent to add as a member, repeatable "
        "(env REDISBUS_A2A_EXTERNAL, comma-separated)",
    )
    p.add_argument(
        "--external-parent",
        default=env("REDISBUS_A2A_EXTERNAL_PARENT"),
        help="parent of the external agents' members (family channels)",
    )
    p.add_argument(
        "--send-wait",
        type=float,
        default=float(env("REDISBUS_A2A_SEND_WAIT_S", "30")),
        help="seconds a blocking SendMessage waits for the reply before returning the task",
    )
    p.add_argument("--url", default=None, help="Redis URL (default: env REDISBUS_URL)")
    p.add_argument(
        "--log-level",
        default=env("REDISBUS_A2A_LOG_LEVEL", "WARNING"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``redisbus a2a --channel C``; returns the exit code."""
    import uvicorn

    from ... import BusSettings

    a = _parser().parse_args(argv)
    try:
        tokens = load_tokens(a.tokens_file, os.environ.get("REDISBUS_A2A_TOKENS"))
        settings = BusSettings(**({"url": a.url} if a.url else {}))
        config = BridgeConfig(
            channel=a.channel,
            tokens=tokens,
            public_url=a.public_url or f"http://{a.host}:{a.port}",
            externals=[parse_external(x, a.external_parent) for x in a.external],
            settings=settings,
            send_wait_s=a.send_wait,
        )
    except (RedisbusError, OSError) as e:
        print(f"redisbus a2a: {getattr(e, 'code', 'error')}: {e}", file=sys.stderr)
        return 2
    if not tokens:
        print(
            "redisbus a2a: no caller tokens (REDISBUS_A2A_TOKENS or --tokens-file): "
            "cards are served, every call is refused",
            file=sys.stderr,
        )
    try:
        uvicorn.run(build_app(config), host=a.host, port=a.port, log_level=a.log_level.lower())
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
