"""``redisbus exporter``: fleet gauges read from Redis, the watchdog and the janitor.

One exporter per Redis deployment. Every ``exporter_interval_s`` a background thread reads
every channel (:func:`redisbus.fleet.read_fleet`, read-only and bounded) into a snapshot;
``/metrics`` serves the last snapshot, so a scrape never waits on Redis and many scrapers
cost nothing extra. ``/healthz`` answers 200 when Redis answers ``PING``, 503 otherwise.

Gauges (names from :data:`redisbus.metrics.FLEET_GAUGES`; fleet totals, no per-channel
label except the top-N series):

=============================================  ==================================================
``redisbus_channels``                          channels registered on the bus
``redisbus_unread_messages``                   undone, not read nor held by a live replica
``redisbus_oldest_unread_age_seconds``         Redis TIME minus the oldest unread entry id; 0
``redisbus_pending_messages``                  fetched, not acknowledged (all consumer groups)
``redisbus_dead_letters``                      entries in the dead-letter streams
``redisbus_agents{status}``                    agents per status, all seven statuses always
``redisbus_channel_unread_messages{channel}``   unread of the ``exporter_top_n`` busiest channels
``redisbus_watchdog_stale_unread_messages``    unread older than ``watchdog_stale_s``
``redisbus_exporter_scrape_duration_seconds``  time the last read of Redis took
=============================================  ==================================================

When the last read of Redis failed, only the scrape duration is served: no data is better
than old data presented as current (and ``/healthz`` says why). See :mod:`redisbus.fleet` for
the exact definitions and the bounds on the work done per read.

The watchdog (:mod:`redisbus.watchdog`) compares each snapshot with the previous one: when an
agent of a channel gets unread messages older than ``watchdog_stale_s`` it logs one warning
line (and one info line when it recovers) and, with ``watchdog_webhook_url`` set, POSTs a JSON
object per change; webhook failures are logged, never raised.

The janitor (``janitor=True``) runs :func:`redisbus.janitor.sweep_all` every
``janitor_interval_s``. It writes (trim, dead-letter), so the exporter's Redis user needs the
agent hosts' permissions for it; under the read-only ``exporter`` ACL user it says so once
and stops, and ``redisbus janitor`` can run elsewhere instead.

Run it::

    REDISBUS_URL=redis://redis:6379/0 python -m redisbus.exporter --port 9120
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from pydantic import Field
from redis.exceptions import RedisError

from ._errors import InvalidInput, RedisbusError
from ._settings import BusSettings
from .bus import Bus
from .fleet import FleetSnapshot, read_fleet
from .janitor import sweep_all
from .metrics import FLEET_GAUGES
from .watchdog import Watchdog

__all__ = ["Exporter", "ExporterSettings", "FleetCollector", "main", "serve"]

log = logging.getLogger("redisbus.exporter")


class ExporterSettings(BusSettings):
    """BusSettings plus the exporter's options; each field is ``REDISBUS_<FIELD>``."""

    exporter_port: int = Field(default=9120, ge=0, le=65535, description="0 picks a free port")
    exporter_addr: str = Field(default="0.0.0.0", description="address to listen on")
    exporter_top_n: int = Field(default=10, ge=0, description="channels given their own series")
    exporter_interval_s: float = Field(default=5.0, gt=0, description="how often Redis is read")
    exporter_max_channels: int = Field(default=1000, ge=1, description="channels read per pass")
    watchdog_stale_s: float = Field(default=60.0, gt=0, description="unread older than this")
    watchdog_webhook_url: str | None = Field(default=None, description="POST JSON per change")
    watchdog_webhook_timeout_s: float = Field(default=5.0, gt=0, description="webhook POST")
    janitor: bool = Field(default=True, description="run the janitor in the exporter")
    janitor_interval_s: float = Field(default=30.0, gt=0, description="between janitor runs")


# -- the collector ------------------------------------------------------------------------------

_HELP = {
    "redisbus_channels": "Channels registered on the bus.",
    "redisbus_unread_messages": "Messages undone and not yet read (queued, or fetched by a "
    "replica that died), summed over recipients.",
    "redisbus_oldest_unread_age_seconds": "Age of the oldest unread message (Redis clock); "
    "0 when nothing is unread.",
    "redisbus_pending_messages": "Messages fetched and not acknowledged, over all agents.",
    "redisbus_dead_letters": "Messages held in dead-letter streams.",
    "redisbus_agents": "Agents by status.",
    "redisbus_channel_unread_messages": "Unread messages of the channels with the most unread "
    "(the exporter's top N).",
    "redisbus_watchdog_stale_unread_messages": "Unread messages older than the watchdog threshold.",
    "redisbus_exporter_scrape_duration_seconds": "Time the exporter's last read of Redis took.",
}


class FleetCollector(Collector):
    """Serves the exporter's last snapshot as the ``FLEET_GAUGES`` families."""

    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        snap, duration_s = self._exporter.last()
        if snap is not None:
            yield from fleet_families(snap, self._exporter.settings.exporter_top_n)
        yield _gauge("redisbus_exporter_scrape_duration_seconds", duration_s)

    def describe(self) -> Iterable[Metric]:
        # Without describe() the registry would run collect() on registration.
        for name, labels in FLEET_GAUGES.items():
            yield GaugeMetricFamily(name, _HELP[name], labels=list(labels))


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name], value=value)


def fleet_families(snap: FleetSnapshot, top_n: int) -> Iterator[GaugeMetricFamily]:
    """The gauges of one snapshot (all but the scrape duration)."""
    yield _gauge("redisbus_channels", snap.channels_total)
    yield _gauge("redisbus_unread_messages", snap.unread)
    yield _gauge("redisbus_oldest_unread_age_seconds", snap.oldest_unread_age_s)
    yield _gauge("redisbus_pending_messages", snap.pending)
    yield _gauge("redisbus_dead_letters", snap.dead_letters)
    agents = GaugeMetricFamily("redisbus_agents", _HELP["redisbus_agents"], labels=["status"])
    for status, n in snap.agents_by_status().items():
        agents.add_metric([status], n)
    yield agents
    name = "redisbus_channel_unread_messages"
    per_channel = GaugeMetricFamily(name, _HELP[name], labels=["channel"])
    for c in snap.top_channels(top_n):
        per_channel.add_metric([c.name], c.unread)
    yield per_channel
    yield _gauge("redisbus_watchdog_stale_unread_messages", snap.stale)


# -- the exporter -------------------------------------------------------------------------------


class Exporter:
    """The fleet exporter: reads Redis in the background and serves the result over HTTP.

    ``start()`` reads once, then starts the reader, the janitor (when enabled) and the HTTP
    server; ``stop()`` ends them. Also a context manager. ``bus`` defaults to one built from
    ``settings`` (metrics off: the exporter is not an agent host).
    """

    def __init__(self, settings: ExporterSettings, bus: Bus | None = None) -> None:
        self.settings = settings
        if bus is None and not settings.url:
            raise InvalidInput("the exporter needs the fleet's Redis: set REDISBUS_URL")
        self.bus = bus or Bus.from_settings(settings.model_copy(update={"metrics": False}))
        self._owns_bus = bus is None
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(FleetCollector(self))
        self.watchdog = Watchdog(
            settings.watchdog_stale_s,
            settings.watchdog_webhook_url,
            settings.watchdog_webhook_timeout_s,
        )
        self._lock = threading.Lock()
        self._snap: FleetSnapshot | None = None
        self._duration_s = 0.0
        self._error: str | None = "not read yet"
        self._capped_at: int | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None

    # -- reading Redis ----------------------------------------------------------------------
    def refresh(self) -> FleetSnapshot | None:
        """Read every channel now, then run the watchdog on the result. None on failure."""
        s = self.settings
        t0 = time.perf_counter()
        try:
            snap: FleetSnapshot | None = read_fleet(
                self.bus.redis,
                s.prefix,
                stale_s=s.watchdog_stale_s,
                max_channels=s.exporter_max_channels,
            )
            error = None
        except (RedisError, RedisbusError, OSError) as e:
            snap, error = None, f"{type(e).__name__}: {e}"
        except Exception as e:  # a reply we did not expect must not stop the read loop
            log.exception("exporter: reading Redis failed")
            snap, error = None, f"{type(e).__name__}: {e}"
        duration = time.perf_counter() - t0
        with self._lock:
            if error and error != self._error:
                log.warning("exporter: cannot read Redis: %s", error)
            self._snap, self._duration_s, self._error = snap, duration, error
        if snap is not None:
            self._note_cap(snap)
            self.watchdog.check(snap)
        return snap

    def _note_cap(self, snap: FleetSnapshot) -> None:
        capped_at = snap.channels_total if snap.capped else None
        if capped_at != self._capped_at and capped_at is not None:
            log.warning(
                "exporter: %d channels, reading the first %d by name "
                "(raise REDISBUS_EXPORTER_MAX_CHANNELS to read them all)",
                snap.channels_total, len(snap.channels),
            )  # fmt: skip
        self._capped_at = capped_at

    def last(self) -> tuple[FleetSnapshot | None, float]:
        """The last snapshot (None when the last read failed) and how long that read took."""
        with self._lock:
            return self._snap, self._duration_s

    def healthy(self) -> tuple[bool, str]:
        """(True, "ok") when Redis answers PING now, else (False, why)."""
        try:
            ok = bool(self.bus.redis.ping())
        except (RedisError, OSError) as e:
            return False, f"redis: {type(e).__name__}: {e}"
        return ok, "ok" if ok else "redis: no PONG"

    # -- background loops -------------------------------------------------------------------
    def _read_loop(self) -> None:
        while not self._stop.wait(self.settings.exporter_interval_s):
            self.refresh()

    def _janitor_loop(self) -> None:
        while not self._stop.wait(self.settings.janitor_interval_s):
            if not self.sweep():
                return

    def sweep(self) -> bool:
        """One janitor pass; False when the janitor cannot run here (no write permission)."""
        try:
            report = sweep_all(self.bus)
        except (RedisError, RedisbusError, OSError) as e:
            log.warning("janitor: pass failed: %s", e)
            return True
        except Exception:  # the next pass may succeed; the exporter keeps serving meanwhile
            log.exception("janitor: pass failed")
            return True
        if any(_denied(err) for err in report.errors):
            log.warning(
                "janitor: the Redis user may not write (%s); janitor stopped. Run "
                "`redisbus janitor` with the agent user, or set REDISBUS_JANITOR=false.",
                report.errors[0],
            )
            return False
        if report.trimmed or report.dead_lettered or report.consumers_removed:
            log.info(
                "janitor: %d channels, %d trimmed, %d dead-lettered, %d consumers removed",
                report.channels, report.trimmed, report.dead_lettered, report.consumers_removed,
            )  # fmt: skip
        return True

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port the HTTP server listens on (after ``start()``)."""
        if self._http is None:
            raise RuntimeError("the exporter is not started")
        return int(self._http.server_address[1])

    def start(self) -> Exporter:
        self.refresh()
        s = self.settings
        self._http = ThreadingHTTPServer((s.exporter_addr, s.exporter_port), _handler(self))
        self._http.daemon_threads = True
        loops = [("redisbus-exporter-read", self._read_loop)]
        if s.janitor:
            loops.append(("redisbus-janitor", self._janitor_loop))
        loops.append(("redisbus-exporter-http", self._http.serve_forever))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("exporter: serving /metrics and /healthz on %s:%d", s.exporter_addr, self.port)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        for t in self._threads:
            t.join(timeout=10)
        self.watchdog.close()
        if self._owns_bus:
            self.bus.close()

    def __enter__(self) -> Exporter:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _denied(error: str) -> bool:
    """Whether a janitor error is Redis' ACL refusing a write (wording differs by version)."""
    text = error.lower()
    return any(w in text for w in ("noperm", "no permissions", "can't run this command"))


def _handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, generate_latest(exporter.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                ok, why = exporter.healthy()
                self._reply(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
            else:
                self._reply(404, b"not found: try /metrics or /healthz\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    return Handler


# -- entry points -------------------------------------------------------------------------------


def serve(settings: ExporterSettings | None = None, stop: threading.Event | None = None) -> None:
    """Run the exporter until ``stop`` is set, SIGTERM or SIGINT (Ctrl-C)."""
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    with Exporter(settings or ExporterSettings()):
        stop.wait()


# (option, ExporterSettings field, type, help); each option defaults to its REDISBUS_ variable
_OPTIONS: tuple[tuple[str, str, type, str], ...] = (
    ("--url", "url", str, "the fleet's Redis URL"),
    ("--port", "exporter_port", int, "port of /metrics and /healthz; 0 picks a free one"),
    ("--addr", "exporter_addr", str, "address to listen on"),
    ("--top-n", "exporter_top_n", int, "channels given their own unread series"),
    ("--interval-s", "exporter_interval_s", float, "seconds between reads of Redis"),
    ("--max-channels", "exporter_max_channels", int, "channels read per pass (by name)"),
    ("--stale-s", "watchdog_stale_s", float, "watchdog: unread older than this is stale"),
    ("--webhook-url", "watchdog_webhook_url", str, "watchdog: POST a JSON event per change"),
    ("--janitor", "janitor", bool, "run the janitor (reclaim, dead-letter, trim)"),
    ("--janitor-interval-s", "janitor_interval_s", float, "seconds between janitor passes"),
)


def _parser(d: ExporterSettings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="redisbus exporter",
        description="Fleet gauges read from Redis on /metrics, /healthz, the watchdog and the "
        "janitor. Every option defaults to its REDISBUS_* environment variable.",
    )
    for flag, name, kind, text in _OPTIONS:
        default = getattr(d, name)
        # URLs may carry credentials: never echo them in --help
        now = "" if kind is str and name != "exporter_addr" else f"; now {default}"
        text = f"{text} (REDISBUS_{name.upper()}{now})"
        if kind is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=default,
                           help=text)  # fmt: skip
        else:
            metavar = flag.rsplit("-", 1)[-1].upper()
            p.add_argument(flag, dest=name, type=kind, default=default, help=text, metavar=metavar)
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_args(argv: Sequence[str] | None = None) -> tuple[ExporterSettings, str]:
    """(settings, log level): the environment's ExporterSettings, overridden by options."""
    env = ExporterSettings()
    a = _parser(env).parse_args(argv)
    settings = ExporterSettings(**{name: getattr(a, name) for _, name, _, _ in _OPTIONS})
    return settings, str(a.log_level)


def main(argv: Sequence[str] | None = None) -> int:
    """``redisbus exporter [options]`` / ``python -m redisbus.exporter [options]``."""
    try:
        settings, level = parse_args(argv)
    except ValueError as e:  # a malformed REDISBUS_* variable or option value
        print(f"redisbus exporter: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if not settings.url:
        print(
            "redisbus exporter: set REDISBUS_URL (or --url) to the fleet's Redis", file=sys.stderr
        )
        return 3
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(settings)
    except OSError as e:  # the port is taken, the address is wrong
        print(f"redisbus exporter: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
