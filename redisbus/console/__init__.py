"""``redisbus console``: a live web console for a bus (the ``redisbus[console]`` extra).

A page per channel shows the family tree with live statuses, the conversations grouped by
reply thread, each message's receipt timeline per recipient, unread and stuck messages, and
the dead letters; server-sent events keep it current. It never joins a channel and never
marks anything: looking changes nothing. Changes (replay a dead letter, pause, resume) need
the token the console was started with; without one it is read-only. It binds to loopback
unless told otherwise.

    redisbus console [--url URL] [--host 127.0.0.1] [--port 8484] [--token TOKEN]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

from .._cli_base import settings_for
from ..aio import AsyncBus
from ._app import LOOPBACK_HOSTS, ConsoleConfig, create_app

__all__ = ["ConsoleConfig", "create_app", "main", "parser"]


def parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="redisbus console",
        description="Serve a live web console of the bus's channels (read-only without a token).",
    )
    p.add_argument("--url", default=env("REDISBUS_URL"), help="Redis URL [REDISBUS_URL]")
    p.add_argument("--prefix", default=env("REDISBUS_PREFIX"), help="key prefix [REDISBUS_PREFIX]")
    p.add_argument(
        "--cluster",
        action="store_true",
        default=env("REDISBUS_CLUSTER", "").lower() in ("1", "true", "yes"),
        help="the URL is a Redis Cluster node [REDISBUS_CLUSTER]",
    )
    p.add_argument(
        "--host",
        default=env("REDISBUS_CONSOLE_HOST", "127.0.0.1"),
        help="address to bind (default 127.0.0.1: loopback only) [REDISBUS_CONSOLE_HOST]",
    )
    p.add_argument(
        "--port",
        type=int,
        default=int(env("REDISBUS_CONSOLE_PORT", "8484")),
        help="port (default 8484) [REDISBUS_CONSOLE_PORT]",
    )
    p.add_argument(
        "--token",
        default=env("REDISBUS_CONSOLE_TOKEN") or None,
        help="allow replay/pause/resume to requests bearing this token [REDISBUS_CONSOLE_TOKEN]",
    )
    p.add_argument(
        "--messages",
        type=int,
        default=int(env("REDISBUS_CONSOLE_MESSAGES", "200")),
        help="latest messages shown per channel [REDISBUS_CONSOLE_MESSAGES]",
    )
    p.add_argument(
        "--stuck-after",
        type=float,
        default=float(env("REDISBUS_CONSOLE_STUCK_AFTER_S", "60")),
        help="seconds after which an unfinished message counts as stuck "
        "[REDISBUS_CONSOLE_STUCK_AFTER_S]",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        default=None,
        help="Host header to accept (repeatable; default: loopback names, or any when --host "
        "is not loopback)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(list(argv) if argv is not None else None)
    if not 1 <= args.messages <= 10_000:
        sys.stderr.write("redisbus console: --messages must be between 1 and 10000\n")
        return 2
    if not 0 < args.stuck_after <= 86_400 * 30:
        sys.stderr.write("redisbus console: --stuck-after must be a positive number of seconds\n")
        return 2
    if args.token is not None and len(args.token) < 8:
        sys.stderr.write("redisbus console: --token must be at least 8 characters\n")
        return 2
    try:
        import uvicorn
    except ModuleNotFoundError:
        sys.stderr.write("redisbus console: needs the extra: pip install 'redisbus[console]'\n")
        return 1

    if not 1 <= args.port <= 65535:
        sys.stderr.write("redisbus console: --port must be between 1 and 65535\n")
        return 2
    try:  # bound before the banner: a port in use is said plainly, not after a "started"
        sock = listen(args.host, args.port)
    except OSError as e:
        sys.stderr.write(f"redisbus console: cannot listen on {args.host}:{args.port}: {e}\n")
        return 1

    settings = settings_for(args.url, args.prefix, args.cluster)
    hosts = args.allowed_host or (LOOPBACK_HOSTS if args.host in LOOPBACK_HOSTS else ["*"])
    config = ConsoleConfig(
        token=args.token,
        limit=args.messages,
        stuck_after_s=args.stuck_after,
        allowed_hosts=tuple(hosts),
    )
    app = create_app(lambda: AsyncBus.from_settings(settings), config)
    mode = "changes need the token" if args.token else "read-only"
    shown = f"[{args.host}]" if ":" in args.host else args.host
    sys.stderr.write(f"redisbus console on http://{shown}:{args.port}/ ({mode}); Ctrl-C to stop\n")
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
