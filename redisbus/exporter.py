"""``redisbus exporter``: fleet gauges read from Redis, the watchdog and the janitor.

Not a Python API: the command, its settings and its series are the interface
(docs/deployment.md#the-exporter); its Python names may change in any release.

One exporter per Redis deployment. Every ``exporter_interval_s`` a background thread reads
every channel (:func:`redisbus.fleet.read_fleet`, read-only and bounded) and Redis' ``INFO
memory`` into a snapshot; ``/metrics`` serves the last snapshot, so a scrape never waits on
Redis and many scrapers cost nothing extra.

HTTP (one WSGI app, :attr:`Exporter.app`, so it can also be mounted elsewhere):

* ``/metrics``: ``prometheus_client``'s own app: OpenMetrics when the scraper asks for it,
  gzip when it accepts it.
* ``/healthz``: liveness, the process only: 200 while the reader thread runs. It never asks
  Redis, so a Redis outage does not get every exporter restarted.
* ``/readyz``: readiness: 200 when Redis answers ``PING`` now, 503 with the reason otherwise.

Gauges (names from :data:`redisbus.metrics.FLEET_GAUGES`; fleet totals, no per-channel
label except the top-N series):

===============================================  ================================================
``redisbus_channels``                            channels registered on the bus
``redisbus_unread_messages``                     undone, not read nor held by a live replica
``redisbus_oldest_unread_age_seconds``           Redis TIME minus the oldest unread entry id; 0
``redisbus_pending_messages``                    fetched, not acknowledged (all consumer groups)
``redisbus_dead_letters``                        entries in the dead-letter streams
``redisbus_agents{status}``                      agents per status, all seven statuses always
``redisbus_channel_unread_messages{channel}``     unread of the ``exporter_top_n`` busiest channels
``redisbus_watchdog_stale_unread_messages``      unread older than ``watchdog_stale_s``
``redisbus_redis_memory_used_bytes``             ``used_memory`` of ``INFO memory``
``redisbus_redis_memory_max_bytes``              ``maxmemory``; 0 when Redis has no limit
``redisbus_redis_maxmemory_policy{policy}``      1 for Redis' eviction policy (want noeviction)
``redisbus_exporter_redis_up``                   1 when the last read of Redis succeeded, else 0
``redisbus_exporter_collect_duration_seconds``   time the last read of Redis took
``redisbus_stream_entries{stream}``              entries held in the channel (``stream=
                                                 "channel"``) or dead-letter streams (``XLEN``)
``redisbus_stream_entries_added{stream}``        entries ever added to them (``XINFO STREAM``
                                                 ``entries-added``; Redis 7+, absent on 6.2)
``redisbus_stream_entries_removed{stream}``      added minus held: trimmed by a janitor or
                                                 deleted (a replayed dead letter)
``redisbus_exporter_channels_skipped``           channels registered but not read this pass
                                                 (past ``exporter_max_channels``): every other
                                                 figure leaves them out
``redisbus_janitor_dead_lettered_total``         counter: messages dead-lettered by janitors,
                                                 this exporter's and ``redisbus janitor``
                                                 processes' alike (kept in Redis, see
                                                 :mod:`redisbus.janitor`)
``redisbus_build_info{version}``                 1; the exporter's redisbus version (served
                                                 during an outage too)
===============================================  ================================================

Redis keeps ``entries-added`` with each stream, in its RDB and AOF, whichever janitor trims:
a trim moves entries from held to removed and leaves added alone, so added falls only when
entries vanish without a trim, e.g. a restart that did not reload them (alert
``RedisbusStoredEntriesLost``). The sums cover the channels the exporter reads (the first
``exporter_max_channels`` by name); ``redisbus_exporter_channels_skipped`` says how many it left
out, and ``RedisbusExporterChannelsSkipped`` fires while it is above 0.

On a Redis Cluster the memory gauges are those of the primary closest to its limit.

When the last read of Redis failed, only ``redisbus_exporter_redis_up`` (0), the collect
duration and the build info are served: no data is better than old data presented as current,
and the ``RedisbusRedisDown`` alert fires on the 0 (Prometheus' own ``up`` stays 1: the
exporter answers). The alerts on the fleet gauges hold their state meanwhile: each falls back
to the last value Prometheus holds while the exporter cannot read Redis (``last_over_time``
``unless`` ``redisbus_exporter_redis_up == 1``; see deploy/prometheus/alerts.yml), so a stuck
message's alert does not resolve because Redis went away. See :mod:`redisbus.fleet` for the
exact definitions and the bounds on the work done per read.

The watchdog (:mod:`redisbus.watchdog`) compares each snapshot with the previous one: when an
agent of a channel gets unread messages older than ``watchdog_stale_s`` it logs one warning
line (and one info line when it recovers) and, with ``watchdog_webhook_url`` set, POSTs a JSON
object per change; webhook failures are logged, never raised.

The janitor (``janitor=True``) runs :func:`redisbus.janitor.sweep_all` every
``janitor_interval_s``. It writes (trim, dead-letter), so the exporter's Redis user needs the
agent hosts' permissions for it; under the read-only ``exporter`` ACL user it says so once
and stops, and ``redisbus janitor`` runs elsewhere instead (as the deploy files do).

Run it (``redisbus exporter --help`` lists every option and its variable)::

    REDISBUS_URL=redis://redis:6379/0 redisbus exporter --port 9120
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from types import FrameType, TracebackType
from typing import Annotated, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field
from redis.exceptions import RedisError

from ._commands import (
    BusAddress,
    Exit,
    LogLevelOpt,
    given,
    log_to_stderr,
    option,
    program,
    required_url,
    with_fleet_address,
)
from ._errors import InvalidInput, RedisbusError
from ._fleet_gauges import (
    HELP,
    RedisMemory,
    StreamTotals,
    fleet_families,
    gauge,
    memory_families,
    read_janitor_dead_lettered,
    read_memory,
    read_streams,
    stream_families,
)
from ._settings import BusSettings
from .bus import Bus
from .fleet import FleetSnapshot, read_fleet
from .janitor import JANITOR_INTERVAL_S, sweep_all
from .metrics import FLEET_COUNTERS, FLEET_GAUGES, build_version
from .watchdog import Watchdog

__all__ = [
    "Exporter",
    "ExporterSettings",
    "FleetCollector",
    "RedisMemory",
    "StreamTotals",
    "read_streams",
    "serve",
]

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
    janitor_interval_s: float = Field(
        default=JANITOR_INTERVAL_S, gt=0, description="between janitor runs"
    )


class FleetCollector(Collector):
    """Serves the exporter's last snapshot as the ``FLEET_GAUGES`` and ``FLEET_COUNTERS``
    families."""

    def __init__(self, exporter: Exporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        with self._exporter._lock:  # the snapshot and the memory of the same read
            snap, memory = self._exporter._snap, self._exporter._memory
            streams = self._exporter._streams
            janitor_dead_lettered = self._exporter._janitor_dead_lettered
            duration_s = self._exporter._duration_s
        if snap is not None and memory is not None and streams is not None:
            yield from fleet_families(snap, self._exporter.settings.exporter_top_n)
            yield from memory_families(memory)
            yield from stream_families(streams)
            yield gauge(
                "redisbus_exporter_channels_skipped", snap.channels_total - len(snap.channels)
            )
            name = "redisbus_janitor_dead_lettered_total"
            yield CounterMetricFamily(name, HELP[name], value=janitor_dead_lettered)
        yield gauge("redisbus_exporter_redis_up", 1 if snap is not None else 0)
        yield gauge("redisbus_exporter_collect_duration_seconds", duration_s)
        build = GaugeMetricFamily(
            "redisbus_build_info", HELP["redisbus_build_info"], labels=["version"]
        )
        build.add_metric([build_version()], 1)
        yield build

    def describe(self) -> Iterable[Metric]:
        # Without describe() the registry would run collect() on registration.
        for name, labels in FLEET_GAUGES.items():
            yield GaugeMetricFamily(name, HELP[name], labels=list(labels))
        for name, labels in FLEET_COUNTERS.items():
            yield CounterMetricFamily(name, HELP[name], labels=list(labels))


WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


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
        self.app: WSGIApp = _wsgi_app(self)
        self._lock = threading.Lock()
        self._snap: FleetSnapshot | None = None
        self._memory: RedisMemory | None = None
        self._streams: StreamTotals | None = None
        self._janitor_dead_lettered = 0
        self._duration_s = 0.0
        self._error: str | None = "not read yet"
        self._capped_at: int | None = None
        self._policy_warned: str | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._reader: threading.Thread | None = None
        self._http: WSGIServer | None = None

    # -- reading Redis ----------------------------------------------------------------------
    def refresh(self) -> FleetSnapshot | None:
        """Read every channel and ``INFO memory`` now, then run the watchdog on the result.
        None when the read failed (``redisbus_exporter_redis_up`` then says 0)."""
        s = self.settings
        t0 = time.perf_counter()
        snap: FleetSnapshot | None = None
        memory: RedisMemory | None = None
        streams: StreamTotals | None = None
        janitor_dead_lettered = 0
        error: str | None = None
        try:
            snap = read_fleet(
                self.bus.redis,
                s.prefix,
                stale_s=s.watchdog_stale_s,
                max_channels=s.exporter_max_channels,
            )
            memory = read_memory(self.bus.redis)
            streams = read_streams(self.bus.redis, s.prefix, (c.name for c in snap.channels))
            janitor_dead_lettered = read_janitor_dead_lettered(self.bus.redis, s.prefix)
        except (RedisError, RedisbusError, OSError) as e:
            error = f"{type(e).__name__}: {e}"
        except Exception as e:  # a reply we did not expect must not stop the read loop
            log.exception("exporter: reading Redis failed")
            error = f"{type(e).__name__}: {e}"
        if error is not None:
            snap = memory = streams = None
        duration = time.perf_counter() - t0
        with self._lock:
            if error and error != self._error:
                log.warning("exporter: cannot read Redis: %s", error)
            elif error is None and self._error is not None and self._error != "not read yet":
                log.info("exporter: reading Redis again")
            self._snap, self._memory, self._duration_s, self._error = snap, memory, duration, error
            self._streams = streams
            self._janitor_dead_lettered = janitor_dead_lettered
        if snap is not None and memory is not None:
            self._note_cap(snap)
            self._note_policy(memory)
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

    def _note_policy(self, memory: RedisMemory) -> None:
        if memory.policy != "noeviction" and memory.policy != self._policy_warned:
            log.warning(
                "exporter: Redis maxmemory-policy is %r: under memory pressure Redis may EVICT "
                "channel streams and lose messages. Set maxmemory-policy noeviction.",
                memory.policy,
            )
        self._policy_warned = memory.policy

    def last(self) -> tuple[FleetSnapshot | None, float]:
        """The last snapshot (None when the last read failed) and how long that read took."""
        with self._lock:
            return self._snap, self._duration_s

    def last_memory(self) -> RedisMemory | None:
        """Redis' memory as of the last read (None when it failed)."""
        with self._lock:
            return self._memory

    def live(self) -> tuple[bool, str]:
        """Liveness, the process only: (True, "ok") while the reader thread runs. Never asks
        Redis: an exporter restarted during a Redis outage would see the same outage."""
        if self._reader is not None and not self._reader.is_alive() and not self._stop.is_set():
            return False, "the reader thread has stopped"
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Readiness: (True, "ok") when Redis answers PING now, else (False, why)."""
        try:
            ok = bool(self.bus.redis.ping())
        except (RedisError, RedisbusError, OSError) as e:
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
        return int(self._http.server_port)

    def start(self) -> Exporter:
        self.refresh()
        s = self.settings
        self._http = make_server(
            s.exporter_addr, s.exporter_port, self.app, _ThreadingWSGIServer, _QuietHandler
        )
        loops = [("redisbus-exporter-read", self._read_loop)]
        if s.janitor:
            loops.append(("redisbus-janitor", self._janitor_loop))
        loops.append(("redisbus-exporter-http", self._http.serve_forever))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._reader = self._threads[0]
        log.info(
            "exporter: serving /metrics, /healthz and /readyz on %s:%d", s.exporter_addr, self.port
        )
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


# -- HTTP -----------------------------------------------------------------------------------------


def _wsgi_app(exporter: Exporter) -> WSGIApp:
    """``/metrics`` from prometheus_client's app, ``/healthz`` and ``/readyz`` beside it."""
    metrics = make_wsgi_app(exporter.registry)
    checks = {"/healthz": exporter.live, "/readyz": exporter.ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            body: Iterable[bytes] = metrics(environ, start_response)
            return body
        check = checks.get(path)
        if check is None:
            status, text = "404 Not Found", "not found: try /metrics, /healthz or /readyz"
        else:
            ok, why = check()
            status = "200 OK" if ok else "503 Service Unavailable"
            text = why
        data = f"{text}\n".encode()
        start_response(
            status,
            [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))],
        )
        return [data]

    return app


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    """One thread per request, so a slow scraper never holds up a probe."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http: " + format, *args)


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


# -- the command: `redisbus exporter`, `python -m redisbus.exporter` --------------------------


@with_fleet_address
def exporter(
    address: BusAddress,
    port: Annotated[
        int | None,
        option(
            "--port",
            "REDISBUS_EXPORTER_PORT",
            "Port of /metrics, /healthz and /readyz; 0 picks a free one [default: 9120].",
        ),
    ] = None,
    addr: Annotated[
        str | None,
        option("--addr", "REDISBUS_EXPORTER_ADDR", "Address to listen on [default: 0.0.0.0]."),
    ] = None,
    top_n: Annotated[
        int | None,
        option(
            "--top-n",
            "REDISBUS_EXPORTER_TOP_N",
            "Channels given their own unread series [default: 10].",
        ),
    ] = None,
    interval_s: Annotated[
        float | None,
        option(
            "--interval-s",
            "REDISBUS_EXPORTER_INTERVAL_S",
            "Seconds between reads of Redis [default: 5].",
        ),
    ] = None,
    max_channels: Annotated[
        int | None,
        option(
            "--max-channels",
            "REDISBUS_EXPORTER_MAX_CHANNELS",
            "Channels read per pass, first by name [default: 1000].",
        ),
    ] = None,
    stale_s: Annotated[
        float | None,
        option(
            "--stale-s",
            "REDISBUS_WATCHDOG_STALE_S",
            "Watchdog: unread older than this is stale [default: 60].",
        ),
    ] = None,
    webhook_url: Annotated[
        str | None,
        option(
            "--webhook-url",
            "REDISBUS_WATCHDOG_WEBHOOK_URL",
            "Watchdog: POST a JSON event per change to this URL.",
            show_default=False,
        ),
    ] = None,
    janitor: Annotated[
        bool | None,
        option(
            "--janitor/--no-janitor",
            "REDISBUS_JANITOR",
            "Run the janitor too; it needs a Redis user that may write [default: on].",
            show_default=False,
        ),
    ] = None,
    janitor_interval_s: Annotated[
        float | None,
        option(
            "--janitor-interval-s",
            "REDISBUS_JANITOR_INTERVAL_S",
            "Seconds between janitor passes [default: 30].",
        ),
    ] = None,
    log_level: LogLevelOpt = "INFO",
) -> None:
    """Fleet exporter: backlog, memory and Redis-up gauges on /metrics, the watchdog and the
    janitor.

    /healthz is liveness (the process), /readyz readiness (Redis answers). Runs until SIGTERM
    or Ctrl-C.
    """
    log_to_stderr(log_level)
    kw = address.given()
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
    required_url(settings, " to the fleet's Redis")
    try:
        serve(settings)
    except OSError as e:  # the port is taken, the address is wrong
        raise Exit(f"exporter: cannot listen on {settings.exporter_addr}: {e}", 1) from e


if __name__ == "__main__":
    raise SystemExit(program(exporter, "exporter"))
