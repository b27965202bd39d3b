"""``redisbus console`` and ``python -m redisbus.console``: the command, with the options,
variables, help and exit statuses of every ``redisbus`` command. The web app and its server
(starlette and uvicorn, the ``console`` extra) are imported only when it runs, so ``redisbus
--help`` works without them."""

from __future__ import annotations

from typing import Annotated

import typer

from .._commands import BusAddress, Exit, option, port_option, with_address
from .._errors import InvalidInput

MAX_STUCK_AFTER_S = 86_400 * 30


@with_address
def console(
    address: BusAddress,
    host: Annotated[
        str,
        option(
            "--host", "REDISBUS_CONSOLE_HOST", "Address to bind (the default is loopback only)."
        ),
    ] = "127.0.0.1",
    port: Annotated[int, port_option("REDISBUS_CONSOLE_PORT", "Port.")] = 8484,
    token: Annotated[
        str | None,
        option(
            "--token",
            "REDISBUS_CONSOLE_TOKEN",
            "Allow replay, pause and resume to requests bearing this token (at least 8 "
            "characters; prefer the variable: a command line is visible to other users). "
            "Without one the console is read-only.",
            show_default=False,
        ),
    ] = None,
    messages: Annotated[
        int,
        option(
            "--messages",
            "REDISBUS_CONSOLE_MESSAGES",
            "Latest messages shown per channel.",
            min=1,
            max=10_000,
        ),
    ] = 200,
    stuck_after: Annotated[
        float,
        option(
            "--stuck-after",
            "REDISBUS_CONSOLE_STUCK_AFTER_S",
            "Seconds after which an unfinished message counts as stuck.",
        ),
    ] = 60.0,
    allowed_host: Annotated[
        list[str] | None,
        option(
            "--allowed-host",
            "REDISBUS_CONSOLE_ALLOWED_HOSTS",
            "Host header to accept (repeatable; the variable takes a space-separated "
            "list). Default: the loopback names, or any when --host is not loopback.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Live web console of the channels in a browser (read-only without a token).

    A page per channel shows the family tree with live statuses, the conversations by reply
    thread, each message's receipts, unread and stuck messages, and the dead letters. Looking
    changes nothing: it never joins a channel and never marks anything. Ctrl-C stops it.
    """
    if not 0 < stuck_after <= MAX_STUCK_AFTER_S:
        raise InvalidInput(
            f"--stuck-after must be a positive number of seconds up to {MAX_STUCK_AFTER_S}, "
            f"got {stuck_after:g}"
        )
    if token is not None and len(token) < 8:
        raise InvalidInput("--token must be at least 8 characters")
    try:
        from ._serve import serve  # starlette and uvicorn, from here on
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("redisbus"):
            raise
        raise Exit(
            f"`redisbus console` needs the console extra (missing {e.name}): install "
            "redisbus with it, e.g. pip install '.[console]' in a checkout",
            1,
        ) from e
    settings = address.settings(metrics=False)
    status = serve(settings, host, port, token, messages, stuck_after, allowed_host or [])
    raise typer.Exit(status)
