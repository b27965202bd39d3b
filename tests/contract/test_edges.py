"""Guarantees at the edges (docs/delivery.md#at-least-once-to-an-agent): redelivery to a lone
replica, one consumer name per process, reads that never miss a message and whose cost does not grow
with the backlog behind an old pending one, wait statuses, Unicode subject filters, the janitor's
budget, the heartbeat hash, dead-letter receipts, and use after close."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import pytest
import redis
from redis.typing import EncodableT, FieldT

from redisbus import (
    Bus,
    BusClosed,
    BusSettings,
    DeadLettered,
    InvalidInput,
)
from tests.support.servers import Server, wait_for

# rates and caps out of the way: these tests are about delivery, not limits
FAST: dict[str, Any] = {"pair_rate_burst": 0, "sender_rate_burst": 0, "inbox_cap": 10**6}
QUIET: dict[str, Any] = {"heartbeat_s": 300.0}  # no heartbeat traffic while commands are counted


@pytest.fixture(params=["redis7", "valkey", "redis62"])
def server(request: pytest.FixtureRequest) -> Server:
    """These edges need real servers (both versions), under both faces (``make_bus``)."""
    srv: Server = request.getfixturevalue(request.param)
    srv.client().flushall()
    return srv


def commands_run(client: redis.Redis) -> int:
    """Every command the server has run so far (scripts' inner calls included)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


# -- 1. redelivery when the agent has one replica ------------------------------------------------


def test_a_failed_message_comes_back_to_its_only_replica_then_dead_letters(
    make_bus: Any, chan_name: str
) -> None:
    bus = make_bus()
    lease = 1.0
    ch = bus.channel(chan_name, lease_s=lease, max_deliveries=3, **FAST)
    boss, worker = ch.join("boss"), ch.join("worker")
    r = boss.send("worker", "job-1")

    (first,) = worker.wait(timeout=2).messages
    assert (first.id, first.deliveries) == (r.id, 1)
    # still being handled by this handle (lease not run out): not handed out twice
    assert worker.wait(timeout=0.2).kind == "timeout"

    for n in (2, 3):  # the handler failed (never marked done): back after each lease
        time.sleep(lease + 0.1)
        got = worker.wait(timeout=2).messages
        assert [(m.id, m.deliveries) for m in got] == [(r.id, n)]

    time.sleep(lease + 0.1)
    assert worker.wait(timeout=1.2).kind == "timeout"  # delivered 3 times: dead-lettered
    (dead,) = ch.dead_letters()
    assert (dead.original_id, dead.deliveries) == (r.id, 3)
    (rc,) = boss.receipt(r.id)
    assert rc.status == "failed" and rc.done_at is not None
    assert isinstance(rc.error, DeadLettered) and rc.error.reason == "max_deliveries"
    assert ch.counts()["worker"] == 0


def test_a_served_handler_that_raises_gets_the_message_again(
    redis7: Server, chan_name: str
) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel(chan_name, lease_s=0.5, max_deliveries=5, **FAST)
    boss, worker = ch.join("boss"), ch.join("worker")
    r = boss.send("worker", "flaky job")
    seen: list[int] = []

    def handler(agent: Any, msg: Any) -> None:
        seen.append(msg.deliveries)
        if len(seen) < 2:
            raise RuntimeError("first attempt fails")
        stop.set()

    stop = threading.Event()
    deadline = threading.Timer(10, stop.set)  # a serve that never gets it back must end too
    deadline.start()
    bus.serve({worker: handler}, stop=stop, poll_s=0.3)
    deadline.cancel()
    assert seen == [1, 2]
    assert r.id is not None
    assert boss.receipt(r.id)[0].status == "done"
    bus.close()


# -- 2. one consumer name per process ------------------------------------------------------------

_CHILD = """
import sys
from redisbus import Bus, BusSettings
bus = Bus.from_url(sys.argv[1], settings=BusSettings(metrics=False, host="h1"))
w = bus.channel(sys.argv[2]).join("worker")
print("replica", w.replica, flush=True)
got = w.wait(timeout=20)
print("got", " ".join(m.id for m in got.messages), flush=True)
sys.stdin.read()  # hold the message (never done) until told to go
"""


def test_two_processes_on_one_host_never_get_the_same_message(
    redis7: Server, chan_name: str
) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, host="h1"))
    ch = bus.channel(chan_name, lease_s=1.0, **FAST)
    boss = ch.join("boss")
    ch.join("worker", replica="setup")
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, redis7.url, chan_name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        child_replica = child.stdout.readline().split()[1]
        r = boss.send("worker", "job-1")
        assert child.stdout.readline().split() == ["got", r.id]
        # the same host, another process, the default name: it must not get job-1 too
        here = ch.join("worker")
        assert here.replica != child_replica and here.replica.startswith("h1/")
        assert here.wait(timeout=0.3).kind == "timeout"
        child.stdin.close()
        child.wait(10)
        # the child is gone (its name with it): its pending job comes back after the lease
        time.sleep(1.1)
        got = here.wait(timeout=3).messages
        assert [(m.id, m.deliveries) for m in got] == [(r.id, 2)]
    finally:
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):  # else a ResourceWarning once collected
            if pipe is not None:
                pipe.close()
    bus.close()


def test_a_restarted_process_with_a_stable_name_takes_its_pending_work_first(
    redis7: Server, chan_name: str
) -> None:
    redis7.client().flushall()
    s = BusSettings(metrics=False, replica="worker-1")
    first = Bus.from_url(redis7.url, settings=s)
    ch = first.channel(chan_name, **FAST)  # the default lease (60 s): no reclaim involved
    boss = ch.join("boss")
    w = ch.join("worker")
    assert w.replica == "worker-1"
    r = boss.send("worker", "job-1")
    assert [m.id for m in w.wait(timeout=2).messages] == [r.id]
    first.close()  # "crash": never marked done

    again = Bus.from_url(redis7.url, settings=s)
    w2 = again.channel(chan_name).join("worker")
    t0 = time.monotonic()
    assert [m.id for m in w2.wait(timeout=5).messages] == [r.id]
    assert time.monotonic() - t0 < 2  # at once, not after a lease
    again.close()


def test_the_default_consumer_name_is_per_process_unless_one_is_given() -> None:
    assert BusSettings(host="h1").consumer == f"h1/{os.getpid()}"
    assert BusSettings(host="h1", replica="stable").consumer == "stable"


# -- 3. reads never miss, and cost the same however long the backlog behind ----------------------


def _backlog(sender: Any, to: str, n: int) -> None:
    for start in range(0, n, 1000):
        sender.send_many([(to, f"m{i}") for i in range(start, min(n, start + 1000))])


def test_read_and_list_find_a_new_message_behind_a_long_backlog(
    make_bus: Any, chan_name: str
) -> None:
    bus = make_bus(**QUIET)
    ch = bus.channel(chan_name, **FAST)
    a, me, other = ch.join("a"), ch.join("reader"), ch.join("other")
    old = a.send("reader", "old", subject="first").id
    assert [m.id for m in me.read()] == [old]  # read, never done
    _backlog(a, "other", 21_000)
    new = a.send("reader", "new").id

    assert [m.id for m in me.list(filter_by="unread")] == [new]
    assert [m.id for m in me.list(filter_by="from:a subject:first")] == [old]
    assert [m.id for m in me.read()] == [new]
    assert me.wait(timeout=0).kind == "timeout"  # nothing left that read() missed
    other.close()


@pytest.mark.parametrize("face", ["sync"])
def test_the_cost_of_a_read_does_not_grow_with_the_backlog_behind(
    make_bus: Any, chan_name: str
) -> None:
    bus = make_bus(**QUIET)
    costs = {}
    for n in (1_000, 20_000):
        ch = bus.channel(f"{chan_name}-{n}", **FAST)
        a, me = ch.join("a"), ch.join("reader")
        a.send("reader", "old")
        me.read()  # read, not done: pending at the far end of the backlog
        ch.join("other")
        _backlog(a, "other", n)
        assert me.read() == []  # fetches the backlog (what wait() would have done)
        new = a.send("reader", "new").id
        before = commands_run(bus.redis)
        assert [m.id for m in me.read()] == [new]
        costs[n] = commands_run(bus.redis) - before - 1  # minus the INFO itself
    assert costs[20_000] <= costs[1_000] + 2, costs
    assert costs[1_000] < 40, costs


# -- 9. wait statuses ----------------------------------------------------------------------------


def test_wait_refuses_statuses_other_than_waiting_and_idle(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    ch.join("boss")
    w = ch.join("w", parent="boss")
    for bad in ("failed", "cancelled", "completed", "bogus", "", None, 3):
        with pytest.raises(InvalidInput):
            w.wait(timeout=0, status=bad)
    assert ch.members()["w"].status == "running"
    assert w.wait(timeout=0, status="idle").kind == "timeout"
    assert w.send("boss", "still open").status == "queued"


# -- 10. smaller ones ----------------------------------------------------------------------------


def test_subject_filters_fold_case_beyond_ascii(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    a, b = ch.join("a"), ch.join("b")
    ids = [a.send("b", "x", subject=s).id for s in ("ÉMILE", "about émile", "Emile", "STRASSE")]
    assert [m.id for m in b.list(filter_by="subject:Émile")] == ids[:2]
    assert [m.id for m in b.list(filter_by='"subject:ABOUT ÉMILE"')] == [ids[1]]
    assert [m.id for m in b.list(filter_by="subject:straße")] == [ids[3]]
    assert [m.id for m in b.read(filter_by="unread subject:émile")] == ids[:2]


def test_the_janitor_budget_is_per_call_not_per_agent(redis7: Server, chan_name: str) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, **QUIET))
    ch = bus.channel(chan_name, lease_s=0.05, max_deliveries=1, **FAST)
    boss = ch.join("boss")
    names = [f"w{i}" for i in range(20)]
    workers = [ch.join(n) for n in names]
    for _ in range(3):
        boss.send(names, "poison")
    for w in workers:
        assert len(w.read()) == 3  # fetched once each, never done
    time.sleep(0.1)
    dead: list[int] = []
    while sum(dead) < 60 and len(dead) < 40:
        dead.append(ch.sweep(batch=10).dead_lettered)
    assert all(d <= 10 for d in dead), dead  # one call does at most its budget
    assert sum(dead) == 60, dead  # and the next calls carry on where it stopped
    assert len(ch.dead_letters(limit=100)) == 60
    bus.close()


def test_a_dead_lettered_message_s_receipt_gives_the_reason(redis7: Server, chan_name: str) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, **QUIET))
    ch = bus.channel(chan_name, lease_s=0.05, max_deliveries=1, **FAST)
    boss, w = ch.join("boss"), ch.join("w")
    ch.join("keeper")  # has not read it yet: the entry stays in the stream after the sweep
    r, _ = boss.send(["w", "keeper"], "poison")
    assert [m.id for m in w.read()] == [r.id]  # fetched once, never done
    time.sleep(0.1)
    assert ch.sweep().dead_lettered == 1
    assert r.id is not None
    rc, _ = boss.receipt(r.id)
    assert rc.status == "failed" and not rc.ok
    assert isinstance(rc.error, DeadLettered) and rc.error.reason == "max_deliveries"
    assert "max_deliveries" in str(rc.error) and rc.as_dict()["error"]
    bus.close()


def test_replicas_not_seen_for_long_leave_the_heartbeat_hash(
    redis7: Server, chan_name: str
) -> None:
    redis7.client().flushall()
    s = BusSettings(metrics=False, heartbeat_s=0.05, agent_lease_s=0.3)
    bus = Bus.from_url(redis7.url, settings=s)
    ch = bus.channel(chan_name, **FAST)
    a = ch.join("a", replica="live")
    r = redis7.client()
    # 50 replicas that beat long ago and went away (restarts with per-process names)
    stale: dict[FieldT, EncodableT] = {f"a\ngone-{i}": 1 for i in range(50)}
    r.hset(ch.keys.beat, mapping=stale)
    replicas: Callable[[], list[str]] = lambda: [  # noqa: E731
        k for k in cast(list[str], r.hkeys(ch.keys.beat)) if not k.startswith("\n")
    ]
    # (beat.lua's own "\n#judged" field stays: when a beat of the channel last ran)
    assert wait_for(lambda: replicas() == ["a\nlive"], 5), r.hkeys(ch.keys.beat)
    assert ch.members()["a"].status != "lost"
    a.close()
    bus.close()


def test_every_call_after_close_raises_bus_closed(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    a, b = ch.join("a"), ch.join("b")
    bus.close()
    calls: list[Callable[[], object]] = [
        lambda: bus.channel(chan_name),
        lambda: ch.join("c"),
        lambda: a.send("b", "after close"),
        lambda: b.read(),
        lambda: b.list(),
        lambda: b.wait(timeout=0),
        lambda: a.agents(),
        lambda: ch.members(),
        lambda: bus.ping(),
    ]
    for call in calls:
        with pytest.raises(BusClosed):
            call()
    a.close()  # closing a handle of a closed bus stays quiet
    bus.close()
