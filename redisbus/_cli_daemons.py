"""``redisbus`` commands that run as services: exporter and janitor.

They share the rest of the CLI's parser, help style, ``REDISBUS_*`` variables and exit
statuses (0 ok, 1 failed, 2 bad input, 3 no Redis); errors go to stderr as one line.
``python -m redisbus.exporter`` and ``python -m redisbus.janitor`` run the same commands
(through ``_cli_run``).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Annotated

import typer

from ._cli_base import ClusterOpt, Exit, PrefixOpt, app, given, settings_for
from .bus import Bus
from .janitor import run, sweep_all

__all__ = ["exporter", "janitor"]

LogLevelOpt = Annotated[
    str,
    typer.Option(
        "--log-level",
        envvar="REDISBUS_LOG_LEVEL",
        help="DEBUG | INFO | WARNING | ERROR.",
        case_sensitive=False,
    ),
]
# The daemons never start a private Redis: they watch or sweep a shared one.
DaemonUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="REDISBUS_URL",
        show_default=False,
        help="The fleet's Redis URL (redis://, rediss://, redis+sentinel://). Required.",
    ),
]


def _logging(level: str) -> None:
    name = level.upper()
    if name not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise Exit(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {level!r}", 2)
    logging.basicConfig(
        level=name, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


@app.command()
def exporter(
    url: DaemonUrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            envvar="REDISBUS_EXPORTER_PORT",
            help="Port of /metrics, /healthz and /readyz; 0 picks a free one [default: 9120].",
        ),
    ] = None,
    addr: Annotated[
        str | None,
        typer.Option(
            "--addr",
            envvar="REDISBUS_EXPORTER_ADDR",
            help="Address to listen on [default: 0.0.0.0].",
        ),
    ] = None,
    top_n: Annotated[
        int | None,
        typer.Option(
            "--top-n",
            envvar="REDISBUS_EXPORTER_TOP_N",
            help="Channels given their own unread series [default: 10].",
        ),
    ] = None,
    interval_s: Annotated[
        float | None,
        typer.Option(
            "--interval-s",
            envvar="REDISBUS_EXPORTER_INTERVAL_S",
            help="Seconds between reads of Redis [default: 5].",
        ),
    ] = None,
    max_channels: Annotated[
        int | None,
        typer.Option(
            "--max-channels",
            envvar="REDISBUS_EXPORTER_MAX_CHANNELS",
            help="Channels read per pass, first by name [default: 1000].",
        ),
    ] = None,
    stale_s: Annotated[
        float | None,
        typer.Option(
            "--stale-s",
            envvar="REDISBUS_WATCHDOG_STALE_S",
            help="Watchdog: unread older than this is stale [default: 60].",
        ),
    ] = None,
    webhook_url: Annotated[
        str | None,
        typer.Option(
            "--webhook-url",
            envvar="REDISBUS_WATCHDOG_WEBHOOK_URL",
            show_default=False,
            help="Watchdog: POST a JSON event per change to this URL.",
        ),
    ] = None,
    janitor: Annotated[
        bool | None,
        typer.Option(
            "--janitor/--no-janitor",
            envvar="REDISBUS_JANITOR",
            show_default=False,
            help="Run the janitor too; it needs a Redis user that may write [default: on].",
        ),
    ] = None,
    janitor_interval_s: Annotated[
        float | None,
        typer.Option(
            "--janitor-interval-s",
            envvar="REDISBUS_JANITOR_INTERVAL_S",
            help="Seconds between janitor passes [default: 30].",
        ),
    ] = None,
    log_level: LogLevelOpt = "INFO",
) -> None:
    """Fleet exporter: backlog, memory and Redis-up gauges on /metrics, the watchdog and the
    janitor.

    /healthz is liveness (the process), /readyz readiness (Redis answers). Runs until SIGTERM
    or Ctrl-C.
    """
    from .exporter import ExporterSettings, serve  # prometheus_client and the fleet reader: heavy

    _logging(log_level)
    kw = given(url=url, prefix=prefix, cluster=cluster)
    kw |= given(
        exporter_port=port,
        exporter_addr=addr,
        exporter_top_n=top_n,
        exporter_interval_s=interval_s,
        exporter_max_channels=max_channels,
        watchdog_stale_s=stale_s,
        watchdog_webhook_url=webhook_url,
        janitor_interval_s=janitor_interval_s,
    )
    if janitor is not None:
        kw["janitor"] = janitor
    settings = ExporterSettings(**kw)
    if not settings.url:
        raise Exit("set REDISBUS_URL (or --url) to the fleet's Redis", 3)
    try:
        serve(settings)
    except OSError as e:  # the port is taken, the address is wrong
        raise Exit(f"exporter: cannot listen on {settings.exporter_addr}: {e}", 1) from e


@app.command()
def janitor(
    url: DaemonUrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
    interval_s: Annotated[
        float | None,
        typer.Option(
            "--interval-s",
            envvar="REDISBUS_JANITOR_INTERVAL_S",
            help="Seconds between passes [default: 30].",
        ),
    ] = None,
    batch: Annotated[
        int,
        typer.Option(
            "--batch", envvar="REDISBUS_JANITOR_BATCH", help="Entries trimmed per script call."
        ),
    ] = 1000,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            envvar="REDISBUS_JANITOR_ONCE",
            help="One pass over every channel: print its report and exit. A channel that "
            "fails is logged in one line and skipped, the rest are swept all the same; the "
            "exit status is then 1, given after the whole pass.",
        ),
    ] = False,
    log_level: LogLevelOpt = "INFO",
) -> None:
    """Reclaim nothing it cannot handle, dead-letter the undeliverable, trim: every channel.

    Writes, so it runs as the agent hosts' Redis user (the exporter's is read-only). Several
    janitors may run at once. Runs until SIGTERM or Ctrl-C unless --once. A channel that
    fails is skipped, never the channels after it; a Redis outage is logged when passes start
    failing and when they succeed again.
    """
    from .exporter import ExporterSettings  # heavy (prometheus_client): only for its default

    _logging(log_level)
    interval = interval_s if interval_s is not None else ExporterSettings().janitor_interval_s
    if interval <= 0 or batch <= 0:
        raise Exit("--interval-s and --batch must be positive", 2)
    settings = settings_for(url, prefix, cluster)
    if not settings.url:
        raise Exit("set REDISBUS_URL (or --url): the janitor sweeps a shared Redis", 3)
    bus = Bus.from_settings(settings)
    try:
        if once:
            r = sweep_all(bus, batch=batch)
            sys.stdout.write(
                f"{r.channels} channels: {r.trimmed} trimmed, {r.dead_lettered} dead-lettered, "
                f"{r.consumers_removed} consumers removed, {r.expired_undone} expired undone, "
                f"{r.failed} failed\n"
            )
            if r.errors:
                more = f" (and {len(r.errors) - 1} more)" if len(r.errors) > 1 else ""
                raise Exit(f"janitor: {r.errors[0]}{more}", 1)
            return
        run(bus, interval, _stop_on_signals(), batch=batch)
    finally:
        bus.close()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop
