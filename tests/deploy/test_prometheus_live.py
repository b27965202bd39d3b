"""A real Prometheus scraping live metrics: every dashboard query returns data, every alert
expression gives the answer the live state calls for, the Redis-down alert fires when Redis
stops and resolves when it returns, and delivery latency is seen per host and for the whole
fleet.

The fleet gauges come from the real `redisbus exporter` (``python -m redisbus.exporter`` in a
subprocess) reading a real Redis; the client metrics come from real buses doing real sends,
fetches, refusals, redeliveries and dead-lettering (the bus measures every number itself), and
from two ``deploy/agent_host.py`` processes.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
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
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from redisbus import Bus, BusSettings, RedisbusError
from redisbus.metrics import BusMetrics, serve_metrics
from tests.deploy.test_deploy_restart import OLD_DEFAULT_USER, ShippedRedis
from tests.support.deploy_support import DEPLOY, LATENCY_BUCKET, run_redis
from tests.support.prometheus_fixture import (
    ALERTS,
    alert_queries,
    alerts,
    dashboard_queries,
    free_port,
    query,
    quick_rules,
    require_tool,
    rule_states,
    start_prometheus,
    wait_for_data,
    wait_until,
)
from tests.support.servers import start_server

FAST: dict[str, Any] = {"pair_rate_burst": 1e6, "pair_rate_per_s": 1e6, "sender_rate_burst": 0}
RUNBOOK = "https://redisbus.readthedocs.io/en/latest/runbook/#"


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
    """A bus with a known backlog: 4 unread and 3 pending messages, 1 dead letter, 2 channels.

    The writer's bus fetches three messages and returns one; once it is closed (its replicas'
    leases released), nobody holds the other two: with the editor's two, four are unread."""
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


class Traffic:
    """Real traffic on a bus of its own, from two "hosts" (two buses, each recording into its
    own registry): host-a's reader fetches each message as soon as it is sent, host-b's only
    every ``b_every_s``; every send also tries a full inbox (refused, ``inbox_full``), and a
    second thread keeps a job whose handler never finishes going round the lease until it is
    redelivered, then dead-lettered. Every latency and counter is the bus's own measurement."""

    def __init__(self, redis_url: str, b_every_s: float = 2.0) -> None:
        self.registries = {h: CollectorRegistry() for h in ("host-a", "host-b")}
        self.buses = {
            h: Bus.from_url(
                redis_url,
                settings=BusSettings(host=h, replica=f"{h}/1"),
                metrics=BusMetrics(r, host=h),
            )
            for h, r in self.registries.items()
        }
        self.b_every_s = b_every_s
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._guard, args=(fn,), daemon=True)
            for fn in (self._talk, self._leases)
        ]

    def start(self) -> Traffic:
        for t in self._threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=10)
        for bus in self.buses.values():
            bus.close()
        assert not self.errors, self.errors

    def _guard(self, fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as e:  # reported by close(), in the test's thread
            self.errors.append(e)

    def _talk(self) -> None:
        a, b = self.buses["host-a"], self.buses["host-b"]
        talk = a.channel("talk", routing="open", **FAST)
        sender, a_reader = talk.join("sender"), talk.join("a-reader")
        b_reader = b.channel("talk").join("b-reader")
        caps = a.channel("caps", routing="open", inbox_cap=1, **FAST)
        caps.join("full")  # never reads
        caps_sender = caps.join("chatty")
        b_caps_sender = b.channel("caps").join("b-chatty")
        caps_sender.send("full", "fills the inbox")
        rng = random.Random(7)
        next_b = time.monotonic() + self.b_every_s
        deadline = time.monotonic() + 90
        while not self.stop.is_set() and time.monotonic() < deadline:
            kind = rng.choice(["message", "request", "status_update"])
            sender.send("a-reader", "now", type=kind)
            got = a_reader.wait(timeout=0)
            a_reader.mark_done(got.messages)
            sender.send("b-reader", "later", type=kind)
            if time.monotonic() >= next_b:
                for _ in range(10):
                    got = b_reader.wait(timeout=0)
                    if not got.messages:
                        break
                    b_reader.mark_done(got.messages)
                next_b = time.monotonic() + self.b_every_s
            for s in (caps_sender, b_caps_sender):
                # refused; the bus counts it as redisbus_send_rejected_total{reason="inbox_full"}
                with contextlib.suppress(RedisbusError):
                    s.send("full", "refused")
            self.stop.wait(0.05)

    def _leases(self) -> None:
        b = self.buses["host-b"]
        jobs = b.channel("jobs", routing="open", lease_s=0.1, max_deliveries=2, **FAST)
        boss = jobs.join("boss")
        deadline = time.monotonic() + 90
        for n in itertools.count():
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            # a fresh worker each time: the bus's breaker pauses deliveries to an agent
            # whose messages keep dying, which is not what this traffic is about
            name = f"worker-{n}"
            first = jobs.join(name, replica="w1")
            second = jobs.join(name, replica="w2")
            boss.send(name, "a handler that never finishes")
            assert first.wait(timeout=1).kind == "message"
            time.sleep(0.15)
            assert second.wait(timeout=0.3).kind == "message"  # reclaimed: a redelivery
            time.sleep(0.15)
            first.wait(timeout=0.3)  # past max_deliveries: dead-lettered
            self.stop.wait(0.5)


@pytest.mark.slow
def test_prometheus_scrapes_bus_metrics_and_every_query_returns_data(
    tmp_path: Path, bus_redis: str
) -> None:
    # given a bus with a known backlog, the real exporter reading it (watchdog at 0.5 s),
    # two hosts' real traffic on a second Redis serving client metrics, and an agent host
    # that is down; the rules are the committed ones with their `for` shortened to 1 s
    seed_backlog(bus_redis)
    with ExitStack() as stack:
        (tmp_path / "traffic").mkdir()
        traffic_port = stack.enter_context(run_redis(None, tmp_path / "traffic"))
        traffic = Traffic(f"redis://127.0.0.1:{traffic_port}/0").start()
        stack.callback(traffic.close)
        servers = [serve_metrics(0, "127.0.0.1", r)[0] for r in traffic.registries.values()]
        for srv in servers:
            stack.callback(srv.server_close)
            stack.callback(srv.shutdown)
        dead_host = f"127.0.0.1:{free_port()}"
        exporter = stack.enter_context(
            run_exporter(bus_redis, "--interval-s", "0.5", "--stale-s", "0.5")
        )
        # Redis near its memory limit: maxmemory a little above what it uses now
        import redis

        r = redis.Redis.from_url(bus_redis)
        used = int(r.info("memory")["used_memory"])
        r.config_set("maxmemory", str(int(used / 0.93)))
        r.close()
        url, stop_prometheus = start_prometheus(
            tmp_path,
            {
                "redisbus-agents": [f"127.0.0.1:{s.server_port}" for s in servers] + [dead_host],
                "redisbus-exporter": [exporter],
            },
            rule_files=[quick_rules(tmp_path)],
        )
        stack.callback(stop_prometheus)
        check_every_query(url)
        check_every_alert(url, dead_host)


def check_every_query(url: str) -> None:
    """Dashboard queries, fleet values, latency per host and in aggregate."""
    # when Prometheus has scraped a few times
    rate_expr = "sum by (host) (rate(redisbus_delivery_latency_seconds_count[1m])) > 0"
    deadline = time.monotonic() + 45
    while len(query(url, rate_expr)) < 2:
        assert time.monotonic() < deadline, "no delivery rate for both hosts"
        time.sleep(0.25)

    # then every dashboard panel query returns data
    for title, expr in dashboard_queries():
        assert wait_for_data(url, expr, timeout_s=20), title

    # and the latency the bus measured tells the prompt host from the one that fetches
    # every 2 s (whose messages wait 0 to 2 s, about 1 s at the median)
    p50 = f"histogram_quantile(0.5, sum by (le, host) (rate({LATENCY_BUCKET}[1m])))"

    def medians() -> dict[str, float]:
        return {r["metric"]["host"]: float(r["value"][1]) for r in query(url, p50)}

    # (host-b's first fetches are the lease thread's prompt ones: wait for its slow reader)
    wait_until(f"host-b's median above 0.4 s: {medians()}", lambda: medians()["host-b"] > 0.4)
    per_host = medians()
    assert per_host["host-a"] < 0.1 < 0.4 < per_host["host-b"] <= 2.5, per_host
    p99_all = f"histogram_quantile(0.99, sum by (le) (rate({LATENCY_BUCKET}[1m])))"
    (aggregate,) = query(url, p99_all)
    assert per_host["host-b"] < float(aggregate["value"][1]) <= 5.0

    # and Prometheus holds the exporter's reading of the seeded backlog
    fleet = {
        name: float(query(url, f"max({name})")[0]["value"][1])
        for name in (
            "redisbus_channels",
            "redisbus_unread_messages",
            "redisbus_pending_messages",
            "redisbus_dead_letters",
            "redisbus_exporter_redis_up",
        )
    }
    assert fleet == {
        "redisbus_channels": 2,
        "redisbus_unread_messages": 4,
        "redisbus_pending_messages": 3,
        "redisbus_dead_letters": 1,
        "redisbus_exporter_redis_up": 1,
    }
    # and the stream entry counts: added = held + removed (what the janitor trimmed), per kind
    entries = {
        (name, kind): float(query(url, f'max({name}{{stream="{kind}"}})')[0]["value"][1])
        for name in (
            "redisbus_stream_entries",
            "redisbus_stream_entries_added",
            "redisbus_stream_entries_removed",
        )
        for kind in ("channel", "dead_letter")
    }
    for kind in ("channel", "dead_letter"):
        held, added = (
            entries[("redisbus_stream_entries", kind)],
            entries[("redisbus_stream_entries_added", kind)],
        )
        assert added == held + entries[("redisbus_stream_entries_removed", kind)], entries
    assert entries[("redisbus_stream_entries", "dead_letter")] == 1
    # and the exporter's own figures: no channel left out, the janitors' count (the seeded
    # dead letter was made by a fetch, not a janitor), and its version beside the hosts'
    assert float(query(url, "max(redisbus_exporter_channels_skipped)")[0]["value"][1]) == 0
    janitor = "max(redisbus_janitor_dead_lettered_total)"
    assert float(query(url, janitor)[0]["value"][1]) == 0
    versions = query(url, "count by (job) (redisbus_build_info)")
    assert {r["metric"]["job"]: float(r["value"][1]) for r in versions} == {
        "redisbus-agents": 2,
        "redisbus-exporter": 1,
    }
    assert entries[("redisbus_stream_entries_added", "channel")] >= 6  # 3 + 2 + the poison
    # the watchdog (0.5 s here) sees the four unread messages as stale
    stale = "max(redisbus_watchdog_stale_unread_messages)"
    assert float(wait_for_data(url, f"{stale} == 4")[0]["value"][1]) == 4
    top = "redisbus_channel_unread_messages"
    per_channel = {r["metric"]["channel"]: float(r["value"][1]) for r in query(url, top)}
    assert per_channel == {"anime-project-1": 4, "anime-project-2": 0}


def check_every_alert(url: str, dead_host: str) -> None:
    """Each alert expression gives what the live state calls for, and exactly the alerts
    that should fire do, with their labels and annotations."""
    exprs = dict(alert_queries())

    def result(name: str) -> list[dict[str, object]]:
        return query(url, exprs[name])

    # the traffic refuses one send in two: the refusal alert's expression gives that share
    (refusals,) = result("RedisbusRefusalRateHigh")
    rejected = float(query(url, "sum(rate(redisbus_send_rejected_total[5m]))")[0]["value"][1])
    sent = float(query(url, "sum(rate(redisbus_messages_sent_total[5m]))")[0]["value"][1])
    share = float(refusals["value"][1])  # type: ignore[index]
    assert share == pytest.approx(rejected / (sent + rejected), rel=0.05)
    assert 0.3 < share < 0.6
    # the agent host that is down, and only it
    (down,) = result("RedisbusAgentHostDown")
    assert down["metric"] == {"__name__": "up", "job": "redisbus-agents", "instance": dead_host}
    # Redis at about 93% of its maxmemory
    (memory,) = result("RedisbusRedisMemoryNearLimit")
    assert 0.9 < float(memory["value"][1]) < 1.05  # type: ignore[index]
    # and nothing else: each quiet expression is quiet although its input series exist
    quiet = {
        "RedisbusStaleUnread": "max(redisbus_oldest_unread_age_seconds) < 60",
        "RedisbusDeadLettersGrowing": "max(redisbus_dead_letters) == 1",
        "RedisbusDeliveryLatencyP99High": f"sum(rate({LATENCY_BUCKET}[5m])) > 0",
        "RedisbusExporterDown": 'up{job="redisbus-exporter"} == 1',
        "RedisbusRedisDown": "redisbus_exporter_redis_up == 1",
        "RedisbusEvictionPolicyUnsafe": 'redisbus_redis_maxmemory_policy{policy="noeviction"}',
        "RedisbusSentButNotReceived": "sum(rate(redisbus_messages_received_total[5m])) > 0",
        "RedisbusStoredEntriesLost": 'redisbus_stream_entries_added{stream="channel"} > 0',
        "RedisbusExporterChannelsSkipped": "max(redisbus_exporter_channels_skipped) == 0",
    }
    assert set(quiet) | {"RedisbusRefusalRateHigh", "RedisbusAgentHostDown",
                         "RedisbusRedisMemoryNearLimit"} == set(exprs)  # fmt: skip
    for name, inputs in quiet.items():
        assert query(url, inputs), (name, inputs)
        assert result(name) == [], name

    # then Prometheus fires exactly those three, each with its runbook, once `for` has passed
    firing = {"RedisbusRefusalRateHigh", "RedisbusAgentHostDown", "RedisbusRedisMemoryNearLimit"}

    def settled() -> bool:
        states = rule_states(url)
        return len(states) == len(exprs) and all(
            health == "ok" and state == ("firing" if name in firing else "inactive")
            for name, (health, state) in states.items()
        )

    wait_until(f"only {sorted(firing)} firing: {rule_states(url)}", settled, timeout_s=30)
    active = {a["labels"]["alertname"]: a for a in alerts(url)}
    assert set(active) == firing
    assert active["RedisbusAgentHostDown"]["labels"] == {
        "alertname": "RedisbusAgentHostDown",
        "severity": "warning",
        "job": "redisbus-agents",
        "instance": dead_host,
    }
    assert active["RedisbusAgentHostDown"]["annotations"]["summary"] == (
        f"redisbus: agent host {dead_host} is not scraped"
    )
    for name, alert in active.items():
        assert alert["annotations"]["runbook_url"] == RUNBOOK + name.lower()


@pytest.mark.slow
def test_redis_down_alert_fires_when_redis_stops_and_resolves_when_it_returns(
    tmp_path: Path,
) -> None:
    # given a Redis, the exporter reading it every 0.2 s, and Prometheus scraping the
    # exporter every second with the committed rules (`for` shortened to 2 s)
    server = start_server("redis7", tmp_path / "redis")
    try:
        with run_exporter(server.url, "--interval-s", "0.2") as exporter:
            url, stop_prometheus = start_prometheus(
                tmp_path,
                {"redisbus-exporter": [exporter]},
                rule_files=[quick_rules(tmp_path, for_="2s")],
            )
            try:
                wait_for_data(url, "redisbus_exporter_redis_up == 1")
                wait_until(
                    "RedisbusRedisDown inactive",
                    lambda: rule_states(url).get("RedisbusRedisDown") == ("ok", "inactive"),
                )

                def redis_down() -> list[dict[str, Any]]:
                    return [
                        a
                        for a in alerts(url)
                        if a["labels"]["alertname"] == "RedisbusRedisDown"
                        and a["state"] == "firing"
                    ]

                # when Redis stops
                server.stop()
                # then the alert fires, naming the exporter, while the exporter stays up
                fired_s = wait_until("RedisbusRedisDown firing", lambda: bool(redis_down()))
                (alert,) = redis_down()
                assert alert["labels"] == {
                    "alertname": "RedisbusRedisDown",
                    "severity": "critical",
                    "job": "redisbus-exporter",
                    "instance": exporter,
                }
                assert alert["annotations"]["summary"] == (
                    f"redisbus: the exporter {exporter} cannot read Redis"
                )
                assert alert["annotations"]["runbook_url"] == RUNBOOK + "redisbusredisdown"
                assert float(query(url, "up")[0]["value"][1]) == 1
                assert rule_states(url)["RedisbusExporterDown"] == ("ok", "inactive")
                # when Redis returns on the same port
                server.start()
                # then the alert resolves
                resolved_s = wait_until("RedisbusRedisDown resolved", lambda: not redis_down())
                assert rule_states(url)["RedisbusRedisDown"] == ("ok", "inactive")
                assert query(url, "redisbus_exporter_redis_up == 1")
                print(f"RedisbusRedisDown fired {fired_s:.1f} s after Redis stopped, "
                      f"resolved {resolved_s:.1f} s after it returned")  # fmt: skip
            finally:
                stop_prometheus()
    finally:
        server.stop()


def stale_after(rules: Path, seconds: int) -> Path:
    """The rules with RedisbusStaleUnread's 60 s threshold lowered to ``seconds`` (and nothing
    else changed), so that a live test sees a stale message without waiting a minute."""
    text = rules.read_text()
    old = "redisbus_oldest_unread_age_seconds[1h])) > 60"
    assert text.count("redisbus_oldest_unread_age_seconds) > 60") == text.count(old) == 1
    text = text.replace(
        "redisbus_oldest_unread_age_seconds) > 60",
        f"redisbus_oldest_unread_age_seconds) > {seconds}",
    )
    rules.write_text(text.replace(old, old.replace("> 60", f"> {seconds}")))
    return rules


@pytest.mark.slow
def test_stale_unread_alert_holds_through_a_redis_outage(tmp_path: Path) -> None:
    # given a message nobody reads, on a Redis that keeps its data over a restart, the exporter
    # reading it every 0.2 s, and Prometheus with the committed rules (`for` 2 s, the stale
    # threshold 3 s instead of 60 s)
    server = start_server("redis7", tmp_path / "redis", persistent=True)
    bus = Bus.from_url(server.url, settings=BusSettings(metrics=False, host="seed"))
    try:
        ch = bus.channel("desk", **FAST)
        reader = ch.join("reader")
        ch.join("writer").send("reader", "read me")
        with run_exporter(server.url, "--interval-s", "0.2", "--no-janitor") as exporter:
            rules = stale_after(quick_rules(tmp_path, for_="2s"), 3)
            url, stop_prometheus = start_prometheus(
                tmp_path, {"redisbus-exporter": [exporter]}, rule_files=[rules]
            )
            try:

                def state(name: str) -> str:
                    return rule_states(url).get(name, ("", ""))[1]

                wait_until(
                    "RedisbusStaleUnread firing", lambda: state("RedisbusStaleUnread") == "firing"
                )
                # when Redis stops: the exporter serves no fleet gauge
                server.stop()
                wait_until(
                    "RedisbusRedisDown firing", lambda: state("RedisbusRedisDown") == "firing"
                )
                assert not query(url, "redisbus_oldest_unread_age_seconds")
                # then the stale-unread alert stays firing through the outage (it resolved 8 s
                # in before the hold), with the last reading as its value
                deadline = time.monotonic() + 12
                while time.monotonic() < deadline:
                    assert state("RedisbusStaleUnread") == "firing", rule_states(url)
                    time.sleep(0.5)
                # when Redis returns, the message still unread: still firing
                server.start()
                wait_until(
                    "RedisbusRedisDown resolved", lambda: state("RedisbusRedisDown") == "inactive"
                )
                wait_for_data(url, "redisbus_oldest_unread_age_seconds > 3")
                assert state("RedisbusStaleUnread") == "firing"
                # and once the message is read and done, it resolves
                assert [m.body for m in reader.read()] == ["read me"]  # kept over the restart
                wait_until(
                    "RedisbusStaleUnread resolved",
                    lambda: state("RedisbusStaleUnread") == "inactive",
                )
            finally:
                stop_prometheus()
    finally:
        bus.close()
        server.stop()


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


def loss_rules(tmp_path: Path, window: str = "10s") -> Path:
    """The committed rules with `for` at 1 s, and RedisbusSentButNotReceived's 5 minute rate
    windows at ``window``: a live test waits seconds, not minutes; `promtool test rules`
    covers the real durations."""
    path = quick_rules(tmp_path)
    doc = json.loads(path.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "RedisbusSentButNotReceived":
                assert rule["expr"].count("[5m]") == 2, rule["expr"]
                rule["expr"] = rule["expr"].replace("[5m]", f"[{window}]")
    path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    return path


class OneWaySender:
    """A sender on a bus recording into ``registry`` that sends every 0.1 s to an agent whose
    host never fetches; errors (a restart under way, a channel lost) are counted by type, not
    raised."""

    def __init__(self, url: str, registry: CollectorRegistry, host: str) -> None:
        settings = BusSettings(host=host, replica=f"{host}/1")
        self.bus = Bus.from_url(url, settings=settings, metrics=BusMetrics(registry, host=host))
        ch = self.bus.channel("team", routing="open", inbox_cap=10**6, **FAST)
        ch.join("receiver")  # its host is down: it never waits
        self.sender = ch.join("sender")
        self.errors: collections.Counter[str] = collections.Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                self.sender.send("receiver", "are you there?")
            except RedisbusError as e:
                self.errors[type(e).__name__] += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.bus.close()


@pytest.mark.slow
def test_a_restart_that_loses_the_aof_fires_the_loss_alerts(tmp_path: Path) -> None:
    # given two Redis 7 servers on the shipped redis.conf (AOF on), one with the ACL shipped
    # before the fix of docs/deployment.md#redis (default user off and without permissions), one
    # with the shipped ACL; on each a sender whose recipient's host never fetches; an exporter per
    # Redis, as the exporter user; Prometheus with the committed rules (`for` 1 s,
    # RedisbusSentButNotReceived over 10 s windows)
    binary = require_tool("redis-server")
    old = ShippedRedis(binary, tmp_path / "old", default_user=OLD_DEFAULT_USER).start()
    shipped = ShippedRedis(binary, tmp_path / "shipped").start()
    with ExitStack() as stack:
        for server in (old, shipped):
            stack.callback(server.stop)
        registry = CollectorRegistry()
        senders = [OneWaySender(s.url(), registry, "host-a") for s in (old, shipped)]
        for sender in senders:
            sender.thread.start()
            stack.callback(sender.close)
        metrics, _ = serve_metrics(0, "127.0.0.1", registry)
        stack.callback(metrics.server_close)
        stack.callback(metrics.shutdown)
        exporters = {
            name: stack.enter_context(
                run_exporter(s.url("exporter"), "--interval-s", "0.3", "--no-janitor")
            )
            for name, s in (("old", old), ("shipped", shipped))
        }
        url, stop_prometheus = start_prometheus(
            tmp_path,
            {
                "redisbus-agents": [f"127.0.0.1:{metrics.server_port}"],
                "redisbus-exporter": list(exporters.values()),
            },
            rule_files=[loss_rules(tmp_path)],
        )
        stack.callback(stop_prometheus)

        def firing(name: str) -> list[dict[str, Any]]:
            return [
                a
                for a in alerts(url)
                if a["labels"]["alertname"] == name and a["state"] == "firing"
            ]

        # then messages sent and none received fires, from the live client metrics
        wait_until(
            "RedisbusSentButNotReceived firing", lambda: bool(firing("RedisbusSentButNotReceived"))
        )
        (alert,) = firing("RedisbusSentButNotReceived")
        assert alert["labels"] == {
            "alertname": "RedisbusSentButNotReceived",
            "severity": "critical",
        }
        assert query(url, "sum(rate(redisbus_messages_sent_total[10s])) > 0")
        # and both exporters have read the channel streams, nothing lost yet
        added = 'redisbus_stream_entries_added{stream="channel"}'
        wait_until("both exporters read entries", lambda: len(query(url, f"{added} > 5")) == 2)
        assert rule_states(url)["RedisbusStoredEntriesLost"] == ("ok", "inactive")

        # when both Redis servers restart
        for server in (old, shipped):
            server.restart("sigterm")

        # then entries vanished without a trim under the old ACL, and only there
        wait_until(
            "RedisbusStoredEntriesLost firing",
            lambda: bool(firing("RedisbusStoredEntriesLost")),
            timeout_s=30,
        )
        (lost,) = firing("RedisbusStoredEntriesLost")
        assert lost["labels"] == {
            "alertname": "RedisbusStoredEntriesLost",
            "severity": "critical",
            "job": "redisbus-exporter",
            "instance": exporters["old"],
            "stream": "channel",
        }
        assert lost["annotations"]["runbook_url"] == RUNBOOK + "redisbusstoredentrieslost"
        assert old.critical_log_lines() and not shipped.critical_log_lines()
        # the shipped ACL kept every entry: its series never fell, and keeps growing
        time.sleep(2)
        assert [a["labels"]["instance"] for a in firing("RedisbusStoredEntriesLost")] == [
            exporters["old"]
        ]
        instance = exporters["shipped"]
        shipped_added = query(url, f'{added.rstrip("}")},instance="{instance}"}}')
        assert float(shipped_added[0]["value"][1]) > 5
        # under the old ACL the sender is refused, its channel gone; under the shipped one it
        # saw at most the restart itself
        assert senders[0].errors["UnknownAgent"] > 0, senders[0].errors
        assert set(senders[1].errors) <= {"BusConnectionError"}, senders[1].errors
