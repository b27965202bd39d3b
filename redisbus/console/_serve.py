"""The console's server: the web app on a socket bound before anything is said."""

from __future__ import annotations

import socket
import sys

import uvicorn

from .._commands import Exit
from .._settings import BusSettings
from ..aio import AsyncBus
from ._app import LOOPBACK_HOSTS, ConsoleConfig, create_app


def serve(
    settings: BusSettings,
    host: str,
    port: int,
    token: str | None = None,
    messages: int = 200,
    stuck_after_s: float = 60.0,
    allowed_hosts: list[str] | None = None,
) -> int:
    """Serve the console on ``host:port`` until Ctrl-C; the exit status (0, or 1 when the
    server never started). A port that cannot be bound is ``Exit`` (1) before any banner."""
    try:  # bound before the banner: a port in use is said plainly, not after a "started"
        sock = listen(host, port)
    except OSError as e:
        raise Exit(f"console cannot listen on {host}:{port}: {e.strerror or e}", 1) from e
    hosts = allowed_hosts or (LOOPBACK_HOSTS if host in LOOPBACK_HOSTS else ["*"])
    config = ConsoleConfig(
        token=token, limit=messages, stuck_after_s=stuck_after_s, allowed_hosts=tuple(hosts)
    )
    app = create_app(lambda: AsyncBus.from_settings(settings), config)
    mode = "changes need the token" if token else "read-only"
    shown = f"[{host}]" if ":" in host else host
    sys.stderr.write(f"redisbus console on http://{shown}:{port}/ ({mode}); Ctrl-C to stop\n")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    with sock:
        server.run(sockets=[sock])
    return 0 if server.started else 1


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (what uvicorn would bind), for uvicorn to serve on."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock
