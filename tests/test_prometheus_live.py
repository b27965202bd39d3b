"""A real Prometheus scraping live metrics: every dashboard query returns data, the alert
expressions evaluate, and delivery latency is seen per host and for the whole fleet.

The fleet gauges come from the real `redisbus exporter` (``python -m redisbus.exporter`` in a
subprocess) reading a real Redis; the client metrics come from real ``BusMetrics`` and from
two ``deploy/agent_host.py`` processes on that Redis.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from redisbus import Bus, BusSettings
from redisbus.metrics import BusMetrics, serve_metrics
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

FAST = {"pair_rate_burst": 1e6, "pair_rate_per_s": 1e6, "sender_rate_burst": 0}


@contextmanager
def run_exporter(redis_url: str, *options: str) -> Iterator[str]:
    """`python -m redisbus.exporter` on a free loopback port; yields "127.0.0.1:port".
    Stops it with SIGTERM and checks it exits cleanly."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbus.exporter", "--addr", "127.0.0.1", *options],
        env={**os.environ, "REDISBUS_URL": redis_url, "REDISBUS_EXPORTER_PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "exporter did not answer /healthz"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out


def seed_backlog(redis_url: str) -> None:
    """A bus with a known backlog: 2 unread and 3 pending messages, 1 dead letter, 2 channels."""
    bus = Bus.from_url(redis_url, settings=BusSettings(metrics=False, host="seed"))
    other = Bus.from_url(redis_url, settings=BusSettings(metrics=False, replica="b"))
    try:
        team = bus.channel("anime-project-1", **FAST)
        director, writer = team.join("director"), team.join("writer", parent="director")
        team.join("editor", parent="director")
        for i in range(3):
            director.send("writer", f"scene {i}")
        assert len(writer.read(limit=1)) == 1  # all three fetched (pending), one returned
        for i in range(2):
            director.send("editor", f"cut {i}")  # never fetched: unread
        # a message delivered once whose lease runs out is dead-lettered (max_deliveries=1)
        jobs = bus.channel("anime-project-2", lease_s=0.1, max_deliveries=1, **FAST)
        jobs.join("worker")
        jobs.join("boss").send("worker", "poison")
        assert jobs.join("worker", replica="a").wait(timeout=1).kind == "message"
        time.sleep(0.15)
        assert other.channel("anime-project-2").join("worker", replica="b").wait(0.3).messages == []
        assert len(jobs.dead_letters()) == 1
    finally:
        other.close()
        bus.close()


@pytest.fixture
def bus_redis(tmp_path: Path) -> Iterator[str]:
    """A plain Redis on a free loopback port for the bus; yields its URL."""
    with run_redis(None, tmp_path) as port:
        yield f"redis://127.0.0.1:{port}/0"


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
def test_prometheus_scrapes_bus_metrics_and_every_query_returns_data(
    tmp_path: Path, bus_redis: str
) -> None:
    # given a bus with a known backlog, the real exporter reading it (watchdog at 0.5 s),
    # and two agent hosts serving client metrics
    seed_backlog(bus_redis)
    registries = {h: CollectorRegistry() for h in ("host-a", "host-b")}
    metrics = {h: BusMetrics(r, host=h) for h, r in registries.items()}
    servers = [serve_metrics(0, "127.0.0.1", r)[0] for r in registries.values()]
    stop = threading.Event()
    thread = threading.Thread(target=traffic, args=(metrics, stop), daemon=True)
    thread.start()
    with run_exporter(bus_redis, "--interval-s", "0.5", "--stale-s", "0.5") as exporter:
        url, stop_prometheus = start_prometheus(
            tmp_path,
            {
                "redisbus-agents": [f"127.0.0.1:{s.server_port}" for s in servers],
                "redisbus-exporter": [exporter],
            },
            rule_files=[ALERTS],
        )
        try:
            check_every_query(url)
        finally:
            stop.set()
            thread.join(timeout=5)
            stop_prometheus()
            for s in servers:
                s.shutdown()
                s.server_close()


def check_every_query(url: str) -> None:
    """Dashboard queries, fleet values, latency per host and in aggregate, alert rules."""
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

    # and Prometheus holds the exporter's reading of the seeded backlog
    fleet = {
        name: float(query(url, f"max({name})")[0]["value"][1])
        for name in (
            "redisbus_channels",
            "redisbus_unread_messages",
            "redisbus_pending_messages",
            "redisbus_dead_letters",
        )
    }
    assert fleet == {
        "redisbus_channels": 2,
        "redisbus_unread_messages": 2,
        "redisbus_pending_messages": 3,
        "redisbus_dead_letters": 1,
    }
    # the watchdog (0.5 s here) sees the two unread messages as stale
    stale = "max(redisbus_watchdog_stale_unread_messages)"
    assert float(wait_for_data(url, f"{stale} == 2")[0]["value"][1]) == 2
    top = "redisbus_channel_unread_messages"
    per_channel = {r["metric"]["channel"]: float(r["value"][1]) for r in query(url, top)}
    assert per_channel == {"anime-project-1": 2, "anime-project-2": 0}

    # and every alert expression is accepted and evaluates without error
    for _, expr in alert_queries():
        query(url, expr)
    # the backlog is seconds old, far below the alert's 60 s: the stale alert stays
    # inactive (promtool's unit tests make it fire), and so does exporter-down
    expected = {
        "RedisbusStaleUnread": {"inactive"},
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
    try:
        with run_exporter(bus_redis, "--interval-s", "0.5") as exporter:
            url, stop_prometheus = start_prometheus(
                tmp_path,
                {
                    "redisbus-agents": [f"127.0.0.1:{p}" for p in ports.values()],
                    "redisbus-exporter": [exporter],
                },
                rule_files=[ALERTS],
            )
            try:
                check_two_hosts(url, procs)
            finally:
                stop_prometheus()
    finally:
        for p in procs.values():
            p.terminate()
        codes = {host: p.wait(timeout=30) for host, p in procs.items()}
    # and SIGTERM stops an agent host cleanly
    assert codes == {"host-a": 0, "host-b": 0}


def check_two_hosts(url: str, procs: dict[str, subprocess.Popen[str]]) -> None:
    """Both hosts' latencies told apart and aggregated; the exporter sees their channel."""
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

    # and the exporter reads the hosts' shared channel and their agents
    assert float(query(url, "max(redisbus_channels)")[0]["value"][1]) == 1
    agents = "sum(redisbus_agents)"
    assert float(wait_for_data(url, f"{agents} >= 4")[0]["value"][1]) >= 4
