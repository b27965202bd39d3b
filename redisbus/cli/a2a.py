"""``redisbus a2a``: serve a channel's members as A2A agents, and add external A2A agents to it.

The bridge itself is ``redisbus.integrations.a2a`` (the ``a2a`` extra); it is imported only
when this command runs, so the rest of the CLI works without it."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Annotated, Any

from .._commands import Exit, UrlOpt, option, port_option
from .._errors import InvalidInput
from .._settings import BusSettings


def a2a(
    channel: Annotated[
        str, option("--channel", "REDISBUS_A2A_CHANNEL", "Channel to bridge.", show_default=False)
    ],
    host: Annotated[str, option("--host", "REDISBUS_A2A_HOST", "Bind address.")] = "127.0.0.1",
    port: Annotated[int, port_option("REDISBUS_A2A_PORT", "Bind port.")] = 8700,
    public_url: Annotated[
        str | None,
        option(
            "--public-url",
            "REDISBUS_A2A_PUBLIC_URL",
            "Base URL the cards advertise [default: http://HOST:PORT].",
        ),
    ] = None,
    tokens_file: Annotated[
        str | None,
        option(
            "--tokens-file",
            "REDISBUS_A2A_TOKENS_FILE",
            'JSON {"TOKEN": "member-name"}: the callers and the names they speak as (or '
            "the JSON itself in REDISBUS_A2A_TOKENS).",
        ),
    ] = None,
    external: Annotated[
        list[str] | None,
        option(
            "--external",
            "REDISBUS_A2A_EXTERNAL",
            "URL or NAME=URL of an A2A agent to add as a member; repeatable (in the "
            "environment: separated by commas or spaces).",
        ),
    ] = None,
    external_parent: Annotated[
        str | None,
        option(
            "--external-parent",
            "REDISBUS_A2A_EXTERNAL_PARENT",
            "Parent of the external agents' members (family channels).",
        ),
    ] = None,
    external_auth_file: Annotated[
        str | None,
        option(
            "--external-auth-file",
            "REDISBUS_A2A_EXTERNAL_AUTH_FILE",
            'JSON {"NAME or URL": "TOKEN" or {"Header": "value"}}: what to send each '
            "external agent (a string is a bearer token; or the JSON itself in "
            "REDISBUS_A2A_EXTERNAL_AUTH). Never on the command line.",
        ),
    ] = None,
    external_timeout: Annotated[
        float,
        option(
            "--external-timeout",
            "REDISBUS_A2A_EXTERNAL_TIMEOUT_S",
            "Seconds an external agent's answer may take (a Hermes turn holds the request "
            "open that long).",
            min=1,
        ),
    ] = 300.0,
    send_wait: Annotated[
        float,
        option(
            "--send-wait",
            "REDISBUS_A2A_SEND_WAIT_S",
            "Seconds a blocking SendMessage waits for the reply before returning the task.",
            min=0,
        ),
    ] = 30.0,
    url: UrlOpt = None,
    log_level: Annotated[
        str,
        option(
            "--log-level",
            "REDISBUS_A2A_LOG_LEVEL",
            "uvicorn's log level: DEBUG, INFO, WARNING, ERROR or CRITICAL.",
        ),
    ] = "WARNING",
) -> None:
    """Serve a channel's members as A2A agents (cards, SendMessage, tasks), both ways."""
    try:
        import uvicorn

        from ..integrations import a2a as bridge
    except ModuleNotFoundError as e:
        raise Exit(f"`redisbus a2a` needs the a2a extra: pip install 'redisbus[a2a]' ({e})") from e

    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise InvalidInput(f"--log-level: unknown level {log_level!r}")
    try:
        tokens = bridge.load_tokens(tokens_file, os.environ.get("REDISBUS_A2A_TOKENS"))
    except OSError as e:
        raise InvalidInput(f"cannot read --tokens-file: {e}") from e
    specs = [x for item in external or [] for x in item.replace(",", " ").split()]
    externals = _externals(
        [bridge.parse_external(x, external_parent) for x in specs],
        external_auth_file,
        external_timeout,
    )
    config = bridge.BridgeConfig(
        channel=channel,
        tokens=tokens,
        public_url=public_url or f"http://{host}:{port}",
        externals=externals,
        settings=BusSettings(url=url) if url else BusSettings(),
        send_wait_s=send_wait,
    )
    if not tokens:
        sys.stderr.write(
            "redisbus a2a: no caller tokens (REDISBUS_A2A_TOKENS or --tokens-file): "
            "cards are served, every call is refused\n"
        )
    _reachable(externals)
    server = uvicorn.Server(
        uvicorn.Config(bridge.build_app(config), host=host, port=port, log_level=level.lower())
    )
    server.run()
    if server.should_exit and not server.started:
        raise Exit("a2a: the bridge did not start (see the lines above)", 1)
    if server.should_exit:  # stopped by a signal (Ctrl-C, SIGTERM): as documented
        raise KeyboardInterrupt


def _externals(found: list[Any], auth_file: str | None, timeout_s: float) -> list[Any]:
    """The externals with their headers (from a file or the environment) and timeout."""
    from ..integrations.a2a._outbound import External, load_external_auth, with_auth

    text = os.environ.get("REDISBUS_A2A_EXTERNAL_AUTH")
    where = "REDISBUS_A2A_EXTERNAL_AUTH"
    if auth_file:
        try:
            with open(auth_file, encoding="utf-8") as f:
                text, where = f.read(), "--external-auth-file"
        except OSError as e:
            raise InvalidInput(f"cannot read --external-auth-file: {e}") from e
    timed = [External(e.url, e.name, e.parent, e.headers, timeout_s) for e in found]
    if not text:
        return timed
    try:
        return with_auth(timed, load_external_auth(text))
    except ValueError as e:
        raise InvalidInput(f"{where}: {e}") from None


def _reachable(externals: list[Any]) -> None:
    """Each external agent's card answers, before anything is served: one line, exit 2."""
    import httpx

    from ..integrations.a2a._outbound import fetch_card, http_client

    async def check(ext: Any) -> None:
        async with http_client(ext) as http:
            try:
                await fetch_card(http, ext.url)
            except Exception as e:
                cause: BaseException = e
                while cause.__cause__ is not None and not isinstance(cause, httpx.HTTPError):
                    cause = cause.__cause__
                raise Exit(
                    f"a2a: the A2A agent at {ext.url} does not answer its card: "
                    f"{type(cause).__name__}: {cause}",
                    2,
                ) from None

    async def check_all() -> None:
        for ext in externals:
            await check(ext)

    asyncio.run(check_all())
