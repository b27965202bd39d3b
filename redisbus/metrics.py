"""Client-side Prometheus metrics of redisbus (docs/deployment.md#prometheus-alerts-and-grafana).

Public API: ``BusMetrics`` (give one to ``Bus.from_url(metrics=...)`` to choose its registry)
and ``NOOP``; the series names below are the dashboards' and alerts' contract. The rest of its
``__all__`` (the tables of label values) serves the exporter and the tests.

Nothing here does I/O or registers a metric at import. A :class:`BusMetrics` creates its
metric families on the registry it is given (the process-wide default registry when none is
given) the first time that registry is used; later instances on the same registry share the
families, so several buses in one process can each hold a ``BusMetrics``. :data:`NOOP` has
the same methods and does nothing: the bus uses it when metrics are off.

Series (every label bounded; no message id, agent or channel name is ever a label):

====================================================  =============================================
``redisbus_messages_sent_total{type,host}``           messages appended, by type (broadcast: 1)
``redisbus_send_rejected_total{reason,host}``         refusals per recipient, by reason
``redisbus_delivery_latency_seconds{host}``           histogram: entry id millisecond -> Redis
                                                      ``TIME`` at fetch (one clock, no host skew)
``redisbus_messages_received_total{host}``            messages fetched by agents of this process
``redisbus_messages_done_total{host}``                messages marked done
``redisbus_redeliveries_total{host}``                 messages fetched again after a lost lease
``redisbus_dead_lettered_total{host}``                messages moved to a dead-letter stream
``redisbus_clock_skew_seconds{host}``                 this host's clock minus Redis ``TIME`` at the
                                                      last measurement (join, heartbeat); signed
                                                      sends are refused past half the signing
                                                      window
``redisbus_build_info{version}``                      always 1
====================================================  =============================================

``host`` names the agent host: :meth:`BusMetrics.from_settings` takes
``BusSettings.metrics_host`` (``REDISBUS_METRICS_HOST``), else ``BusSettings.host``
(``REDISBUS_HOST``, the machine's hostname by default). Every value of ``host`` is a set of
about 60 series, and Prometheus keeps each set for hours after its last sample, so the label
must have few values: with one pod per agent and the pod's hostname as ``host``, series grow
with agents and with every restart (10,000 agents: about 600,000 series). Set
``REDISBUS_METRICS_HOST`` to something that does not churn -- the node, the Deployment, a
pool name such as ``host-a`` -- or to the empty string, which drops the label (Prometheus'
``instance`` still tells scrape targets apart; see docs/deployment.md for the scrape side).
``REDISBUS_HOST`` keeps naming replicas (``HOST/PID``) either way.

prometheus_client's ``_created`` series (one per counter and histogram child: the time it was
created, which no panel or alert reads) are turned off, process-wide, when the first
``BusMetrics`` is created; ``prometheus_client.enable_created_metrics()`` brings them back.
Message types and refusal reasons outside the known sets are counted as ``other``, so a
caller cannot grow the label set without bound.

Exposing ``/metrics`` from an agent host::

    from redisbus.metrics import BusMetrics, serve_metrics
    bus = Bus.from_url(url, metrics=BusMetrics(host="host-a"))  # or REDISBUS_HOST=host-a
    serve_metrics(9108)                   # background thread; returns (server, thread)

Multi-process servers (gunicorn, uvicorn workers, several agent processes on one host):

1. Before each process starts -- before anything imports ``prometheus_client`` -- set
   ``PROMETHEUS_MULTIPROC_DIR`` to an empty directory writable by all the processes, and
   clear it on every deploy. prometheus-client picks its storage when it is first imported.
2. Create ``BusMetrics`` in each worker as usual: counters and the histogram are written to
   per-process files and summed at scrape time; the build-info gauge is created with
   ``multiprocess_mode="max"`` so it stays a single series of value 1.
3. Serve from one process with ``serve_metrics(port)``: when the variable is set and no
   registry is passed, it serves a fresh registry holding a ``MultiProcessCollector`` that
   reads every worker's files. With gunicorn, call
   ``prometheus_client.multiprocess.mark_process_dead(worker.pid)`` from ``child_exit``.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from importlib import metadata
from typing import Final, Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client import start_http_server as _start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from . import _signing
from ._settings import BusSettings

__all__ = [
    "AGENT_STATUSES",
    "FLEET_COUNTERS",
    "FLEET_GAUGES",
    "LATENCY_BUCKETS_S",
    "MESSAGE_TYPES",
    "NOOP",
    "NOT_ON_DASHBOARD",
    "REJECT_REASONS",
    "BusMetrics",
    "MetricsSink",
    "NoopMetrics",
    "serve_metrics",
]

#: Delivery-latency buckets in seconds: 1 ms (loopback) to 10 min (an agent busy on a turn).
LATENCY_BUCKETS_S: Final[tuple[float, ...]] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)

#: Values of the ``reason`` label; one per refusal the send script or the client can report.
REJECT_REASONS: Final[frozenset[str]] = frozenset(
    {
        "inbox_full",
        "rate_limited",
        "too_large",
        "chain_too_deep",
        "circuit_open",
        "loop",
        "routing_refused",
        "unknown_agent",
        "recipient_closed",
        "channel_paused",
        "budget",
        "server_full",
        "invalid_input",
        # further codes of the error tree that a send can end with
        "not_permitted",
        "agent_closed",
        "connection",
    }
)

#: Values of the ``type`` label; any other message type is counted as ``other``.
MESSAGE_TYPES: Final[frozenset[str]] = frozenset(
    {
        "message",
        "request",
        "status_update",
        "delegate_task",
        "auto_reply",
        "outcome",
        "control",
    }
)

#: Values of the ``status`` label of ``redisbus_agents``.
AGENT_STATUSES: Final[tuple[str, ...]] = (
    "running",
    "waiting",
    "idle",
    "completed",
    "failed",
    "cancelled",
    "lost",
)

#: The gauges ``redisbus exporter`` publishes, name -> label names. The Grafana dashboard and
#: the alert rules use exactly these names (a test checks it); the exporter should build its
#: gauges from this table. Fleet totals carry no label of their own: one exporter per Redis
#: deployment, told apart by Prometheus' ``job``/``instance``.
FLEET_GAUGES: Final[dict[str, tuple[str, ...]]] = {
    "redisbus_channels": (),
    "redisbus_unread_messages": (),
    "redisbus_oldest_unread_age_seconds": (),
    "redisbus_pending_messages": (),
    "redisbus_dead_letters": (),
    "redisbus_agents": ("status",),
    "redisbus_channel_unread_messages": ("channel",),  # the exporter's top N channels only
    "redisbus_watchdog_stale_unread_messages": (),
    "redisbus_redis_memory_used_bytes": (),
    "redisbus_redis_memory_max_bytes": (),
    "redisbus_redis_maxmemory_policy": ("policy",),  # 1 for the policy Redis runs with
    "redisbus_exporter_redis_up": (),  # 0 when the exporter's last read of Redis failed
    "redisbus_exporter_collect_duration_seconds": (),
    # stream: "channel" (the channel streams) or "dead_letter" (the dead-letter streams)
    "redisbus_stream_entries": ("stream",),  # held now (XLEN)
    "redisbus_stream_entries_added": ("stream",),  # ever added (Redis 7+), kept by Redis
    "redisbus_stream_entries_removed": ("stream",),  # trimmed or deleted: added - held
    # channels registered but not read (past exporter_max_channels): what the totals miss
    "redisbus_exporter_channels_skipped": (),
    "redisbus_build_info": ("version",),  # the exporter's own version, as agent hosts say theirs
}

#: The counters ``redisbus exporter`` publishes (sample names), name -> label names: counts
#: kept in Redis, so every process that adds to them is counted, scraped or not.
FLEET_COUNTERS: Final[dict[str, tuple[str, ...]]] = {
    # messages dead-lettered by janitors (the exporter's own and `redisbus janitor` processes)
    "redisbus_janitor_dead_lettered_total": (),
}

#: Fleet gauges the dashboard does not draw (none today; a test keeps the dashboard to it).
NOT_ON_DASHBOARD: Final[frozenset[str]] = frozenset()

_OTHER: Final = "other"
_MULTIPROC_ENV: Final = "PROMETHEUS_MULTIPROC_DIR"


class MetricsSink(Protocol):
    """What the bus calls; both :class:`BusMetrics` and :class:`NoopMetrics` satisfy it."""

    def sent(self, type_: str, n: int = 1) -> None: ...
    def rejected(self, reason: str) -> None: ...
    def delivered(self, latency_s: float) -> None: ...
    def received(self, n: int = 1) -> None: ...
    def done(self, n: int = 1) -> None: ...
    def redelivered(self, n: int = 1) -> None: ...
    def dead_lettered(self, n: int = 1) -> None: ...
    def message_rejected(self, reason: str, n: int = 1) -> None: ...
    def clock_skew(self, seconds: float) -> None: ...


@dataclass(frozen=True)
class _Families:
    """The metric families of one registry, shared by every BusMetrics using it."""

    sent: Counter
    rejected: Counter
    latency: Histogram
    received: Counter
    done: Counter
    redelivered: Counter
    dead_lettered: Counter
    message_rejected: Counter
    clock_skew: Gauge
    build_info: Gauge


# Weak keys: a test's throwaway registry takes its families with it when it is dropped.
_families: weakref.WeakKeyDictionary[CollectorRegistry, _Families] = weakref.WeakKeyDictionary()
_families_lock = threading.Lock()


def build_version() -> str:
    """The installed redisbus version (the ``version`` label of ``redisbus_build_info``)."""
    try:
        return metadata.version("redisbus")
    except metadata.PackageNotFoundError:
        return "unknown"


def _create_families(registry: CollectorRegistry) -> _Families:
    # A _created series per child would be 38 of an agent host's ~100 series (see the module
    # docstring); prometheus_client can only turn them off for the whole process.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # shipped without annotations
    host = ("host",)
    families = _Families(
        sent=Counter(
            "redisbus_messages_sent",
            "Messages appended to a channel stream, by message type; a broadcast counts once.",
            ("type", "host"),
            registry=registry,
        ),
        rejected=Counter(
            "redisbus_send_rejected",
            "Sends refused, per recipient, by reason.",
            ("reason", "host"),
            registry=registry,
        ),
        latency=Histogram(
            "redisbus_delivery_latency_seconds",
            "Time from a message's stream entry id to Redis TIME when its recipient fetched "
            "it; both read on the Redis clock, so hosts' clocks do not matter.",
            host,
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        ),
        received=Counter(
            "redisbus_messages_received",
            "Messages fetched by agents of this process.",
            host,
            registry=registry,
        ),
        done=Counter(
            "redisbus_messages_done",
            "Messages marked done by agents of this process.",
            host,
            registry=registry,
        ),
        redelivered=Counter(
            "redisbus_redeliveries",
            "Messages fetched again after another replica's lease ran out.",
            host,
            registry=registry,
        ),
        dead_lettered=Counter(
            "redisbus_dead_lettered",
            "Messages moved to a dead-letter stream after too many deliveries.",
            host,
            registry=registry,
        ),
        message_rejected=Counter(
            "redisbus_messages_rejected",
            "Entries a receiver refused (bad or missing signature, untrusted or revoked key, "
            "key not allowed, misaddressed, stale signing time, replay), by reason.",
            ("reason", "host"),
            registry=registry,
        ),
        clock_skew=Gauge(
            "redisbus_clock_skew_seconds",
            "This host's clock minus the Redis clock (TIME), at the last measurement; signed "
            "sends are refused (ClockSkew) when it is past half the signing window.",
            host,
            registry=registry,
            # every process of a host reads the same clock: the latest measurement is the news
            multiprocess_mode="mostrecent",
        ),
        build_info=Gauge(
            "redisbus_build_info",
            "Always 1; the version label says which redisbus this process runs.",
            ("version",),
            registry=registry,
            multiprocess_mode="max",
        ),
    )
    families.build_info.labels(build_version()).set(1)
    return families


def _families_for(registry: CollectorRegistry) -> _Families:
    with _families_lock:
        found = _families.get(registry)
        if found is None:
            found = _families[registry] = _create_families(registry)
        return found


class BusMetrics:
    """Client metrics of one agent host, recorded into ``registry``.

    ``registry`` defaults to prometheus-client's process-wide registry (what
    :func:`serve_metrics` serves by default). ``host`` becomes the ``host`` label of every
    series this instance records; see the module docstring for how to choose it.
    """

    def __init__(self, registry: CollectorRegistry | None = None, host: str = "") -> None:
        self.registry: CollectorRegistry = REGISTRY if registry is None else registry
        self.host = host
        f = _families_for(self.registry)
        # Every known series exists from the start at 0, so rate() and increase() see the
        # first event instead of the series appearing with it (and dashboards show 0, not
        # "no data", on a quiet fleet).
        self._sent = {t: f.sent.labels(t, host) for t in (*sorted(MESSAGE_TYPES), _OTHER)}
        self._rejected = {r: f.rejected.labels(r, host) for r in (*sorted(REJECT_REASONS), _OTHER)}
        self._latency = f.latency.labels(host)
        self._received = f.received.labels(host)
        self._done = f.done.labels(host)
        self._redelivered = f.redelivered.labels(host)
        self._dead_lettered = f.dead_lettered.labels(host)
        self._message_rejected = {
            r: f.message_rejected.labels(r, host) for r in (*_signing.REASONS, _OTHER)
        }
        # no series until a measurement: an absent skew is "not measured", not "0 s"
        self._clock_skew_family = f.clock_skew

    @classmethod
    def from_settings(
        cls, settings: BusSettings, registry: CollectorRegistry | None = None
    ) -> BusMetrics:
        """The metrics a bus built from ``settings`` records: ``host`` is ``metrics_host``
        when set (``""`` drops the label), else ``host``."""
        host = settings.host if settings.metrics_host is None else settings.metrics_host
        return cls(registry, host=host)

    def sent(self, type_: str, n: int = 1) -> None:
        """``n`` messages of type ``type_`` were appended to a stream (a broadcast counts
        once)."""
        counter = self._sent.get(type_)
        (self._sent[_OTHER] if counter is None else counter).inc(n)

    def rejected(self, reason: str) -> None:
        """One send (to one recipient) was refused for ``reason``."""
        self._rejected.get(reason, self._rejected[_OTHER]).inc()

    def delivered(self, latency_s: float) -> None:
        """A recipient fetched a message ``latency_s`` seconds after it was appended."""
        # The same Redis clock stamps both ends, but a failover to a replica whose clock is
        # slightly behind can yield a small negative difference: count it as immediate.
        self._latency.observe(max(latency_s, 0.0))

    def received(self, n: int = 1) -> None:
        """Agents of this process fetched ``n`` messages."""
        if n > 0:
            self._received.inc(n)

    def done(self, n: int = 1) -> None:
        """``n`` messages were marked done."""
        if n > 0:
            self._done.inc(n)

    def redelivered(self, n: int = 1) -> None:
        """``n`` messages were fetched again after a lease ran out."""
        if n > 0:
            self._redelivered.inc(n)

    def dead_lettered(self, n: int = 1) -> None:
        """``n`` messages were moved to a dead-letter stream."""
        if n > 0:
            self._dead_lettered.inc(n)

    def message_rejected(self, reason: str, n: int = 1) -> None:
        """A receiver refused ``n`` entries for ``reason`` (one of ``_signing.REASONS``)."""
        if n > 0:
            self._message_rejected.get(reason, self._message_rejected[_OTHER]).inc(n)

    def clock_skew(self, seconds: float) -> None:
        """This host's clock was measured ``seconds`` ahead of the Redis clock (negative:
        behind)."""
        self._clock_skew_family.labels(self.host).set(seconds)


class NoopMetrics:
    """The :class:`MetricsSink` used when metrics are off: every method does nothing."""

    def sent(self, type_: str, n: int = 1) -> None:
        pass

    def rejected(self, reason: str) -> None:
        pass

    def delivered(self, latency_s: float) -> None:
        pass

    def received(self, n: int = 1) -> None:
        pass

    def done(self, n: int = 1) -> None:
        pass

    def redelivered(self, n: int = 1) -> None:
        pass

    def dead_lettered(self, n: int = 1) -> None:
        pass

    def message_rejected(self, reason: str, n: int = 1) -> None:
        pass

    def clock_skew(self, seconds: float) -> None:
        pass


NOOP: Final[NoopMetrics] = NoopMetrics()


def serve_metrics(
    port: int,
    addr: str = "0.0.0.0",
    registry: CollectorRegistry | None = None,
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``addr:port`` from a daemon thread; returns (server, thread).

    Without ``registry``: the multi-process view when ``PROMETHEUS_MULTIPROC_DIR`` is set
    (see the module docstring), else the process-wide default registry. Port 0 picks a free
    port: read it back from ``server.server_port``. Stop with ``server.shutdown()``.
    """
    if registry is None:
        if os.environ.get(_MULTIPROC_ENV):
            registry = CollectorRegistry()
            # prometheus-client ships this constructor without annotations.
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:
            registry = REGISTRY
    return _start_http_server(port, addr=addr, registry=registry)
