"""``redisbus a2a``: serve a channel's members as A2A agents, and add external A2A agents to it.

The bridge itself is ``redisbus.integrations.a2a`` (the ``a2a`` extra); it is imported only
when this command runs, so the rest of the CLI works without it."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from ._cli_base import Exit, UrlOpt, app
from ._errors import InvalidInput


@app.command("a2a")
def a2a(
    channel: Annotated[
        str,
        typer.Option(
            "--channel",
            envvar="REDISBUS_A2A_CHANNEL",
            show_default=False,
            help="Channel to bridge.",
        ),
    ],
    host: Annotated[
        str, typer.Option("--host", envvar="REDISBUS_A2A_HOST", help="Bind address.")
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", envvar="REDISBUS_A2A_PORT", min=1, max=65535, help="Bind port."),
    ] = 8700,
    public_url: Annotated[
        str | None,
        typer.Option(
            "--public-url",
            envvar="REDISBUS_A2A_PUBLIC_URL",
            help="Base URL the cards advertise [default: http://HOST:PORT].",
        ),
    ] = None,
    tokens_file: Annotated[
        str | None,
        typer.Option(
            "--tokens-file",
            envvar="REDISBUS_A2A_TOKENS_FILE",
            help='JSON {"TOKEN": "member-name"}: the callers and the names they speak as (or '
            "the JSON itself in REDISBUS_A2A_TOKENS).",
        ),
    ] = None,
    external: Annotated[
        list[str] | None,
        typer.Option(
            "--external",
            envvar="REDISBUS_A2A_EXTERNAL",
            help="URL or NAME=URL of an A2A agent to add as a member; repeatable (in the "
            "environment: separated by commas or spaces).",
        ),
    ] = None,
    external_parent: Annotated[
        str | None,
        typer.Option(
            "--external-parent",
            envvar="REDISBUS_A2A_EXTERNAL_PARENT",
            help="Parent of the external agents' members (family channels).",
        ),
    ] = None,
    send_wait: Annotated[
        float,
        typer.Option(
            "--send-wait",
            envvar="REDISBUS_A2A_SEND_WAIT_S",
            min=0,
            help="Seconds a blocking SendMessage waits for the reply before returning the task.",
        ),
    ] = 30.0,
    url: UrlOpt = None,
    log_level: Annotated[
        str,
        typer.Option(
            "--log-level",
            envvar="REDISBUS_A2A_LOG_LEVEL",
            help="uvicorn's log level: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
        ),
    ] = "WARNING",
) -> None:
    """Serve a channel's members as A2A agents (cards, SendMessage, tasks), both ways."""
    try:
        import uvicorn

        from .integrations import a2a as bridge
    except ModuleNotFoundError as e:
        raise Exit(f"`redisbus a2a` needs the a2a extra: pip install 'redisbus[a2a]' ({e})") from e
    from ._settings import BusSettings

    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise InvalidInput(f"--log-level: unknown level {log_level!r}")
    try:
        tokens = bridge.load_tokens(tokens_file, os.environ.get("REDISBUS_A2A_TOKENS"))
    except OSError as e:
        raise InvalidInput(f"cannot read --tokens-file: {e}") from e
    specs = [x for item in external or [] for x in item.replace(",", " ").split()]
    config = bridge.BridgeConfig(
        channel=channel,
        tokens=tokens,
        public_url=public_url or f"http://{host}:{port}",
        externals=[bridge.parse_external(x, external_parent) for x in specs],
        settings=BusSettings(url=url) if url else BusSettings(),
        send_wait_s=send_wait,
    )
    if not tokens:
        sys.stderr.write(
            "redisbus a2a: no caller tokens (REDISBUS_A2A_TOKENS or --tokens-file): "
            "cards are served, every call is refused\n"
        )
    uvicorn.run(bridge.build_app(config), host=host, port=port, log_level=level.lower())
