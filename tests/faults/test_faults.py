"""Faults are not deaths; statuses go one way; a cancel reaches every replica
(docs/delivery.md#faults-are-not-deaths).

An agent is lost only on evidence: silence while Redis was up and somebody could watch. Every
outage below (a restart with AOF, a frozen server, a Sentinel failover, a Cluster failover, an
OOM episode) lasts longer than ``agent_lease_s``: a judge that counted that time would declare
every agent lost the moment Redis came back. The children are processes of their own
(``tests.support.fault_workers``), so each one's own heartbeats are what gets judged.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redisbus import AgentClosed, Bus

pytest.register_assert_rewrite("tests.support.cluster_servers")

from tests.conftest import settings  # noqa: E402
from tests.support.cluster_servers import (  # noqa: E402
    SERVICE,
    Cluster,
    Sentinels,
    bus_on,
    start_cluster,
    start_sentinels,
)
from tests.support.servers import Server, start_server  # noqa: E402

pytest_plugins = ["tests.support.cluster_servers"]

HEARTBEAT_S, LEASE_S = 0.2, 1.0
FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}
LIVE = {"heartbeat_s": HEARTBEAT_S, "agent_lease_s": LEASE_S}
OUTAGE_S = 2.5 * LEASE_S  # the point: longer than the lease
FAILOVER_MS = 2000  # Sentinel down-after, Cluster node timeout: longer than the lease
SLACK_S = 1.0  # a loaded test machine: a few heartbeats, a process scheduled late
OPEN = {"running", "waiting", "idle"}


# -- agent processes -----------------------------------------------------------------------------


class Worker:
    """One ``tests.support.fault_workers`` process; what it says arrives on a queue."""

    def __init__(
        self, url: str, channel: str, name: str, parent: str, *, face: str, mode: str, **kw: Any
    ) -> None:
        replica = kw.pop("replica", f"{name}/proc")
        env = {**os.environ, **kw.pop("env", {})}
        self.name = name
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.fault_workers",
                url,
                channel,
                name,
                parent,
                replica,
                face,
                mode,
                str(HEARTBEAT_S),
                str(LEASE_S),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.said: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def next(self, timeout: float) -> dict[str, Any]:
        try:
            event = self.events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name} said nothing within {timeout} s") from None
        self.said.append(event)
        return event

    def ready(self) -> None:
        assert self.next(30)["ready"] == self.name

    def everything(self) -> list[dict[str, Any]]:
        """All it said so far."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.said.append(self.events.get_nowait())
        return self.said

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: no goodbye, its leases stay behind."""
        self.proc.kill()
        self.proc.wait(10)

    def cancelled(self) -> bool:
        return any(e.get("kind") == "cancelled" for e in self.everything())


@pytest.fixture
def spawn() -> Iterator[Callable[..., Worker]]:
    """spawn(url, channel, name, parent, face=, mode=) -> a ready Worker, killed at the end."""
    made: list[Worker] = []

    def start(*args: Any, ready: bool = True, **kw: Any) -> Worker:
        w = Worker(*args, **kw)
        made.append(w)
        if ready:
            w.ready()
        return w

    yield start
    for w in made:
        if w.proc.poll() is None:
            w.kill()


# -- a parent and two children in processes of their own ------------------------------------


class Team:
    """The parent ``lead`` here; ``kid-a`` and ``kid-b`` in worker processes."""

    def __init__(self, url: str, channel: str, spawn: Callable[..., Worker], cluster: bool = False):
        self.bus = Bus.from_url(url, cluster=cluster, settings=settings(**LIVE))
        self.ch = self.bus.channel(channel, routing="family", **FAST)
        self.lead = self.ch.join("lead")
        env = {"REDISBUS_CLUSTER": "true"} if cluster else {}
        kids = [
            spawn(url, channel, n, "lead", face="sync", mode="echo", env=env, ready=False)
            for n in ("kid-a", "kid-b")
        ]
        for k in kids:
            k.ready()
        self.kids = {k.name: k for k in kids}
        self.got: list[Any] = []  # everything the parent received

    def listen(self, seconds: float, until: Callable[[], bool] = lambda: False) -> None:
        """The parent waits for ``seconds`` (or until ``until()``), keeping what arrives."""
        deadline = time.monotonic() + seconds
        while not until() and (left := deadline - time.monotonic()) > 0:
            self.got += self.lead.wait(timeout=left).messages

    def outcomes(self) -> list[tuple[str, str]]:
        return [(m.sender, m.subject) for m in self.got if m.type == "outcome"]

    def statuses(self) -> dict[str, str]:
        return {m.name: m.status for m in self.ch.tree()}

    def round_trip(self, tag: str) -> None:
        """Messages still flow: each child answers the parent."""
        for k in self.kids:
            if self.kids[k].proc.poll() is None:
                self.lead.send(k, f"{tag} {k}")
        want = {f"echo {tag} {k}" for k in self.kids if self.kids[k].proc.poll() is None}
        self.listen(15, until=lambda: want <= {m.body for m in self.got})
        assert want <= {m.body for m in self.got}, f"no answers to {tag}: {self.got}"

    def close(self) -> None:
        self.bus.close()


@pytest.fixture
def team_on(spawn: Callable[..., Worker]) -> Iterator[Callable[..., Team]]:
    teams: list[Team] = []

    def make(url: str, channel: str, cluster: bool = False) -> Team:
        t = Team(url, channel, spawn, cluster)
        teams.append(t)
        return t

    yield make
    for t in teams:
        t.close()


def assert_nobody_lost(team: Team) -> None:
    """After an outage: a lease and more of watched time, then no outcome, every status open,
    no child cancelled, and messages flowing."""
    team.listen(LEASE_S + SLACK_S)
    team.round_trip("after")
    assert team.outcomes() == [], "a live agent was reported ended"
    statuses = team.statuses()
    assert set(statuses.values()) <= OPEN, statuses
    assert not any(k.cancelled() for k in team.kids.values()), [
        k.everything() for k in team.kids.values()
    ]


def outage(stop: Callable[[], object], resume: Callable[[], object]) -> float:
    """Stop Redis, wait OUTAGE_S, bring it back; returns how long it was away."""
    t0 = time.monotonic()
    stop()
    time.sleep(OUTAGE_S)
    resume()
    return time.monotonic() - t0


def frozen(server: Server) -> tuple[Callable[[], None], Callable[[], None]]:
    assert server.proc is not None
    process = server.proc.process
    return (
        lambda: process.send_signal(signal.SIGSTOP),
        lambda: process.send_signal(signal.SIGCONT),
    )


# -- outages longer than the lease declare no live agent lost --------------------------------


def test_redis_restart_with_aof_longer_than_the_lease_declares_nobody_lost(
    tmp_path: Path, team_on: Callable[..., Team]
) -> None:
    server = start_server("redis7", tmp_path, ["--appendfsync", "always"], persistent=True)
    try:
        # given a parent and two children, each beating in its own process
        team = team_on(server.url, "restart")
        team.round_trip("before")
        # when Redis shuts down and comes back with its AOF after more than a lease
        away = outage(server.stop, server.start)
        assert away > LEASE_S
        # then nobody was lost or cancelled, and messages flow again
        assert_nobody_lost(team)
    finally:
        server.stop()


def test_frozen_redis_longer_than_the_lease_declares_nobody_lost(
    redis7: Server, team_on: Callable[..., Team]
) -> None:
    redis7.client().flushall()
    team = team_on(redis7.url, "frozen")
    team.round_trip("before")
    # when redis-server is SIGSTOPped for more than a lease, then SIGCONTinued
    away = outage(*frozen(redis7))
    assert away > LEASE_S
    assert_nobody_lost(team)


def test_oom_episode_longer_than_the_lease_declares_nobody_lost(
    redis7: Server, team_on: Callable[..., Team]
) -> None:
    redis7.client().flushall()
    team = team_on(redis7.url, "oom")
    team.round_trip("before")
    admin = redis7.client()

    def full() -> None:
        admin.config_set("maxmemory", 1)  # far below what is used: every beat is refused
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            admin.set("probe", "x")

    try:
        # when Redis refuses every write for more than a lease, then has room again
        away = outage(full, lambda: admin.config_set("maxmemory", 0))
        assert away > LEASE_S
    finally:
        admin.config_set("maxmemory", 0)
    assert_nobody_lost(team)


@pytest.fixture(scope="module")
def slow_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sentinels]:
    """The failover fixture's Sentinel set, deciding "down" only after more than a lease."""
    s = start_sentinels(tmp_path_factory.mktemp("fault-sentinel"))
    for p in s.sentinel_ports:
        s.sentinel(p).execute_command(
            "SENTINEL SET", SERVICE, "down-after-milliseconds", str(FAILOVER_MS)
        )
    yield s
    s.stop()


def test_sentinel_failover_longer_than_the_lease_declares_nobody_lost(
    slow_sentinels: Sentinels, team_on: Callable[..., Team]
) -> None:
    slow_sentinels.wait_healthy()
    slow_sentinels.client().flushall()
    team = team_on(slow_sentinels.url, "sentinel")
    team.round_trip("before")
    # when the primary is SIGKILLed and the Sentinels promote its replica
    t0 = time.monotonic()
    old, _new = slow_sentinels.fail_primary()
    away = time.monotonic() - t0
    assert away > LEASE_S
    slow_sentinels.restart(old)  # back as a replica, for the next test
    assert_nobody_lost(team)


@pytest.fixture(scope="module")
def slow_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The failover fixture's Cluster, failing a node only after more than a lease."""
    c = start_cluster(tmp_path_factory.mktemp("fault-cluster"))
    for p in c.nodes:
        c.node_client(p).config_set("cluster-node-timeout", FAILOVER_MS)
    yield c
    c.stop()


def test_cluster_failover_longer_than_the_lease_declares_nobody_lost(
    slow_cluster: Cluster, team_on: Callable[..., Team]
) -> None:
    slow_cluster.wait_healthy()
    slow_cluster.flush()
    primary, other = slow_cluster.primaries()[:2]
    channel = slow_cluster.channel_on(primary)
    team = team_on(f"redis://127.0.0.1:{other}/0", channel, cluster=True)
    team.round_trip("before")
    # when the primary holding the channel is SIGKILLed and its replica takes over
    t0 = time.monotonic()
    slow_cluster.fail_primary(primary)
    away = time.monotonic() - t0
    assert away > LEASE_S
    slow_cluster.restart(primary)
    assert_nobody_lost(team)


# -- an agent that died is still found -------------------------------------------------------


@pytest.mark.parametrize("killed", ["before", "during"])
def test_child_killed_around_an_outage_is_reported_lost_once_within_a_lease(
    redis7: Server, team_on: Callable[..., Team], killed: str
) -> None:
    redis7.client().flushall()
    team = team_on(redis7.url, "died")
    team.round_trip("before")
    stop, resume = frozen(redis7)
    # given kid-a SIGKILLed just before Redis freezes, or while it is frozen
    if killed == "before":
        team.kids["kid-a"].kill()
    stop()
    time.sleep(OUTAGE_S / 2)
    if killed == "during":
        team.kids["kid-a"].kill()
    time.sleep(OUTAGE_S / 2)
    # when Redis comes back
    resume()
    t0 = time.monotonic()
    # then the parent hears that kid-a is lost within about a lease
    team.listen(LEASE_S + SLACK_S + 2, until=lambda: bool(team.outcomes()))
    took = time.monotonic() - t0
    assert team.outcomes() == [("kid-a", "lost")]
    assert took < LEASE_S + SLACK_S, f"lost reported {took:.2f} s after recovery"
    # and only once, while kid-b lives on
    team.listen(LEASE_S + SLACK_S)
    team.round_trip("after")
    assert team.outcomes() == [("kid-a", "lost")]
    statuses = team.statuses()
    assert statuses["kid-a"] == "lost"
    assert statuses["kid-b"] in OPEN and statuses["lead"] in OPEN, statuses
    assert not team.kids["kid-b"].cancelled()
    # and a lost agent stays lost: its name cannot join again
    with pytest.raises(AgentClosed):
        team.ch.join("kid-a", parent="lead")


def test_a_dead_child_is_found_when_the_only_watcher_always_beats_late(
    redis7: Server, spawn: Callable[..., Worker]
) -> None:
    """Every beat of the only live process comes late (its event loop blocked by synchronous
    calls, an LLM SDK say): each gap looks like blindness, but the heartbeat period of each
    still counts as watched, so the dead child is found (later than a lease, never never)."""
    import asyncio

    from redisbus import AsyncBus

    redis7.client().flushall()

    async def run() -> float | None:
        bus = AsyncBus.from_url(redis7.url, settings=settings(**LIVE))
        try:
            ch = await bus.channel("late", routing="family", **FAST)
            lead = await ch.join("lead")
            # started from a thread: the lead's loop keeps beating meanwhile (a worker can take
            # longer than a lease to start on a loaded machine; the kid would declare the
            # silent lead lost, rightly)
            kid = await asyncio.to_thread(
                spawn, redis7.url, "late", "kid", "lead", face="sync", mode="echo"
            )
            kid.kill()
            t0 = time.monotonic()
            while time.monotonic() - t0 < 10 * LEASE_S:
                time.sleep(2 * LIVE["heartbeat_s"])  # blocks the loop: the heart beats late
                res = await lead.wait(timeout=0.01)
                if any(m.subject == "lost" for m in res.messages):
                    return time.monotonic() - t0
            return None
        finally:
            await bus.aclose()

    took = asyncio.run(run())
    assert took is not None, "the dead child was never declared lost"
    assert took < 5 * LEASE_S


# -- one-way statuses --------------------------------------------------------------------------


def family_of(make_bus: Callable[..., Any], channel: str) -> tuple[Any, Any, Any]:
    """lead on one bus, child ``w`` on another (each beating on its own); returns (lead, w, the
    child's bus)."""
    lead = make_bus(**LIVE).channel(channel, routing="family", **FAST).join("lead")
    child_bus = make_bus(**LIVE)
    return lead, child_bus.channel(channel).join("w", parent="lead"), child_bus


def heard(lead: Any, seconds: float) -> list[tuple[str, str, str]]:
    """The outcomes the parent receives within ``seconds`` (its waits also run the async
    face's heartbeats)."""
    got: list[tuple[str, str, str]] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        got += [
            (m.sender, m.subject, m.body)
            for m in lead.wait(timeout=min(left, HEARTBEAT_S)).messages
            if m.type == "outcome"
        ]
    return got


def status_of(lead: Any, name: str) -> str:
    return str({m.name: m.status for m in lead.channel.tree()}[name])


def test_completed_stays_completed_over_heartbeats_and_after_the_bus_closes(
    make_bus: Callable[..., Any], chan_name: str
) -> None:
    lead, w, child_bus = family_of(make_bus, chan_name)
    lead.send("w", "task")
    # given a child that took its task with wait() (which asks the heartbeat to show it
    # running), marked it done and completed, all before its next heartbeat
    res = w.wait(timeout=5)
    w.mark_done(res.messages[0].id)
    w.complete("done")
    # then it shows completed at every one of several heartbeats
    seen, outcomes = [], []
    for _ in range(6):
        outcomes += heard(lead, HEARTBEAT_S)
        seen.append(status_of(lead, "w"))
    assert seen == ["completed"] * 6
    assert outcomes == [("w", "completed", "done")]
    # and when its bus closes, the parent hears nothing more, not even after a lease
    child_bus.close()
    assert heard(lead, LEASE_S + SLACK_S) == []
    assert status_of(lead, "w") == "completed"


def test_a_finished_child_finishes_only_once(make_bus: Callable[..., Any], chan_name: str) -> None:
    lead, w, _ = family_of(make_bus, chan_name)
    w.complete("done")
    # when it completes again, then tries to fail, and its parent cancels it
    w.complete("done again")
    with pytest.raises(AgentClosed):
        w.fail("too late")
    lead.cancel("w", reason="never mind")
    # then it is still completed, and the parent got exactly one outcome
    assert status_of(lead, "w") == "completed"
    assert heard(lead, 3 * HEARTBEAT_S) == [("w", "completed", "done")]


def test_failed_or_cancelled_names_cannot_join_again(
    make_bus: Callable[..., Any], chan_name: str
) -> None:
    lead, w, child_bus = family_of(make_bus, chan_name)
    other = child_bus.channel(chan_name).join("v", parent="lead")
    w.fail("broken")
    lead.cancel("v")
    for name in ("w", "v"):
        with pytest.raises(AgentClosed):
            child_bus.channel(chan_name).join(name, parent="lead")
    assert other is not None
    assert {status_of(lead, "w"), status_of(lead, "v")} == {"failed", "cancelled"}


def test_lost_name_cannot_join_again(
    redis7: Server, spawn: Callable[..., Worker], face: str
) -> None:
    redis7.client().flushall()
    with Bus.from_url(redis7.url, settings=settings(**LIVE)) as bus:
        lead = bus.channel("lost-join", routing="family", **FAST).join("lead")
        kid = spawn(redis7.url, "lost-join", "kid", "lead", face=face, mode="echo")
        kid.kill()
        assert [(s, sub) for s, sub, _ in heard(lead, LEASE_S + SLACK_S)] == [("kid", "lost")]
        with bus_on(redis7.url, face) as other, pytest.raises(AgentClosed):
            other.channel("lost-join").join("kid", parent="lead")


def test_child_killed_after_completing_is_never_reported_lost(
    redis7: Server, spawn: Callable[..., Worker], face: str
) -> None:
    redis7.client().flushall()
    with Bus.from_url(redis7.url, settings=settings(**LIVE)) as bus:
        ch = bus.channel("finish", routing="family", **FAST)
        lead = ch.join("lead")
        kid = spawn(redis7.url, "finish", "kid", "lead", face=face, mode="finish")
        # given a child (in its own process, either face) that finds its task already there,
        # takes it with wait(), marks it done and completes before its next heartbeat
        lead.send("kid", "task")
        kid.go()
        assert kid.next(10)["completed"] == ["task"]
        # then it stays completed while it goes on beating
        seen = []
        for _ in range(5):
            time.sleep(HEARTBEAT_S)
            seen.append(status_of(lead, "kid"))
        assert seen == ["completed"] * 5
        # and when it is SIGKILLed, its parent hears "completed" once, never "lost"
        kid.kill()
        assert heard(lead, LEASE_S + SLACK_S + 1) == [("kid", "completed", "done")]
        assert status_of(lead, "kid") == "completed"


# -- a cancel reaches every replica ------------------------------------------------------------


def test_cancel_reaches_every_replica(
    redis7: Server, spawn: Callable[..., Worker], face: str
) -> None:
    redis7.client().flushall()
    with Bus.from_url(redis7.url, settings=settings(**LIVE)) as bus:
        ch = bus.channel("replicas", routing="family", **FAST)
        lead = ch.join("lead")
        # given three replicas of "kid" (three processes), each knowing there are three
        replicas = [
            spawn(
                redis7.url,
                "replicas",
                "kid",
                "lead",
                face=face,
                mode="replica",
                replica=f"kid/{i}",
                ready=False,
            )
            for i in range(3)
        ]
        for r in replicas:
            r.ready()
        time.sleep(3 * HEARTBEAT_S)  # every replica's heartbeat counted all three
        # and all blocked in wait(timeout=30)
        for r in replicas:
            r.go()
        time.sleep(0.5)
        # when the parent cancels kid
        t0 = time.time()
        lead.cancel("kid", reason="stop")
        # then every replica's wait() returns "cancelled" within about a second and a half
        firsts = [r.next(5) for r in replicas]
        assert [e["kind"] for e in firsts] == ["cancelled"] * 3
        late = max(e["at"] for e in firsts) - t0
        assert late < 1.5 + 0.5, f"the last replica heard the cancel after {late:.2f} s"
        # and every later wait() returns "cancelled" at once
        seconds = [r.next(5) for r in replicas]
        assert [e["kind"] for e in seconds] == ["cancelled"] * 3
        assert all(e["took"] < 0.2 for e in seconds), seconds
        # and serve() on them returns
        assert [r.next(5).get("served") for r in replicas] == ["returned"] * 3
        # and the parent hears one outcome
        assert [(s, sub) for s, sub, _ in heard(lead, 2 * HEARTBEAT_S)] == [("kid", "cancelled")]
