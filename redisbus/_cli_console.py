"""``redisbus console``: the command, with the options, variables, help, completion and exit
statuses of every ``redisbus`` command. The web app and its server (starlette and uvicorn, the
``console`` extra) are imported only when it runs, so ``redisbus --help`` works without them."""

from __future__ import annotations

from typing import Annotated

import typer

from ._cli_base import ClusterOpt, Exit, PrefixOpt, UrlOpt, app, settings_for
from ._errors import InvalidInput

MAX_STUCK_AFTER_S = 86_400 * 30


@app.command("console")
def console(
    host: Annotated[
        str,
        typer.Option(
            "--host",
            envvar="REDISBUS_CONSOLE_HOST",
            help="Address to bind (the default is loopback only).",
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int,
        typer.Option("--port", envvar="REDISBUS_CONSOLE_PORT", min=1, max=65535, help="Port."),
    ] = 8484,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="REDISBUS_CONSOLE_TOKEN",
            show_default=False,
            help="Allow replay, pause and resume to requests bearing this token (at least 8 "
            "characters; prefer the variable: a command line is visible to other users). "
            "Without one the console is read-only.",
        ),
    ] = None,
    messages: Annotated[
        int,
        typer.Option(
            "--messages",
            envvar="REDISBUS_CONSOLE_MESSAGES",
            min=1,
            max=10_000,
            help="Latest messages shown per channel.",
        ),
    ] = 200,
    stuck_after: Annotated[
        float,
        typer.Option(
            "--stuck-after",
            envvar="REDISBUS_CONSOLE_STUCK_AFTER_S",
            help="Seconds after which an unfinished message counts as stuck.",
        ),
    ] = 60.0,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allowed-host",
            envvar="REDISBUS_CONSOLE_ALLOWED_HOSTS",
            show_default=False,
            help="Host header to accept (repeatable; the variable takes a space-separated "
            "list). Default: the loopback names, or any when --host is not loopback.",
        ),
    ] = None,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
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
        from .console import serve  # starlette and uvicorn, from here on
    except ModuleNotFoundError as e:
        if (e.name or "").startswith("redisbus"):
            raise
        raise Exit(
            f"`redisbus console` needs the console extra (missing {e.name}): install "
            "redisbus with it, e.g. pip install '.[console]' in a checkout",
            1,
        ) from e
    settings = settings_for(url, prefix, cluster)
    status = serve(settings, host, port, token, messages, stuck_after, allowed_host or [])
    raise typer.Exit(status)
