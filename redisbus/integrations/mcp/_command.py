"""``redisbus mcp`` and ``python -m redisbus.integrations.mcp``: the command, with the help
style, environment variables and exit statuses of the other ``redisbus`` commands (failures
reach ``redisbus._commands.run``, which prints one line and exits 1 refused, 2 bad input, 3 no
Redis). Imports no MCP SDK until it runs, so ``redisbus --help`` works without the ``mcp``
extra."""

from __future__ import annotations

from typing import Annotated

from ..._commands import BusAddress, Exit, option, with_address
from ..._errors import InvalidInput
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


@with_address
def mcp(
    address: BusAddress,
    channel: Annotated[
        str,
        option(
            "--channel",
            "REDISBUS_MCP_CHANNEL",
            "Channel to join (created with the default limits if new).",
            show_default=False,
        ),
    ],
    agent: Annotated[
        str,
        option(
            "--as",
            ["REDISBUS_MCP_AS", "REDISBUS_AS"],
            "This server's agent name (joins under it, or re-attaches).",
            show_default=False,
        ),
    ],
    parent: Annotated[
        str | None, option("--parent", ["REDISBUS_MCP_PARENT", "REDISBUS_PARENT"], "Parent agent.")
    ] = None,
    description: Annotated[
        str,
        option(
            "--description",
            ["REDISBUS_MCP_DESCRIPTION", "REDISBUS_DESCRIPTION"],
            "Agent card: what this agent does.",
        ),
    ] = "",
    skills: Annotated[
        list[str] | None,
        option(
            "--skill",
            ["REDISBUS_MCP_SKILLS", "REDISBUS_SKILLS"],
            "Agent card skill (repeatable; the variable takes a comma-separated list).",
        ),
    ] = None,
    transport: Annotated[
        str, option("--transport", "REDISBUS_MCP_TRANSPORT", "stdio | http (streamable HTTP).")
    ] = "stdio",
    host: Annotated[str, option("--host", "REDISBUS_MCP_HOST", "HTTP bind address.")] = "127.0.0.1",
    port: Annotated[int, option("--port", "REDISBUS_MCP_PORT", "HTTP port.")] = (8000),
    token: Annotated[
        str | None,
        option(
            "--token",
            "REDISBUS_MCP_TOKEN",
            "HTTP bearer token every request must carry (prefer the variable: a command "
            "line is visible to other users).",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[
        str,
        option(
            "--log-level",
            "REDISBUS_MCP_LOG_LEVEL",
            "Server log level on stderr: DEBUG, INFO, WARNING, ERROR, CRITICAL.",
        ),
    ] = "WARNING",
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

    settings = address.settings()
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
