"""`redisbus exporter` on a real Redis: exact fleet gauges, Redis' memory and whether the last
read of Redis succeeded, /healthz (liveness) and /readyz (readiness), OpenMetrics and gzip on
/metrics, the watchdog (log line and webhook), the top-N and channel caps, the janitor thread,
and the `exporter` and `janitor` commands on the CLI's parser."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from redisbus import AsyncBus, Bus, BusSettings
from redisbus._commands import program
from redisbus._model import id_ms
from redisbus.exporter import Exporter, ExporterSettings
from redisbus.exporter import exporter as exporter_command
from redisbus.janitor import sweep_all
from redisbus.metrics import AGENT_STATUSES, FLEET_COUNTERS, FLEET_GAUGES
from tests.security import test_redis_acl
from tests.support import cluster_servers
from tests.support.deploy_support import DEPLOY, K8S, run_redis, yaml_docs
from tests.support.prometheus_fixture import free_port
from tests.support.servers import start_server, wait_for

FAST: dict[str, Any] = {
    "pair_rate_burst": 1e6,
    "pair_rate_per_s": 1e6,
    "sender_rate_burst": 0,
    "inbox_cap": 10**6,
}

# shared fixtures: a Redis running deploy/redis/users.acl; a three-shard Redis Cluster
acl_redis = test_redis_acl.acl_redis
redis_cluster = cluster_servers.redis_cluster

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def gauge(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def healthz(port: int) -> tuple[int, str]:
    return get(port, "/healthz")


def readyz(port: int) -> tuple[int, str]:
    return get(port, "/readyz")


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False, host="test-host"))
    yield b
    b.close()


@pytest.fixture
def exporter(redis_url: str) -> Iterator[Callable[..., Exporter]]:
    """Start exporters on free loopback ports against ``redis_url``; stopped afterwards."""
    started: list[Exporter] = []

    def start(**options: Any) -> Exporter:
        base: dict[str, Any] = {
            "url": redis_url,
            "exporter_port": 0,
            "exporter_addr": "127.0.0.1",
            "exporter_interval_s": 3600,  # tests call refresh() unless they say otherwise
            "janitor": False,
        }
        e = Exporter(ExporterSettings(**{**base, **options})).start()
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


class Webhook:
    """A local HTTP receiver that queues every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.received: queue.Queue[dict[str, Any]] = queue.Queue()
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.put(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def next(self, timeout: float = 10.0) -> dict[str, Any]:
        return self.received.get(timeout=timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_metrics_report_unread_pending_dead_letters_and_agents_exactly(
    bus: Bus, redis_url: str, exporter: Callable[..., Exporter]
) -> None:
    # given a team channel: writer read 2 of 3 messages and finished 1 of those; designer
    # has not fetched its message and has completed; director has a reply and an outcome
    alpha = bus.channel("alpha", **FAST)
    director = alpha.join("director")
    writer = alpha.join("writer", parent="director")
    designer = alpha.join("designer", parent="director")
    m1, m2, m3 = (director.send("writer", f"draft {i}") for i in range(3))
    d1 = director.send("designer", "sketch")
    director_unread = [writer.send("director", "question").id]
    got = writer.read(limit=2)
    assert [m.id for m in got] == [m1.id, m2.id]
    assert m1.id is not None
    writer.mark_done(m1.id)
    director_unread.append(designer.complete("sketched") or "")
    # and a channel whose only message was dead-lettered: delivered once, its lease ran out
    beta = bus.channel("beta", lease_s=0.1, max_deliveries=1, **FAST)
    boss = beta.join("boss")
    beta.join("worker")
    poison = boss.send("worker", "poison")
    other = Bus.from_url(redis_url, settings=BusSettings(metrics=False, replica="b"))
    try:
        replica_a = beta.join("worker", replica="a")
        replica_b = other.channel("beta").join("worker", replica="b")
        assert replica_a.wait(timeout=1).messages[0].id == poison.id
        time.sleep(0.15)
        assert replica_b.wait(timeout=0.3).kind == "timeout"  # reclaimed -> dead-lettered
        (dead,) = beta.dead_letters()
        assert dead.original_id == poison.id

        # when the exporter reads Redis
        e = exporter()
        snap = e.refresh()
        samples = scrape(e.port)
    finally:
        other.close()

    # then unread counts what is undone and not on hand: designer's d1 (queued), director's
    # reply and the outcome; writer's m3 is held by its live replica (fetched, not returned)
    assert snap is not None
    assert gauge(samples, "redisbus_unread_messages") == 1 + 2
    assert gauge(samples, "redisbus_channel_unread_messages", channel="alpha") == 3
    assert gauge(samples, "redisbus_channel_unread_messages", channel="beta") == 0
    # the oldest unread is d1, aged on the Redis clock of the read
    oldest_s = gauge(samples, "redisbus_oldest_unread_age_seconds")
    assert d1.id is not None and m3.id is not None and director_unread[0] is not None
    assert oldest_s == pytest.approx((snap.now_ms - id_ms(d1.id)) / 1000)
    assert id_ms(m3.id) <= id_ms(d1.id) <= id_ms(director_unread[0])
    # pending: writer's m2 (read, not done) and m3 (fetched); the dead letter was acknowledged
    assert gauge(samples, "redisbus_pending_messages") == 2
    assert gauge(samples, "redisbus_dead_letters") == len(beta.dead_letters()) == 1
    assert gauge(samples, "redisbus_channels") == 2
    assert gauge(samples, "redisbus_watchdog_stale_unread_messages") == 0
    # agents by status: every status present, the counts the channels' trees show
    statuses: Counter[str] = Counter(m.status for ch in (alpha, beta) for m in ch.tree())
    assert statuses["completed"] == 1
    for status in AGENT_STATUSES:
        assert gauge(samples, "redisbus_agents", status=status) == statuses[status], status
    # every fleet gauge and counter is there, and nothing else (no _created duplicate)
    assert {name for name, _ in samples} == set(FLEET_GAUGES) | set(FLEET_COUNTERS)
    assert 0 < gauge(samples, "redisbus_exporter_collect_duration_seconds") < 5


def test_unread_falls_to_zero_once_messages_are_read_and_done(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given two unread messages
    ch = bus.channel("team", **FAST)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "one")
    a.send("b", "two")
    e = exporter()
    assert gauge(scrape(e.port), "redisbus_unread_messages") == 2
    # when b reads them: read but undone is no longer unread, still pending
    msgs = b.read()
    e.refresh()
    samples = scrape(e.port)
    assert gauge(samples, "redisbus_unread_messages") == 0
    assert gauge(samples, "redisbus_oldest_unread_age_seconds") == 0
    assert gauge(samples, "redisbus_pending_messages") == 2
    # and once done, nothing is pending either
    b.mark_done(msgs)
    e.refresh()
    assert gauge(scrape(e.port), "redisbus_pending_messages") == 0


def test_a_message_wait_returned_is_not_unread_during_a_long_turn(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given a message that wait() returned (read at once, on the server)
    ch = bus.channel("waiters", **FAST)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "hello")
    assert b.wait(timeout=1).kind == "message"
    marks = bus.redis.hgetall(ch.keys.marks)
    assert [v[:1] for k, v in marks.items() if k != "\n#table"] == ["R"]  # (keep_table's)
    # when b's turn outlasts the watchdog threshold
    time.sleep(0.3)
    samples = scrape(exporter(watchdog_stale_s=0.1).port)
    # then it is pending on b's live replica, neither unread nor stale
    assert gauge(samples, "redisbus_unread_messages") == 0
    assert gauge(samples, "redisbus_watchdog_stale_unread_messages") == 0
    assert gauge(samples, "redisbus_pending_messages") == 1


def test_a_message_held_by_a_dead_replica_is_unread_and_goes_stale(
    bus: Bus, redis_url: str, exporter: Callable[..., Exporter]
) -> None:
    # given a replica, with a 0.2 s heartbeat lease, that fetched a message and died before
    # it could hand it over (the fetch, without the read mark wait() writes with it)
    ch = bus.channel("crashy", **FAST)
    sender = ch.join("sender")
    ch.join("worker")
    short = BusSettings(metrics=False, replica="w1", lease_s=0.2, agent_lease_s=0.2)
    doomed = Bus.from_url(redis_url, settings=short)
    worker = doomed.channel("crashy").join("worker")
    sent = sender.send("worker", "work")
    doomed.redis.xreadgroup("worker", worker.replica, {ch.keys.stream: ">"}, count=10)
    doomed.close()  # no more heartbeats
    time.sleep(0.3)
    # when the exporter reads, past the replica's deadline and the watchdog's 0.1 s
    e = exporter(watchdog_stale_s=0.1)
    samples = scrape(e.port)
    # then the message is unread and stale: nobody alive has it
    assert gauge(samples, "redisbus_unread_messages") == 1
    assert gauge(samples, "redisbus_watchdog_stale_unread_messages") == 1
    snap, _ = e.last()
    assert sent.id is not None
    assert snap is not None and snap.channels[0].oldest_unread_ms == id_ms(sent.id)


def test_agents_that_will_never_read_have_no_unread(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given a cancelled child with a message nobody will ever read
    ch = bus.channel("closing", **FAST)
    lead = ch.join("lead")
    child = ch.join("child", parent="lead")
    lead.send("child", "never read")
    lead.cancel("child", reason="changed plan")
    assert {m.name: m.status for m in ch.tree()}["child"] == "cancelled"
    counts = ch.counts()
    assert counts["child"] == 2  # the message and the control message announcing the cancel
    assert counts["lead"] == 1  # the child's outcome
    # then the child counts as cancelled, not as a backlog; lead's outcome is unread
    samples = scrape(exporter().port)
    assert gauge(samples, "redisbus_agents", status="cancelled") == 1
    assert gauge(samples, "redisbus_unread_messages") == 1
    assert child.name == "child"


def test_only_the_top_n_channels_get_their_own_series(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given five channels with 1..5 unread messages
    for n in range(1, 6):
        ch = bus.channel(f"ch-{n}", **FAST)
        a = ch.join("a")
        ch.join("b")
        for _ in range(n):
            a.send("b", "x")
    # when the exporter keeps the top 2
    samples = scrape(exporter(exporter_top_n=2).port)
    # then the two busiest channels have a series, and the totals count all five
    per_channel = {
        dict(labels)["channel"]: v
        for (name, labels), v in samples.items()
        if name == "redisbus_channel_unread_messages"
    }
    assert per_channel == {"ch-5": 5, "ch-4": 4}
    assert gauge(samples, "redisbus_unread_messages") == 15
    assert gauge(samples, "redisbus_channels") == 5


def test_channels_beyond_the_cap_are_left_out_and_logged(
    bus: Bus, exporter: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    # given three channels with one unread message each
    for name in ("c-a", "c-b", "c-c"):
        ch = bus.channel(name, **FAST)
        ch.join("x").send(ch.join("y").name, "hi")
    # when the exporter may read only two per pass
    with caplog.at_level(logging.WARNING, logger="redisbus.exporter"):
        samples = scrape(exporter(exporter_max_channels=2).port)
    # then it reads the first two by name, says so, and still counts every channel
    assert gauge(samples, "redisbus_channels") == 3
    assert gauge(samples, "redisbus_unread_messages") == 2
    assert gauge(samples, "redisbus_exporter_channels_skipped") == 1
    assert any("reading the first 2" in r.getMessage() for r in caplog.records)


def test_watchdog_logs_and_posts_each_stale_agent_once_and_its_recovery(
    bus: Bus, exporter: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    hook = Webhook()
    try:
        # given an exporter reading every 50 ms with a 0.3 s threshold
        e = exporter(exporter_interval_s=0.05, watchdog_stale_s=0.3, watchdog_webhook_url=hook.url)
        ch = bus.channel("slow", **FAST)
        a, b = ch.join("a"), ch.join("b")
        caplog.set_level(logging.INFO, logger="redisbus.exporter")
        # when a message to b stays unread past the threshold
        sent = a.send("b", "anyone there?")
        event = hook.next()
        # then one webhook event and one log line name the channel and agent
        assert {k: event[k] for k in ("state", "channel", "agent", "stale_unread")} == {
            "state": "stale",
            "channel": "slow",
            "agent": "b",
            "stale_unread": 1,
        }
        assert event["threshold_s"] == 0.3 and event["oldest_unread_age_s"] >= 0.3
        assert gauge(scrape(e.port), "redisbus_watchdog_stale_unread_messages") == 1
        time.sleep(0.3)  # several more passes: still stale, no repeated event or line
        assert hook.received.empty()
        stale_lines = [r for r in caplog.records if "older than" in r.getMessage()]
        assert len(stale_lines) == 1 and "'slow'" in stale_lines[0].getMessage()
        # when b reads it, the watchdog reports the recovery once
        assert [m.id for m in b.read()] == [sent.id]
        assert hook.next()["state"] == "recovered"
        assert wait_for(
            lambda: gauge(scrape(e.port), "redisbus_watchdog_stale_unread_messages") == 0
        )
    finally:
        hook.close()


def test_a_failing_webhook_is_logged_and_the_exporter_keeps_serving(
    bus: Bus, exporter: Callable[..., Exporter], caplog: pytest.LogCaptureFixture
) -> None:
    # given a webhook URL nobody listens on
    dead_url = f"http://127.0.0.1:{free_port()}/hook"
    ch = bus.channel("quiet", **FAST)
    ch.join("a").send(ch.join("b").name, "x")
    caplog.set_level(logging.WARNING, logger="redisbus.exporter")
    time.sleep(0.25)
    # when the watchdog fires
    e = exporter(exporter_interval_s=0.05, watchdog_stale_s=0.2, watchdog_webhook_url=dead_url)
    # then the failure is logged and the exporter still answers
    assert wait_for(
        lambda: any("webhook POST failed" in r.getMessage() for r in caplog.records), timeout=10
    )
    assert gauge(scrape(e.port), "redisbus_watchdog_stale_unread_messages") == 1
    assert healthz(e.port)[0] == 200


def test_redis_up_and_readyz_follow_redis_while_healthz_stays_up(
    tmp_path: Path, exporter: Callable[..., Exporter]
) -> None:
    # given an exporter on a Redis of its own
    server = start_server("redis7", tmp_path)
    try:
        e = exporter(url=server.url)
        assert healthz(e.port) == (200, "ok\n")
        assert readyz(e.port) == (200, "ok\n")
        samples = scrape(e.port)
        assert gauge(samples, "redisbus_exporter_redis_up") == 1
        assert gauge(samples, "redisbus_channels") == 0
        # when that Redis stops
        server.stop()
        assert e.refresh() is None
        # then Redis is reported down, and no stale numbers are served (the version stays)
        samples = scrape(e.port)
        assert {name for name, _ in samples} == {
            "redisbus_exporter_redis_up",
            "redisbus_exporter_collect_duration_seconds",
            "redisbus_build_info",
        }
        assert gauge(samples, "redisbus_exporter_redis_up") == 0
        # and the exporter is not ready, but alive: a restart would not bring Redis back
        status, text = readyz(e.port)
        assert status == 503 and text.startswith("redis: ConnectionError")
        assert healthz(e.port) == (200, "ok\n")
        # when Redis returns on the same port
        server.start()
        assert e.refresh() is not None
        # then the gauges are back
        samples = scrape(e.port)
        assert gauge(samples, "redisbus_exporter_redis_up") == 1
        assert gauge(samples, "redisbus_channels") == 0
        assert readyz(e.port)[0] == 200
    finally:
        server.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_healthz_fails_when_the_reader_thread_has_died(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given an exporter whose read loop dies (a bug we do not know of yet)
    e = exporter(exporter_interval_s=0.01)
    assert healthz(e.port) == (200, "ok\n")

    def broken() -> None:
        raise SystemExit("reader gone")

    e.refresh = broken  # type: ignore[method-assign]
    # then liveness says so, so that the orchestrator restarts the process
    assert wait_for(lambda: healthz(e.port)[0] == 503, timeout=10)
    assert healthz(e.port)[1] == "the reader thread has stopped\n"


def test_memory_gauges_and_eviction_policy_come_from_info_memory(
    tmp_path: Path, exporter: Callable[..., Exporter]
) -> None:
    # given a Redis with a memory limit and a policy that may evict
    server = start_server(
        "redis7", tmp_path, ["--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"]
    )
    try:
        info = server.client().info("memory")
        # when the exporter reads it
        samples = scrape(exporter(url=server.url).port)
        # then it exports the limit, the usage and the policy, from INFO memory
        assert gauge(samples, "redisbus_redis_memory_max_bytes") == 64 * 1024 * 1024
        used = gauge(samples, "redisbus_redis_memory_used_bytes")
        assert 0.5 * info["used_memory"] < used < 2 * info["used_memory"]
        assert gauge(samples, "redisbus_redis_maxmemory_policy", policy="allkeys-lru") == 1
        assert [k for k in samples if k[0] == "redisbus_redis_maxmemory_policy"] == [
            ("redisbus_redis_maxmemory_policy", (("policy", "allkeys-lru"),))
        ]
    finally:
        server.stop()


@pytest.mark.parametrize("face", ["sync", "async"])
def test_the_bus_warns_about_an_evicting_policy_under_the_agent_acl_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, face: str
) -> None:
    # given Redis running deploy/redis/users.acl (no CONFIG for anyone) with allkeys-lru
    password = "agent-test-only"
    acl = tmp_path / "users.acl"
    subprocess.run(
        [
            "sh",
            str(DEPLOY / "redis" / "render-acl.sh"),
            str(DEPLOY / "redis" / "users.acl"),
            str(acl),
        ],
        env={**os.environ, "REDISBUS_AGENT_PASSWORD": password, "REDISBUS_EXPORTER_PASSWORD": "x"},
        check=True,
        timeout=30,
    )
    extra = ("--aclfile", str(acl), "--maxmemory-policy", "allkeys-lru")
    with run_redis(None, tmp_path, *extra) as port:
        settings = BusSettings(metrics=False, username="agent", password=password)
        url = f"redis://127.0.0.1:{port}/0"
        caplog.set_level(logging.WARNING, logger="redisbus")
        # when an agent host under the agent user opens a channel
        if face == "sync":
            with Bus.from_url(url, settings=settings) as bus:
                bus.channel("c")
        else:

            async def open_channel() -> None:
                async with AsyncBus.from_url(url, settings=settings) as bus:
                    await bus.channel("c")

            asyncio.run(open_channel())
    # then it warns, having read the policy from INFO memory (CONFIG GET is denied)
    warnings = [r.getMessage() for r in caplog.records if "maxmemory-policy" in r.getMessage()]
    assert len(warnings) == 1 and "'allkeys-lru'" in warnings[0], warnings


def test_metrics_speak_openmetrics_and_gzip_when_asked(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    e = exporter()
    url = f"http://127.0.0.1:{e.port}/metrics"
    # when a scraper asks for OpenMetrics, gzip-compressed (as Prometheus does)
    req = urllib.request.Request(
        url,
        headers={
            "Accept": "application/openmetrics-text; version=1.0.0",
            "Accept-Encoding": "gzip",
        },
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        content_type, encoding, body = (
            r.headers["Content-Type"],
            r.headers["Content-Encoding"],
            r.read(),
        )
    # then it gets both
    assert content_type.startswith("application/openmetrics-text")
    assert encoding == "gzip"
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n")
    assert "redisbus_exporter_redis_up 1.0" in text
    # and a plain scraper still gets the text format, uncompressed
    with urllib.request.urlopen(url, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert r.headers.get("Content-Encoding") is None
    assert get(e.port, "/nothing-here")[0] == 404


def test_the_janitor_thread_trims_what_every_agent_is_done_with(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given ten messages that every agent is done with
    ch = bus.channel("trim", **FAST)
    a, b = ch.join("a"), ch.join("b")
    for i in range(10):
        a.send("b", f"{i}")
    b.mark_done(b.read(limit=100))
    assert ch.length() == 10
    # when the exporter runs its janitor every 50 ms
    exporter(janitor=True, janitor_interval_s=0.05)
    # then the stream is trimmed
    assert wait_for(lambda: ch.length() == 0, timeout=10)


def test_command_line_serves_until_sigterm(redis_url: str, bus: Bus) -> None:
    # given `python -m redisbus.exporter` configured by REDISBUS_* variables and options
    ch = bus.channel("cli", **FAST)
    ch.join("a").send(ch.join("b").name, "x")
    port = free_port()
    env = {
        **os.environ,
        "REDISBUS_URL": redis_url,
        "REDISBUS_EXPORTER_PORT": str(port),
        "REDISBUS_EXPORTER_TOP_N": "1",
        "REDISBUS_WATCHDOG_STALE_S": "30",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "redisbus.exporter", "--addr", "127.0.0.1", "--no-janitor"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # then it answers on the port from the environment
        assert wait_for(lambda: _answers(port), timeout=20), proc.stdout
        samples = scrape(port)
        assert gauge(samples, "redisbus_unread_messages") == 1
        assert gauge(samples, "redisbus_channel_unread_messages", channel="cli") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    # and SIGTERM stops it cleanly
    assert proc.returncode == 0, out
    assert f"127.0.0.1:{port}" in out


def _answers(port: int) -> bool:
    try:
        return healthz(port)[0] == 200
    except (urllib.error.URLError, ConnectionError):
        return False


def exporter_cli(*argv: str) -> int:
    """``python -m redisbus.exporter ARGV...`` in this process: its exit status."""
    return program(exporter_command, "exporter", argv)


def test_command_line_refuses_without_redis_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REDISBUS_URL", raising=False)
    assert exporter_cli("--port", "0") == 3
    assert "REDISBUS_URL" in capsys.readouterr().err


def test_command_line_refuses_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert exporter_cli("--url", "redis://127.0.0.1:1/0", "--port", "70000") == 2
    assert "exporter_port" in capsys.readouterr().err


REDISBUS = Path(sys.executable).with_name("redisbus")


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    return subprocess.run(
        [str(REDISBUS), *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("command", ["exporter", "janitor"])
def test_daemon_commands_share_the_cli_help_and_environment_variables(command: str) -> None:
    # when the daemons' help is asked for
    p = run_cli(command, "--help")
    # then it is the CLI's own help (typer's style), naming each option's variable
    assert p.returncode == 0, p.stderr
    assert f"Usage: redisbus {command} [OPTIONS]" in p.stdout
    for variable in ("REDISBUS_URL", "REDISBUS_PREFIX", "REDISBUS_LOG_LEVEL"):
        assert variable in p.stdout, variable
    # and the top-level help lists them among the commands
    assert f" {command} " in run_cli("--help").stdout


@pytest.mark.parametrize("command", ["exporter", "janitor"])
def test_daemon_commands_without_redis_exit_3_with_one_line_on_stderr(command: str) -> None:
    p = run_cli(command)
    assert p.returncode == 3, p
    assert p.stdout == ""
    assert p.stderr.startswith("redisbus: set REDISBUS_URL") and p.stderr.count("\n") == 1


def test_janitor_reports_an_unreachable_redis_on_stderr_with_exit_3() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    p = run_cli("janitor", "--once", REDISBUS_URL=url, REDISBUS_RETRY_ATTEMPTS="0")
    assert p.returncode == 3, p
    assert p.stdout == ""
    assert "connection" in p.stderr and p.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["janitor", "--once", "--batch", "0"], "--batch"),
        (["janitor", "--interval-s", "abc"], "--interval-s"),
        (["exporter", "--port", "70000"], "exporter_port"),
        (["exporter", "--log-level", "LOUD"], "--log-level"),
    ],
)
def test_daemon_commands_refuse_bad_values_with_exit_2(args: list[str], where: str) -> None:
    p = run_cli(*args, REDISBUS_URL="redis://127.0.0.1:1/0")
    assert p.returncode == 2, p
    assert p.stdout == ""
    assert where in p.stderr


def test_janitor_command_sweeps_and_prints_its_report(redis_url: str, bus: Bus) -> None:
    # given ten messages every agent is done with
    ch = bus.channel("sweep-cli", **FAST)
    a, b = ch.join("a"), ch.join("b")
    for i in range(10):
        a.send("b", f"{i}")
    b.mark_done(b.read(limit=100))
    # when `redisbus janitor --once` runs, configured by the environment
    p = run_cli("janitor", "--once", REDISBUS_URL=redis_url)
    # then it trims them and says so on stdout
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("1 channels: 10 trimmed,")
    assert ch.length() == 0


def test_janitor_daemon_outlives_a_redis_outage(tmp_path: Path) -> None:
    # given `redisbus janitor` sweeping every 0.1 s a Redis of its own
    server = start_server("redis7", tmp_path)
    proc = subprocess.Popen(
        [str(REDISBUS), "janitor", "--interval-s", "0.1"],
        env={**os.environ, "REDISBUS_URL": server.url, "REDISBUS_RETRY_ATTEMPTS": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # type: ignore[arg-type]
    reader.start()

    def logged(text: str) -> bool:
        return any(text in line for line in list(lines))

    try:
        assert wait_for(lambda: logged("janitor: 0 channels"), timeout=30), lines
        # when Redis goes away for a while
        server.stop()
        assert wait_for(lambda: logged("pass failed"), timeout=30), lines
        time.sleep(0.5)
        assert proc.poll() is None, lines
        # and comes back, with messages every agent is done with
        server.start()
        bus = Bus.from_url(server.url, settings=BusSettings(metrics=False))
        try:
            ch = bus.channel("after-outage", **FAST)
            a, b = ch.join("a"), ch.join("b")
            for i in range(5):
                a.send("b", f"{i}")
            b.mark_done(b.read(limit=100))
            # then the janitor, still running, trims them
            assert wait_for(lambda: ch.length() == 0, timeout=20)
        finally:
            bus.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        reader.join(timeout=5)  # stderr is the reader's alone
        out = proc.stdout.read() if proc.stdout else ""
        server.stop()
    # and it stops cleanly on SIGTERM, having logged the outage once, on stderr
    assert proc.returncode == 0, lines
    assert out == ""
    assert sum("pass failed" in line for line in lines) == 1, lines
    assert logged("passes succeed again"), lines


def test_settings_read_every_variable_the_deploy_files_give_the_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given the exporter's environment in docker-compose.yml and the Kubernetes ConfigMap
    (compose,) = yaml_docs(DEPLOY / "docker-compose.yml")
    (configmap,) = [d for d in yaml_docs(K8S / "configmap.yaml") if d["kind"] == "ConfigMap"]
    for env in (compose["services"]["exporter"]["environment"], configmap["data"]):
        # then each variable is a setting of the exporter, and its value parses
        assert {k for k in env if k.startswith("REDISBUS_")} <= {
            f"REDISBUS_{name.upper()}" for name in ExporterSettings.model_fields
        }
        for key, value in env.items():
            if "${" not in str(value):  # secrets come from the operator's .env
                monkeypatch.setenv(key, str(value))
        s = ExporterSettings()
        assert (s.exporter_port, s.exporter_top_n, s.watchdog_stale_s) == (9120, 20, 60.0)
    # and the defaults are the ones docs/deployment.md and deploy/ assume
    d = ExporterSettings.model_fields
    assert (d["exporter_port"].default, d["watchdog_stale_s"].default) == (9120, 60.0)


def test_exporter_reads_under_the_read_only_acl_user_and_its_janitor_stands_down(
    acl_redis: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    # given a bus run by the agent user: two messages done (trimmable), two unread
    port, passwords = acl_redis["port"], acl_redis["passwords"]
    url = f"redis://127.0.0.1:{port}/0"
    agent_settings = BusSettings(metrics=False, username="agent", password=passwords["agent"])
    bus = Bus.from_url(url, settings=agent_settings)
    try:
        ch = bus.channel("team", **FAST)
        a, b = ch.join("a"), ch.join("b")
        ch.join("c")
        for name in ("b", "b", "c", "c"):
            a.send(name, "x")
        b.mark_done(b.read())
        # when the exporter runs as the deploy files run it: the `exporter` user
        caplog.set_level(logging.WARNING, logger="redisbus.exporter")
        settings = ExporterSettings(
            url=url,
            username="exporter",
            password=passwords["exporter"],
            exporter_port=0,
            exporter_addr="127.0.0.1",
            exporter_interval_s=3600,
            janitor=True,
            janitor_interval_s=0.05,
        )
        with Exporter(settings) as e:
            samples = scrape(e.port)
            # then it reads every number with read-only commands
            assert gauge(samples, "redisbus_unread_messages") == 2
            assert gauge(samples, "redisbus_channels") == 1
            assert healthz(e.port)[0] == 200
            # and the janitor, which must write, says so once and stops
            assert wait_for(
                lambda: any("janitor stopped" in r.getMessage() for r in caplog.records)
            )
        assert ch.length() == 4  # nothing was trimmed under the read-only user...
        assert sweep_all(bus).trimmed == 2  # ...while the agent user trims b's two
    finally:
        bus.close()


def test_exporter_reads_channels_on_every_shard_of_a_cluster(
    redis_cluster: cluster_servers.Cluster,
) -> None:
    # given one channel on each primary of a Redis Cluster, with 1, 2, 3 unread messages
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    url = redis_cluster.url
    bus = Bus.from_url(url, cluster=True, settings=BusSettings(metrics=False))
    try:
        names = [redis_cluster.channel_on(p) for p in redis_cluster.primaries()]
        for n, name in enumerate(names, start=1):
            ch = bus.channel(name, **FAST)
            a = ch.join("a")
            ch.join("b")
            for _ in range(n):
                a.send("b", "x")
        # when an exporter reads the cluster from one node's URL
        settings = ExporterSettings(
            url=url, cluster=True, exporter_port=0, exporter_addr="127.0.0.1", janitor=False
        )
        with Exporter(settings) as e:
            samples = scrape(e.port)
        # then every shard's channel is counted
        assert len(names) == 3
        assert gauge(samples, "redisbus_channels") == 3
        assert gauge(samples, "redisbus_unread_messages") == 1 + 2 + 3
        for n, name in enumerate(names, start=1):
            assert gauge(samples, "redisbus_channel_unread_messages", channel=name) == n
        # and Redis' memory is that of one node (INFO answers per node on a Cluster)
        assert gauge(samples, "redisbus_exporter_redis_up") == 1
        nodes = [redis_cluster.node_client(p) for p in redis_cluster.primaries()]
        used = [int(c.info("memory")["used_memory"]) for c in nodes]
        assert 0.5 * min(used) < gauge(samples, "redisbus_redis_memory_used_bytes") < 2 * max(used)
        assert gauge(samples, "redisbus_redis_maxmemory_policy", policy="noeviction") == 1
    finally:
        bus.close()
