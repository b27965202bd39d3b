"""The doorbells: a list of the entry ids rung for an agent and a wakeup list its waits block
on. What they cost in memory, that one message wakes one replica, and that a lost wakeup
costs latency, never a message."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from redisbus import Bus, BusSettings, RedisbusError
from tests.support.servers import Server

OPEN: dict[str, Any] = {
    "routing": "open",
    "pair_rate_burst": 0,
    "sender_rate_burst": 0,
    "inbox_cap": 100_000,
}


def _usage(r: redis.Redis, *keys: str) -> int:
    return sum(int(r.memory_usage(k, samples=0) or 0) for k in keys)


def test_a_message_in_flight_costs_its_recipient_a_few_dozen_bytes_of_bell(redis7: Server) -> None:
    # given: 100 agents and one producer
    r = redis7.client()
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("bell-memory", **OPEN)
        producer = ch.join("producer")
        agents = [ch.join(f"w{i:03d}") for i in range(100)]
        keys = producer._keys
        # when: each is sent one message it has not taken yet
        for agent in agents:
            producer.send(agent.name, "hi")
        # then: its bell and wakeup hold the message in 320 bytes (a bell
        # kept as a stream cost 4,728: a stream's radix tree and listpack for one entry)
        per = [_usage(r, keys.bell(a.name), keys.wakeup(a.name)) for a in agents]
        assert max(per) < 400, per
        # and a backlog grows by the id's bytes, not by a stream entry's
        for _ in range(999):
            producer.send("w000", "more")
        assert r.llen(keys.bell("w000")) == 1_000 and r.llen(keys.wakeup("w000")) == 1
        assert _usage(r, keys.bell("w000")) < 25_000  # (17.6 B an id on Redis 7.0)
        # and once taken, an idle agent keeps no doorbell at all
        for agent in agents:
            agent.mark_done(agent.wait(timeout=1).messages)
        while agents[0].wait(timeout=0).messages:
            pass
        assert r.exists(*[keys.bell(a.name) for a in agents]) == 0
        assert r.exists(*[keys.wakeup(a.name) for a in agents]) == 0


def test_one_message_wakes_one_of_two_blocked_replicas_and_is_handed_over_once(
    redis7: Server,
) -> None:
    # given: two replicas of b, each blocked in wait() on its own connection
    with (
        Bus.from_url(redis7.url, settings=BusSettings(replica="one", heartbeat_s=600)) as one,
        Bus.from_url(redis7.url, settings=BusSettings(replica="two", heartbeat_s=600)) as two,
        # (no heartbeats in the window: the scripts the server runs are counted below)
        Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as sender_bus,
    ):
        handles = [bus.channel("bell-replicas", **OPEN).join("b") for bus in (one, two)]
        a = sender_bus.channel("bell-replicas").join("a")
        r = redis7.client()
        results: dict[int, tuple[float, list[str]]] = {}

        def waiter(i: int) -> None:
            start = time.monotonic()
            got = handles[i].wait(timeout=2.5).messages
            results[i] = (time.monotonic() - start, [m.body for m in got])

        threads = [threading.Thread(target=waiter, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 5
        while len([c for c in r.client_list() if c["cmd"] == "blpop"]) < 2:
            assert time.monotonic() < deadline, "both replicas block on the wakeup list"
            time.sleep(0.01)
        r.config_resetstat()
        # when: one message is sent to b
        a.send("b", "once")
        deadline = time.monotonic() + 2
        while not results:
            assert time.monotonic() < deadline, "a replica is woken at once"
            time.sleep(0.01)
        time.sleep(0.2)
        # then: while the woken replica has returned, the other still blocks in its pop, and
        # the server ran two scripts: the send and one wake-up (a second replica woken would
        # have run its wake.lua too)
        assert len([c for c in r.client_list() if c["cmd"] == "blpop"]) == 1
        stats: dict[str, Any] = r.info("commandstats")
        verb = one._io.verb.lower()
        assert int(stats[f"cmdstat_{verb}"]["calls"]) == 2, stats
        for t in threads:
            t.join(10)
        # and exactly one replica got it, at once; the other returned empty at its timeout
        bodies = sorted(b for _, got in results.values() for b in got)
        assert bodies == ["once"]
        woken = [i for i, (_, got) in results.items() if got]
        (quiet,) = [i for i in results if i not in woken]
        assert results[woken[0]][0] < 1.0
        assert results[quiet][0] >= 2.3
        assert r.llen(handles[0]._keys.bell("b")) == 0


def _rung_without_wakeup(bus: Bus, r: redis.Redis, channel: str, body: str) -> Any:
    """b, past its first wait, with a message for it its bell names and no wakeup."""
    ch = bus.channel(channel, **OPEN)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "warm up")
    b.mark_done(b.wait(timeout=1).messages)
    a.send("b", body)
    r.delete(b._keys.wakeup("b"))
    assert r.llen(b._keys.bell("b")) == 1
    return b


def test_a_wait_takes_what_is_rung_already_without_blocking_or_showing_the_wait(
    redis7: Server,
) -> None:
    # given: a message rung for b while it was busy (its wakeup gone too: an attacker or a
    # failover took it, so only a look that does not block can find the message at once)
    r = redis7.client()
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as bus:
        b = _rung_without_wakeup(bus, r, "bell-lost", "still here")
        r.config_resetstat()
        # when: b waits
        start = time.monotonic()
        got = b.wait(timeout=3).messages
        # then: the message is handed over at once, by one script: no pop, no status written
        # (b was running and still is)
        assert [m.body for m in got] == ["still here"]
        assert time.monotonic() - start < 0.5
        assert r.llen(b._keys.bell("b")) == 0
        calls = {k: int(v["calls"]) for k, v in r.info("commandstats").items()}
        scripts = calls.get("cmdstat_fcall", 0) + calls.get("cmdstat_evalsha", 0)
        assert "cmdstat_blpop" not in calls and scripts == 1, calls
        assert r.hget(b._keys.status, "b") == "running"


def test_a_wakeup_lost_while_blocked_delays_a_message_to_the_slice_end_and_loses_nothing(
    redis7: Server,
) -> None:
    # given: b blocked in wait() with nothing rung
    r = redis7.client()
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as bus:
        b = _rung_without_wakeup(bus, r, "bell-lost-blocked", "still here")
        bell = b._keys.bell("b")
        rung = str(r.lpop(bell))
        b._replicas = 2  # (the 1 s slice of a shared agent, to keep the test short)
        got: list[str] = []
        start = time.monotonic()
        t = threading.Thread(target=lambda: got.extend(m.body for m in b.wait(timeout=3).messages))
        t.start()
        deadline = time.monotonic() + 5
        while not [c for c in r.client_list() if c["cmd"] == "blpop"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # when: a message is rung for it whose wakeup is lost (its bell names it, no wakeup)
        r.rpush(bell, rung)
        t.join(5)
        # then: it is handed over when the pop's slice ends, not lost
        assert got == ["still here"]
        assert 0.9 <= time.monotonic() - start < 2.0
        assert r.llen(bell) == 0


def test_a_failed_fetch_makes_the_next_one_look_without_blocking(redis7: Server) -> None:
    # given: b blocked in wait(), and a message its bell names whose wakeup is gone (as when
    # a pop whose reply was lost took it)
    r = redis7.client()
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as bus:
        b = _rung_without_wakeup(bus, r, "bell-cut", "after the cut")
        bell = b._keys.bell("b")
        rung = str(r.lpop(bell))  # (rung again once b blocks: its first look finds nothing)
        got: list[str] = []

        def waiter() -> None:
            start = time.monotonic()
            while time.monotonic() - start < 8 and not got:
                try:
                    got.extend(m.body for m in b.wait(timeout=8).messages)
                except RedisbusError:  # (a cut connection may surface as one)
                    continue

        t = threading.Thread(target=waiter)
        t.start()
        deadline = time.monotonic() + 5
        while not (blocked := [c for c in r.client_list() if c["cmd"] == "blpop"]):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r.rpush(bell, rung)  # (nothing wakes b)
        # when: its connection is cut while it blocks
        start = time.monotonic()
        r.client_kill_filter(_id=blocked[0]["id"])
        t.join(10)
        # then: the message arrives at once, not at the end of the 5 s slice
        assert got == ["after the cut"]
        assert time.monotonic() - start < 2.0


@pytest.mark.parametrize("srv", ["redis7", "redis62", "valkey"])
@pytest.mark.parametrize("block_ms", [1, 2, 7])
def test_a_wait_of_a_few_milliseconds_returns_in_time(
    srv: str, block_ms: int, request: pytest.FixtureRequest
) -> None:
    # given: an agent with nothing rung (Redis 6.2 reads a BLPOP timeout of "0.001" as 0:
    # block forever)
    server: Server = request.getfixturevalue(srv)
    with Bus.from_url(server.url, settings=BusSettings(heartbeat_s=600)) as bus:
        b = bus.channel(f"bell-short-{srv}-{block_ms}", **OPEN).join("b")
        b.wait(timeout=0)
        # when: its fetch blocks a few ms
        start = time.monotonic()
        entries, _ = b._fetch(block_ms)
        # then: it returns at about that, with nothing
        assert entries == []
        assert time.monotonic() - start < 1.0
