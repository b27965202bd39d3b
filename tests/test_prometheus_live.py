"""A real Prometheus scraping live metrics: every dashboard query returns data, the alert
expressions evaluate, and delivery latency is seen per host and for the whole fleet.

The fleet gauges come from a stub with the names of ``FLEET_GAUGES`` until `redisbus
exporter` exists; the client metrics come from real ``BusMetrics`` and from two
``deploy/agent_host.py`` processes on a real Redis.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from redisbus.metrics import AGENT_STATUSES, FLEET_GAUGES, BusMetrics, serve_metrics
from tests.deploy_support import DEPLOY, LATENCY_BUCKET, run_redis
from tests.prometheus_fixture import (
    ALERTS,
    alert_queries,
    dashboard_queries,
    free_port,
    query,
    start_prometheus,
    wait_for_data,
)


def fleet_registry() -> CollectorRegistry:
    """What `redisbus exporter` will publish, with plausible values (names from FLEET_GAUGES)."""
    registry = CollectorRegistry()
    values = {
        "redisbus_channels": 3,
        "redisbus_unread_messages": 12,
        "redisbus_oldest_unread_age_seconds": 120.0,
        "redisbus_pending_messages": 4,
        "redisbus_dead_letters": 1,
        "redisbus_watchdog_stale_unread_messages": 2,
        "redisbus_exporter_scrape_duration_seconds": 0.004,
    }
    for name, labels in FLEET_GAUGES.items():
        gauge = Gauge(name, f"stub of {name}", labels, registry=registry)
        if name == "redisbus_agents":
            for i, status in enumerate(AGENT_STATUSES):
                gauge.labels(status).set(i)
        elif name == "redisbus_channel_unread_messages":
            gauge.labels("anime-project-1").set(9)
            gauge.labels("anime-project-2").set(3)
        else:
            gauge.set(values[name])
    return registry


def traffic(metrics: dict[str, BusMetrics], stop: threading.Event) -> None:
    """Record a steady trickle on every host until stopped (bounded: at most 60 s)."""
    latency = {"host-a": (0.002, 0.004), "host-b": (1.5, 3.0)}
    rng = random.Random(7)
    deadline = time.monotonic() + 60
    while not stop.is_set() and time.monotonic() < deadline:
        for host, m in metrics.items():
            m.sent(rng.choice(["message", "request", "status_update"]))
            m.rejected(rng.choice(["inbox_full", "rate_limited"]))
            m.delivered(rng.uniform(*latency[host]))
            m.received(1)
            m.done(1)
            m.redelivered(1)
            m.dead_lettered(1)
        stop.wait(0.05)


@pytest.mark.slow
def test_prometheus_scrapes_bus_metrics_and_every_query_returns_data(tmp_path: Path) -> None:
    # given two agent hosts and an exporter, each serving /metrics
    registries = {h: CollectorRegistry() for h in ("host-a", "host-b")}
    metrics = {h: BusMetrics(r, host=h) for h, r in registries.items()}
    servers = [serve_metrics(0, "127.0.0.1", r)[0] for r in registries.values()]
    exporter = serve_metrics(0, "127.0.0.1", fleet_registry())[0]
    stop = threading.Event()
    thread = threading.Thread(target=traffic, args=(metrics, stop), daemon=True)
    thread.start()
    url, stop_prometheus = start_prometheus(
        tmp_path,
        {
            "redisbus-agents": [f"127.0.0.1:{s.server_port}" for s in servers],
            "redisbus-exporter": [f"127.0.0.1:{exporter.server_port}"],
        },
        rule_files=[ALERTS],
    )
    try:
        # when Prometheus has scraped a few times
        rate_expr = "sum by (host) (rate(redisbus_delivery_latency_seconds_count[1m])) > 0"
        deadline = time.monotonic() + 30
        while len(query(url, rate_expr)) < 2:
            assert time.monotonic() < deadline, "no delivery rate for both hosts"
            time.sleep(0.25)

        # then every dashboard panel query returns data
        for title, expr in dashboard_queries():
            assert wait_for_data(url, expr, timeout_s=15), title

        # and latency is visible per host and in aggregate
        p50 = f"histogram_quantile(0.5, sum by (le, host) (rate({LATENCY_BUCKET}[1m])))"
        per_host = {r["metric"]["host"]: float(r["value"][1]) for r in query(url, p50)}
        assert per_host["host-a"] < 0.01 < 1.0 < per_host["host-b"] <= 5.0
        p99_all = f"histogram_quantile(0.99, sum by (le) (rate({LATENCY_BUCKET}[1m])))"
        (aggregate,) = query(url, p99_all)
        assert 1.0 < float(aggregate["value"][1]) <= 5.0

        # and every alert expression is accepted and evaluates without error
        for _, expr in alert_queries():
            query(url, expr)
        # the stub exporter reports a 120 s old unread message: the stale alert is on its way,
        # while the exporter-down alert stays quiet once the exporter has been scraped
        expected = {
            "RedisbusStaleUnread": {"pending", "firing"},
            "RedisbusExporterDown": {"inactive"},
        }
        deadline = time.monotonic() + 20
        while True:
            with urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10) as r:
                rules = [rule for g in json.load(r)["data"]["groups"] for rule in g["rules"]]
            states = {rule["name"]: (rule["health"], rule["state"]) for rule in rules}
            if (
                len(states) == 5
                and all(h == "ok" for h, _ in states.values())
                and all(states[n][1] in ok for n, ok in expected.items())
            ):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.25)
    finally:
        stop.set()
        thread.join(timeout=5)
        stop_prometheus()
        for s in (*servers, exporter):
            s.shutdown()
            s.server_close()


@pytest.fixture
def bus_redis(tmp_path: Path) -> Iterator[str]:
    """A plain Redis on a free loopback port for the agent hosts; yields its URL."""
    with run_redis(None, tmp_path) as port:
        yield f"redis://127.0.0.1:{port}/0"


@pytest.mark.slow
def test_two_agent_host_processes_on_a_real_bus_show_latency_per_host(
    tmp_path: Path, bus_redis: str
) -> None:
    # given two agent host processes on one Redis; host-b fetches far less often
    read_interval = {"host-a": "0.05", "host-b": "1.5"}
    ports = {host: free_port() for host in read_interval}
    procs = {
        host: subprocess.Popen(
            [
                *(sys.executable, str(DEPLOY / "agent_host.py"), "--rate", "10"),
                *("--metrics-port", str(ports[host]), "--metrics-addr", "127.0.0.1"),
                *("--read-interval-s", read_interval[host], "--duration-s", "90"),
            ],
            env={**os.environ, "REDISBUS_URL": bus_redis, "REDISBUS_HOST": host},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for host in read_interval
    }
    exporter = serve_metrics(0, "127.0.0.1", fleet_registry())[0]
    url, stop_prometheus = start_prometheus(
        tmp_path,
        {
            "redisbus-agents": [f"127.0.0.1:{p}" for p in ports.values()],
            "redisbus-exporter": [f"127.0.0.1:{exporter.server_port}"],
        },
        rule_files=[ALERTS],
    )
    try:
        # when both hosts have fetched messages for a few scrapes
        rate_expr = "sum by (host) (rate(redisbus_delivery_latency_seconds_count[1m])) > 0"
        deadline = time.monotonic() + 45
        while len(query(url, rate_expr)) < 2:
            for host, p in procs.items():
                assert p.poll() is None, f"{host} exited: {p.stdout.read() if p.stdout else ''}"
            assert time.monotonic() < deadline, "no delivery rate for both hosts"
            time.sleep(0.25)

        # then every dashboard query returns data
        for title, expr in dashboard_queries():
            assert wait_for_data(url, expr, timeout_s=15), title

        # and the two hosts' latencies are told apart, with the fleet's in between
        p50 = f"histogram_quantile(0.5, sum by (le, host) (rate({LATENCY_BUCKET}[1m])))"
        per_host = {r["metric"]["host"]: float(r["value"][1]) for r in query(url, p50)}
        assert set(per_host) == {"host-a", "host-b"}
        assert per_host["host-a"] < per_host["host-b"], per_host
        fleet = f"histogram_quantile(0.5, sum by (le) (rate({LATENCY_BUCKET}[1m])))"
        (aggregate,) = query(url, fleet)
        assert per_host["host-a"] <= float(aggregate["value"][1]) <= per_host["host-b"]
    finally:
        for p in procs.values():
            p.terminate()
        codes = {host: p.wait(timeout=30) for host, p in procs.items()}
        stop_prometheus()
        exporter.shutdown()
        exporter.server_close()
    # and SIGTERM stops an agent host cleanly
    assert codes == {"host-a": 0, "host-b": 0}
