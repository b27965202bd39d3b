"""``redisbus mcp``: the command, on the same parser, help style, environment variables and exit
statuses as the other ``redisbus`` commands (failures reach ``redisbus.cli.main``, which prints
one line and exits 1 refused, 2 bad input, 3 no Redis). Imports no MCP SDK until it runs, so
``redisbus --help`` works without the ``mcp`` extra."""

from __future__ import annotations

from typing import Annotated

import typer

from ..._cli_base import ClusterOpt, Exit, PrefixOpt, UrlOpt, given
from ..._errors import InvalidInput
from ..._settings import BusSettings
from ._exposure import check_exposure

TRANSPORTS = ("stdio", "http", "streamable-http")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

HELP = """Serve one agent as MCP tools (stdio, or streamable HTTP).

MCP cannot tell its callers apart, so one server process is one agent: `--as NAME` is fixed
when it starts and every message the tools send carries it. Tools: agent_send_message,
agent_read_messages, agent_list_messages, agent_mark_done, agent_wait, agent_discover.

Over HTTP (`--transport http`, endpoint `/mcp`), `--token` makes every request carry
`Authorization: Bearer TOKEN` (others get 401). Without a token the server binds only to a
loopback address: a non-loopback `--host` without one is refused.
"""


def mcp(
    channel: Annotated[
        str,
        typer.Option(
            "--channel",
            envvar="REDISBUS_MCP_CHANNEL",
            show_default=False,
            help="Channel to join (created with the default limits if new).",
        ),
    ],
    agent: Annotated[
        str,
        typer.Option(
            "--as",
            envvar=["REDISBUS_MCP_AS", "REDISBUS_AS"],
            show_default=False,
            help="This server's agent name (joins under it, or re-attaches).",
        ),
    ],
    parent: Annotated[
        str | None,
        typer.Option(
            "--parent", envvar=["REDISBUS_MCP_PARENT", "REDISBUS_PARENT"], help="Parent agent."
        ),
    ] = None,
    description: Annotated[
        str,
        typer.Option(
            "--description",
            envvar=["REDISBUS_MCP_DESCRIPTION", "REDISBUS_DESCRIPTION"],
            help="Agent card: what this agent does.",
        ),
    ] = "",
    skills: Annotated[
        list[str] | None,
        typer.Option(
            "--skill",
            envvar=["REDISBUS_MCP_SKILLS", "REDISBUS_SKILLS"],
            help="Agent card skill (repeatable; the variable takes a comma-separated list).",
        ),
    ] = None,
    transport: Annotated[
        str,
        typer.Option(
            "--transport", envvar="REDISBUS_MCP_TRANSPORT", help="stdio | http (streamable HTTP)."
        ),
    ] = "stdio",
    host: Annotated[
        str, typer.Option("--host", envvar="REDISBUS_MCP_HOST", help="HTTP bind address.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", envvar="REDISBUS_MCP_PORT", help="HTTP port.")] = (
        8000
    ),
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="REDISBUS_MCP_TOKEN",
            show_default=False,
            help="HTTP bearer token every request must carry (prefer the variable: a command "
            "line is visible to other users).",
        ),
    ] = None,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            envvar="REDISBUS_MCP_LOG_LEVEL",
            help="Server log level on stderr: DEBUG, INFO, WARNING, ERROR, CRITICAL.",
        ),
    ] = "WARNING",
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    if transport not in TRANSPORTS:
        raise InvalidInput(f"--transport must be stdio or http, got {transport!r}")
    level = log_level.upper()
    if level not in LOG_LEVELS:
        raise InvalidInput(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
    if not 0 < port < 65536:
        raise InvalidInput(f"--port must be 1..65535, got {port}")
    cards = [s.strip() for item in skills or () for s in item.split(",") if s.strip()]
    check_exposure(transport, host, token)
    try:
        from ._server import serve  # the MCP SDK (an optional extra), from here on
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("redisbus"):
            raise
        raise Exit(f"`redisbus mcp` needs the mcp extra (missing {e.name}): pip install "
                   "'redisbus[mcp]'", 1) from e  # fmt: skip

    settings = BusSettings(**given(url=url, prefix=prefix, cluster=cluster))
    serve(
        channel,
        agent,
        parent,
        "stdio" if transport == "stdio" else "http",
        host,
        port,
        settings.url,
        description,
        cards,
        log_level=level,
        token=token or None,
        settings=settings,
    )


mcp.__doc__ = HELP


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to the ``redisbus`` app."""
    app.command("mcp")(mcp)
