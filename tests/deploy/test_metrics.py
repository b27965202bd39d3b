"""redisbus.metrics: names, labels and buckets of the client metrics, bounded label values,
the no-op sink, /metrics over HTTP, and prometheus-client's multi-process mode."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from redisbus.metrics import (
    LATENCY_BUCKETS_S,
    MESSAGE_TYPES,
    NOOP,
    REJECT_REASONS,
    BusMetrics,
    MetricsSink,
    serve_metrics,
)

ROOT = Path(__file__).resolve().parents[2]


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_importing_the_module_registers_nothing() -> None:
    code = (
        "import redisbus.metrics\n"
        "from prometheus_client import REGISTRY\n"
        "print(sorted(m.name for m in REGISTRY.collect() if m.name.startswith('redisbus')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_series_have_the_spec_names_types_and_labels() -> None:
    registry = CollectorRegistry()
    BusMetrics(registry, host="host-a")
    families = {f.name: f for f in registry.collect()}
    assert {n: f.type for n, f in families.items()} == {
        "redisbus_messages_sent": "counter",
        "redisbus_send_rejected": "counter",
        "redisbus_delivery_latency_seconds": "histogram",
        "redisbus_messages_received": "counter",
        "redisbus_messages_done": "counter",
        "redisbus_redeliveries": "counter",
        "redisbus_dead_lettered": "counter",
        "redisbus_messages_rejected": "counter",
        "redisbus_clock_skew_seconds": "gauge",
        "redisbus_build_info": "gauge",
    }
    labels = {s.name: set(s.labels) - {"le"} for f in families.values() for s in f.samples}
    assert labels["redisbus_messages_sent_total"] == {"type", "host"}
    assert labels["redisbus_send_rejected_total"] == {"reason", "host"}
    assert labels["redisbus_delivery_latency_seconds_bucket"] == {"host"}
    for name in ("received", "done"):
        assert labels[f"redisbus_messages_{name}_total"] == {"host"}
    assert labels["redisbus_redeliveries_total"] == {"host"}
    assert labels["redisbus_dead_lettered_total"] == {"host"}
    assert labels["redisbus_messages_rejected_total"] == {"reason", "host"}
    assert labels["redisbus_build_info"] == {"version"}


def test_latency_buckets_span_one_millisecond_to_ten_minutes() -> None:
    assert LATENCY_BUCKETS_S[0] == 0.001 and LATENCY_BUCKETS_S[-1] == 600.0
    assert list(LATENCY_BUCKETS_S) == sorted(set(LATENCY_BUCKETS_S))
    registry = CollectorRegistry()
    BusMetrics(registry).delivered(700.0)
    les = [
        s.labels["le"] for f in registry.collect() for s in f.samples if s.name.endswith("_bucket")
    ]
    assert les[0] == "0.001" and les[-2:] == ["600.0", "+Inf"]
    assert value(registry, "redisbus_delivery_latency_seconds_bucket", host="", le="600.0") == 0
    assert value(registry, "redisbus_delivery_latency_seconds_bucket", host="", le="+Inf") == 1


def test_each_method_counts_on_its_own_series() -> None:
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="host-a")
    m.sent("request")
    m.rejected("inbox_full")
    m.rejected("inbox_full")
    m.delivered(0.004)
    m.received(3)
    m.done(2)
    m.redelivered()
    m.dead_lettered(1)
    h = {"host": "host-a"}
    assert value(registry, "redisbus_messages_sent_total", type="request", **h) == 1
    assert value(registry, "redisbus_send_rejected_total", reason="inbox_full", **h) == 2
    bucket = "redisbus_delivery_latency_seconds_bucket"
    assert value(registry, bucket, le="0.0025", **h) == 0
    assert value(registry, bucket, le="0.005", **h) == 1
    assert value(registry, "redisbus_delivery_latency_seconds_sum", **h) == pytest.approx(0.004)
    assert value(registry, "redisbus_messages_received_total", **h) == 3
    assert value(registry, "redisbus_messages_done_total", **h) == 2
    assert value(registry, "redisbus_redeliveries_total", **h) == 1
    assert value(registry, "redisbus_dead_lettered_total", **h) == 1


def test_every_known_label_value_exists_at_zero_before_any_event() -> None:
    registry = CollectorRegistry()
    BusMetrics(registry, host="h")
    for t in MESSAGE_TYPES:
        assert value(registry, "redisbus_messages_sent_total", type=t, host="h") == 0
    for r in REJECT_REASONS:
        assert value(registry, "redisbus_send_rejected_total", reason=r, host="h") == 0
    assert value(registry, "redisbus_messages_received_total", host="h") == 0


def test_unknown_types_and_reasons_count_as_other_so_labels_stay_bounded() -> None:
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="h")
    for i in range(50):
        m.sent(f"custom-{i}")
        m.rejected(f"new-reason-{i}")
    assert value(registry, "redisbus_messages_sent_total", type="other", host="h") == 50
    assert value(registry, "redisbus_send_rejected_total", reason="other", host="h") == 50
    sent = [s for f in registry.collect() for s in f.samples if s.name.endswith("sent_total")]
    assert len(sent) == len(MESSAGE_TYPES) + 1


def test_negative_latency_and_non_positive_counts_are_harmless() -> None:
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="h")
    m.delivered(-0.002)  # a failover to a replica whose clock is a little behind
    m.received(0)
    m.done(-1)
    assert value(registry, "redisbus_delivery_latency_seconds_bucket", host="h", le="0.001") == 1
    assert value(registry, "redisbus_delivery_latency_seconds_sum", host="h") == 0
    assert value(registry, "redisbus_messages_received_total", host="h") == 0
    assert value(registry, "redisbus_messages_done_total", host="h") == 0


def test_two_buses_in_one_process_share_the_registry_with_their_own_host() -> None:
    registry = CollectorRegistry()
    a = BusMetrics(registry, host="host-a")
    b = BusMetrics(registry, host="host-b")
    a.received(1)
    b.received(5)
    assert value(registry, "redisbus_messages_received_total", host="host-a") == 1
    assert value(registry, "redisbus_messages_received_total", host="host-b") == 5


def test_receiver_rejections_are_counted_by_bounded_reason() -> None:
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="host-a")
    m.message_rejected("replay", 2)
    m.message_rejected("a reason nobody knows")
    assert value(registry, "redisbus_messages_rejected_total", reason="replay", host="host-a") == 2
    assert value(registry, "redisbus_messages_rejected_total", reason="other", host="host-a") == 1


def test_build_info_is_one_and_names_the_version() -> None:
    registry = CollectorRegistry()
    BusMetrics(registry)
    (sample,) = [s for f in registry.collect() for s in f.samples if s.name.endswith("info")]
    assert sample.value == 1
    assert sample.labels["version"]


def test_noop_has_every_method_of_bus_metrics_and_does_nothing() -> None:
    public = {
        n: inspect.signature(f)
        for n, f in inspect.getmembers(BusMetrics, inspect.isfunction)
        if not n.startswith("_")
    }
    assert set(public) == {
        "sent",
        "rejected",
        "delivered",
        "received",
        "done",
        "redelivered",
        "dead_lettered",
        "message_rejected",
        "clock_skew",
    }
    for name, sig in public.items():
        assert inspect.signature(getattr(type(NOOP), name)) == sig, name
    sink: MetricsSink = NOOP
    sink.sent("message")
    sink.delivered(1.0)
    sink.received(2)


def test_serve_metrics_exposes_the_registry_over_http() -> None:
    registry = CollectorRegistry()
    BusMetrics(registry, host="host-a").sent("message")
    server, thread = serve_metrics(0, "127.0.0.1", registry)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        assert 'redisbus_messages_sent_total{host="host-a",type="message"} 1.0' in text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


WORKER = textwrap.dedent(
    """
    import sys, urllib.request
    from redisbus.metrics import BusMetrics, serve_metrics
    m = BusMetrics(host="host-a")
    m.sent("message")
    m.delivered(0.01)
    if sys.argv[1] == "serve":
        server, _ = serve_metrics(0, "127.0.0.1")
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        print(urllib.request.urlopen(url, timeout=10).read().decode())
        server.shutdown()
    """
)


def test_multiprocess_mode_sums_every_process(tmp_path: Path) -> None:
    # given PROMETHEUS_MULTIPROC_DIR set before each process starts
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def run(mode: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", WORKER, mode],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout

    # when two worker processes record, then a third records and serves /metrics
    run("record")
    run("record")
    served = run("serve")

    # then the served view and a MultiProcessCollector both see all three processes
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    h = {"host": "host-a"}
    assert value(registry, "redisbus_messages_sent_total", type="message", **h) == 3
    assert value(registry, "redisbus_delivery_latency_seconds_count", **h) == 3
    families = {f.name: f for f in text_string_to_metric_families(served)}
    (sent,) = [
        s
        for s in families["redisbus_messages_sent"].samples
        if s.labels.get("type") == "message" and s.name.endswith("_total")
    ]
    assert sent.value == 3
    info = [s for s in families["redisbus_build_info"].samples]
    assert len(info) == 1 and info[0].value == 1  # multiprocess_mode="max": one series
