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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from types import FrameType, TracebackType
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import Field
from redis.exceptions import RedisError

from ._errors import InvalidInput, RedisbusError
from ._keys import ChannelKeys, stats_key
from ._settings import BusSettings
from .bus import Bus
from .fleet import FleetSnapshot, read_fleet
from .janitor import DEAD_LETTERED_FIELD, sweep_all
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
    janitor_interval_s: float = Field(default=30.0, gt=0, description="between janitor runs")


# -- what is read from Redis besides the channels -----------------------------------------------


@dataclass(frozen=True)
class RedisMemory:
    """``INFO memory``: bytes used, the limit (0: none) and the eviction policy."""

    used_bytes: int
    max_bytes: int
    policy: str

    @property
    def ratio(self) -> float:
        return self.used_bytes / self.max_bytes if self.max_bytes else 0.0

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> RedisMemory:
        """From ``INFO memory`` as redis-py parses it; on a Cluster (a dict per node) the
        node closest to its limit, which is the one that will refuse writes first."""
        if "used_memory" not in info and all(isinstance(v, dict) for v in info.values()):
            nodes = [cls.from_info(v) for v in info.values()]
            if not nodes:
                raise RedisbusError("INFO memory: no node answered")
            return max(nodes, key=lambda m: (m.ratio, m.used_bytes))
        return cls(
            int(info["used_memory"]),
            int(info.get("maxmemory", 0)),
            str(info.get("maxmemory_policy", "unknown")),
        )


def read_memory(r: Any) -> RedisMemory:
    """``INFO memory`` (allowed to the read-only ACL user, unlike ``CONFIG GET``)."""
    return RedisMemory.from_info(r.info("memory"))


STREAM_KINDS = ("channel", "dead_letter")


@dataclass(frozen=True)
class StreamTotals:
    """Entries of the channel and dead-letter streams, summed per kind: held now, and ever
    added (``None`` where Redis does not report it: before 7.0)."""

    held: dict[str, int]
    added: dict[str, int] | None

    @property
    def removed(self) -> dict[str, int] | None:
        """Trimmed or deleted: what was added and is no longer held."""
        if self.added is None:
            return None
        return {k: self.added[k] - self.held[k] for k in STREAM_KINDS}


def read_janitor_dead_lettered(r: Any, prefix: str) -> int:
    """What janitors have dead-lettered, as they counted it in Redis (0 before the first)."""
    return int(r.hget(stats_key(prefix), DEAD_LETTERED_FIELD) or 0)


def read_streams(r: Any, prefix: str, channels: Iterable[str]) -> StreamTotals:
    """``XINFO STREAM`` (O(1), allowed to the read-only user) of each channel's stream and
    dead-letter stream, in one pipeline; a stream not created yet counts 0."""
    keys = [ChannelKeys.build(prefix, name) for name in channels]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.xinfo_stream(k.stream)
        pipe.xinfo_stream(k.dlq)
    replies = pipe.execute(raise_on_error=False) if keys else []
    held = dict.fromkeys(STREAM_KINDS, 0)
    added: dict[str, int] | None = dict.fromkeys(STREAM_KINDS, 0)
    for i, reply in enumerate(replies):
        kind = STREAM_KINDS[i % 2]
        if isinstance(reply, Exception):
            if "no such key" in str(reply).lower():
                continue
            raise reply
        held[kind] += int(reply["length"])
        if added is not None and reply.get("entries-added") is not None:
            added[kind] += int(reply["entries-added"])
        else:
            added = None  # Redis 6.2: not reported
    return StreamTotals(held, added)


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
    "redisbus_redis_memory_used_bytes": "Memory Redis uses (INFO memory used_memory).",
    "redisbus_redis_memory_max_bytes": "Redis' maxmemory; 0 when it has no limit.",
    "redisbus_redis_maxmemory_policy": "1 for Redis' eviction policy (redisbus needs noeviction).",
    "redisbus_exporter_redis_up": "1 when the exporter's last read of Redis succeeded, else 0.",
    "redisbus_exporter_collect_duration_seconds": "Time the exporter's last read of Redis took.",
    "redisbus_stream_entries": "Entries held in the channel or dead-letter streams (XLEN).",
    "redisbus_stream_entries_added": "Entries ever added to the channel or dead-letter streams "
    "(XINFO STREAM entries-added, kept by Redis); falls only when entries vanish untrimmed.",
    "redisbus_stream_entries_removed": "Entries trimmed or deleted from the channel or "
    "dead-letter streams (added minus held).",
    "redisbus_exporter_channels_skipped": "Channels registered but not read (past the "
    "exporter's max channels): every other fleet figure leaves them out.",
    "redisbus_build_info": "Always 1; the version label says which redisbus the exporter runs.",
    "redisbus_janitor_dead_lettered_total": "Messages dead-lettered by janitors (in the "
    "exporter or `redisbus janitor`), as counted in Redis.",
}


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
            yield _gauge(
                "redisbus_exporter_channels_skipped", snap.channels_total - len(snap.channels)
            )
            name = "redisbus_janitor_dead_lettered_total"
            yield CounterMetricFamily(name, _HELP[name], value=janitor_dead_lettered)
        yield _gauge("redisbus_exporter_redis_up", 1 if snap is not None else 0)
        yield _gauge("redisbus_exporter_collect_duration_seconds", duration_s)
        build = GaugeMetricFamily(
            "redisbus_build_info", _HELP["redisbus_build_info"], labels=["version"]
        )
        build.add_metric([build_version()], 1)
        yield build

    def describe(self) -> Iterable[Metric]:
        # Without describe() the registry would run collect() on registration.
        for name, labels in FLEET_GAUGES.items():
            yield GaugeMetricFamily(name, _HELP[name], labels=list(labels))
        for name, labels in FLEET_COUNTERS.items():
            yield CounterMetricFamily(name, _HELP[name], labels=list(labels))


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _HELP[name], value=value)


def fleet_families(snap: FleetSnapshot, top_n: int) -> Iterator[GaugeMetricFamily]:
    """The gauges of one snapshot of the channels."""
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


def memory_families(memory: RedisMemory) -> Iterator[GaugeMetricFamily]:
    """Redis' memory and eviction policy."""
    yield _gauge("redisbus_redis_memory_used_bytes", memory.used_bytes)
    yield _gauge("redisbus_redis_memory_max_bytes", memory.max_bytes)
    name = "redisbus_redis_maxmemory_policy"
    policy = GaugeMetricFamily(name, _HELP[name], labels=["policy"])
    policy.add_metric([memory.policy], 1)
    yield policy


def stream_families(streams: StreamTotals) -> Iterator[GaugeMetricFamily]:
    """Entries held, ever added and removed, per kind of stream; added and removed only where
    Redis reports entries-added."""
    values = {
        "redisbus_stream_entries": streams.held,
        "redisbus_stream_entries_added": streams.added,
        "redisbus_stream_entries_removed": streams.removed,
    }
    for name, per_kind in values.items():
        if per_kind is None:
            continue
        family = GaugeMetricFamily(name, _HELP[name], labels=["stream"])
        for kind in STREAM_KINDS:
            family.add_metric([kind], per_kind[kind])
        yield family


# -- the exporter -------------------------------------------------------------------------------

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


if __name__ == "__main__":
    # `python -m redisbus.exporter`: this file runs as __main__, not as redisbus.exporter (which
    # the command imports afresh), so importing the CLI here closes no import cycle.
    from ._cli_run import run_command

    raise SystemExit(run_command("exporter"))
