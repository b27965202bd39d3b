"""Deliveries count hand-outs (docs/delivery.md; found by tests/faults/test_model_based.py).

``Message.deliveries``, a dead letter's count and the ``max_deliveries`` check count the
times a message was handed to the agent's code (a wait() or read() returning it), across
replicas and restarts. The bus's own reads of a replica's pending list — after a restart,
after read() and mark_done() fetched entries ahead, on quiet wait() slices — count nothing
and restart no lease. On a standalone server and on a Redis Cluster, both faces."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from redisbus import AsyncBus, Bus
from tests.conftest import Synced, settings
from tests.support.servers import Server

pytest_plugins = ["tests.support.cluster_servers"]

LEASE = 1.0
FAST: dict[str, Any] = {"pair_rate_burst": 0, "sender_rate_burst": 0, "inbox_cap": 10**6}


@pytest.fixture(params=["standalone", pytest.param("cluster", marks=pytest.mark.cluster)])
def url(request: pytest.FixtureRequest) -> tuple[str, bool]:
    """A flushed server's URL, and whether it is a Cluster."""
    if request.param == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.wait_healthy()
        cluster.flush()
        return cluster.url, True
    srv: Server = request.getfixturevalue("redis7")
    srv.client().flushall()
    return srv.url, False


@pytest.fixture(params=["sync", "async"])
def make_bus(request: pytest.FixtureRequest, url: tuple[str, bool]) -> Iterator[Any]:
    """make_bus(replica) -> a Bus (or an AsyncBus behind the sync adapter) whose handles are
    that replica: one bus per replica, as one process per replica would have."""
    made: list[Any] = []
    loop = asyncio.new_event_loop()

    def make(replica: str) -> Any:
        s = settings(replica=replica, heartbeat_s=300.0)
        b: Any
        if request.param == "sync":
            b = Bus.from_url(url[0], cluster=url[1], settings=s)
        else:
            b = Synced(AsyncBus.from_url(url[0], cluster=url[1], settings=s), loop)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
    loop.close()


def channel(bus: Any, max_deliveries: int = 3) -> Any:
    name = "dl-" + uuid.uuid4().hex[:8]
    return bus.channel(name, lease_s=LEASE, max_deliveries=max_deliveries, **FAST)


def fetch_ahead(boss: Any, w: Any) -> None:
    """Make ``w`` fetch entries it does not return (read()'s limit, mark_done() of one it
    never fetched), then hand them out by a wait() and mark them done: each time the bus
    re-reads w's pending list, where the message it holds sits too."""
    boss.send("worker", "x1")
    boss.send("worker", "x2")
    (first,) = w.read(limit=1)  # x2 fetched too, not returned
    boss.send("worker", "x3")
    done_now = boss.send("worker", "x4").id
    assert w.mark_done(done_now)  # fetches x3 (and x4) into w's pending list
    got = w.wait(timeout=1).messages
    assert sorted(m.body for m in got) == ["x2", "x3"], got
    assert all(m.deliveries == 1 for m in got), got  # fetched ahead, handed out once
    w.mark_done([first, *got])
    for _ in range(3):  # quiet slices
        assert w.wait(timeout=0.05).kind == "timeout"


def test_a_message_handed_out_once_goes_to_the_other_replica_with_deliveries_2(
    make_bus: Any,
) -> None:
    ch, bus_a, bus_b = channel(make_bus("boss")), make_bus("a"), make_bus("b")
    boss = ch.join("boss")
    a, b = (bus.channel(ch.name).join("worker") for bus in (bus_a, bus_b))
    r = boss.send("worker", "job")
    assert [(m.id, m.deliveries) for m in a.wait(timeout=2).messages] == [(r.id, 1)]
    for _ in range(3):  # a keeps re-reading its pending list, the job's lease extended
        assert a.extend_lease(r.id)
        fetch_ahead(boss, a)
    bus_a.close()  # a is gone, holding the job: b gets it after the lease, not the dead letters
    time.sleep(LEASE + 0.1)
    got = b.wait(timeout=2).messages
    assert [(m.id, m.deliveries) for m in got] == [(r.id, 2)]
    assert ch.dead_letters() == []
    b.mark_done(r.id)
    assert boss.receipt(r.id)[0].status == "done"


def test_a_lease_extended_after_another_replica_took_the_message_back_stays_with_it(
    make_bus: Any,
) -> None:
    # given: replica a handled a job past its lease, and replica b took it back
    ch, bus_a, bus_b = channel(make_bus("boss")), make_bus("a"), make_bus("b")
    boss = ch.join("boss")
    a, b = (bus.channel(ch.name).join("worker") for bus in (bus_a, bus_b))
    r = boss.send("worker", "job")
    assert [m.id for m in a.wait(timeout=2).messages] == [r.id]
    time.sleep(LEASE + 0.1)
    assert [(m.id, m.deliveries) for m in b.wait(timeout=2).messages] == [(r.id, 2)]
    # when: a, late, extends its lease
    # then: it is told it no longer holds it, and b keeps it
    assert a.extend_lease(r.id) is False
    assert b.extend_lease(r.id) is True
    b.mark_done(r.id)
    assert b.extend_lease(r.id) is False  # done: no one's


def test_an_entry_fetched_ahead_and_never_returned_is_a_first_delivery_elsewhere(
    make_bus: Any,
) -> None:
    ch, bus_a, bus_b = channel(make_bus("boss"), 1), make_bus("a"), make_bus("b")
    boss = ch.join("boss")
    a, b = (bus.channel(ch.name).join("worker") for bus in (bus_a, bus_b))
    x1 = boss.send("worker", "x1")
    r = boss.send("worker", "x2")
    assert [m.body for m in a.read(limit=1)] == ["x1"]  # x2 is in a's pending list now
    bus_a.close()
    time.sleep(LEASE + 0.1)
    # x2 was never handed out: with max_deliveries=1 b gets it; x1 was, once: dead letter
    got = b.wait(timeout=2).messages
    assert [(m.id, m.deliveries) for m in got] == [(r.id, 1)]
    assert [(d.original_id, d.deliveries) for d in ch.dead_letters()] == [(x1.id, 1)]


def test_a_restarted_replica_counts_the_hand_outs_of_its_predecessors(make_bus: Any) -> None:
    ch, first = channel(make_bus("boss")), make_bus("w1")
    boss = ch.join("boss")
    w = first.channel(ch.name).join("worker")
    r = boss.send("worker", "crashes its handler")
    assert [m.deliveries for m in w.wait(timeout=2).messages] == [1]
    first.close()  # "crash": never marked done
    # the same replica name again: its pending message first, as the second hand-out
    second = make_bus("w1")
    w = second.channel(ch.name).join("worker")
    assert [(m.id, m.deliveries) for m in w.wait(timeout=2).messages] == [(r.id, 2)]
    for _ in range(3):  # quiet slices re-read nothing it holds
        assert w.wait(timeout=0.05).kind == "timeout"
    second.close()
    third = make_bus("w1")
    w = third.channel(ch.name).join("worker")
    assert [(m.id, m.deliveries) for m in w.wait(timeout=2).messages] == [(r.id, 3)]
    third.close()
    # handed out max_deliveries times: a restart dead-letters it instead of a fourth time
    fourth = make_bus("w1")
    w = fourth.channel(ch.name).join("worker")
    assert w.wait(timeout=0.2).kind == "timeout"
    (dead,) = ch.dead_letters()
    assert (dead.original_id, dead.deliveries) == (r.id, 3)
    assert boss.receipt(r.id)[0].status == "failed"
    assert ch.counts()["worker"] == 0


def test_a_lone_replica_s_message_comes_back_with_its_hand_outs_counted(make_bus: Any) -> None:
    bus = make_bus("only")
    ch = channel(bus, max_deliveries=3)
    boss, w = ch.join("boss"), ch.join("worker")
    r = boss.send("worker", "never done")
    assert [m.deliveries for m in w.wait(timeout=2).messages] == [1]
    handed = time.monotonic()
    fetch_ahead(boss, w)  # within the lease: re-reads count nothing, restart no lease
    time.sleep(max(0.0, handed + LEASE + 0.1 - time.monotonic()))
    t0 = time.monotonic()
    assert [(m.id, m.deliveries) for m in w.wait(timeout=2).messages] == [(r.id, 2)]
    assert time.monotonic() - t0 < 0.5  # at once: its lease ran from the hand-out
    time.sleep(LEASE + 0.1)
    assert [(m.id, m.deliveries) for m in w.wait(timeout=2).messages] == [(r.id, 3)]
    time.sleep(LEASE + 0.1)
    assert ch.sweep().dead_lettered == 1  # the janitor counts hand-outs too
    (dead,) = ch.dead_letters()
    assert (dead.original_id, dead.deliveries) == (r.id, 3)
