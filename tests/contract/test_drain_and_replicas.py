"""Faults that are not deaths, part two: a server at its memory limit still drains, two handles
of one agent in one process are two replicas, and read() hands out what it returns
(docs/delivery.md#faults-are-not-deaths)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redisbus import AsyncBus, Bus, ServerFull
from tests.conftest import Synced, settings
from tests.support.servers import Server, start_server

BIG = {"inbox_cap": 100_000, "pair_rate_burst": 0, "sender_rate_burst": 0}


@pytest.fixture(params=["redis7", "valkey", "redis62"])
def private(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    """A server of its own: these tests change its maxmemory."""
    s = start_server(request.param, tmp_path, extra=["--maxmemory-policy", "noeviction"])
    yield s
    s.stop()


def make(face: str, url: str, **kw: Any) -> Any:
    s = settings(**kw)
    if face == "sync":
        return Bus.from_url(url, settings=s)
    import asyncio

    return Synced(AsyncBus.from_url(url, settings=s), asyncio.new_event_loop())


def at_the_limit(r: Any) -> None:
    """maxmemory just below what the server holds now: every write that may grow memory is
    refused (noeviction) until something is freed."""
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", max(1, used - 64 * 1024))


def snapshot(r: Any, ch: Any) -> dict[str, Any]:
    k = ch.keys
    return {
        "len": r.xlen(k.stream),
        "inbox": r.hgetall(k.inbox),
        "groups": [(g["name"], g["pending"]) for g in r.xinfo_groups(k.stream)],
    }


def test_consumers_drain_a_server_at_its_memory_limit(private: Server, face: str) -> None:
    # given: 200 messages waiting for b, then the server at its memory limit
    bus = make(face, private.url)
    try:
        ch = bus.channel("drain", **BIG)
        a, b = ch.join("a"), ch.join("b")
        a.send_many([("b", f"m{i} " + "x" * 2000) for i in range(200)])
        r = private.client()
        at_the_limit(r)
        before = snapshot(r, ch)

        # when: a sends more: then it is refused cleanly, nothing half-written
        with pytest.raises(ServerFull):
            a.send("b", "one more")
        assert snapshot(r, ch) == before

        # when: b drains with wait() and mark_done(), read() and a fresh replica's join
        first = b.read(limit=50)
        b.mark_done(first)
        got = [m.id for m in first]
        deadline = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < deadline:
            res = b.wait(timeout=1)
            got += [m.id for m in res.messages]
            if res.messages:
                b.mark_done(res.messages)
        other = make(face, private.url)
        try:
            assert other.channel("drain").join("b", replica="second").name == "b"
        finally:
            other.close()
        report = ch.sweep()

        # then: every message came out once, was done, and the janitor trimmed them away
        assert len(got) == len(set(got)) == 200
        assert r.hget(ch.keys.inbox, "b") == "0"
        assert [g["pending"] for g in r.xinfo_groups(ch.keys.stream) if g["name"] == "b"] == [0]
        assert report.trimmed == 200
        assert r.xlen(ch.keys.stream) == 0
    finally:
        private.client().config_set("maxmemory", 0)
        bus.close()


def test_two_handles_of_one_agent_in_one_process_are_two_replicas(
    redis_url: str, face: str
) -> None:
    # given: two handles of b in one process (same bus), and one more on a second bus
    bus, second = make(face, redis_url), make(face, redis_url)
    try:
        ch = bus.channel("twins", **BIG)
        a = ch.join("a")
        b1, b2 = ch.join("b"), ch.join("b")
        b3 = second.channel("twins").join("b")
        assert len({b1.replica, b2.replica, b3.replica}) == 3
        assert b2.replica == b1.replica + "#2"

        # when: 20 messages go to b and the three handles take turns waiting
        sent = {a.send("b", f"m{i}").id for i in range(20)}
        seen: list[str] = []
        for _ in range(40):
            for h in (b1, b2, b3):
                res = h.wait(timeout=0.05)
                seen += [m.id for m in res.messages]
                if res.messages:
                    h.mark_done(res.messages)
            if len(seen) >= 20:
                break

        # then: each message went to exactly one of them (well within the lease)
        assert sorted(seen) == sorted(sent)

        # and: a closed handle's consumer name is free again for the next handle
        b2.close()
        assert ch.join("b").replica == b1.replica + "#2"
    finally:
        bus.close()
        second.close()


def test_read_hands_out_what_it_returns_and_dead_letters_past_max_deliveries(
    redis_url: str, face: str
) -> None:
    # given: a channel that dead-letters after 3 hand-outs
    bus = make(face, redis_url)
    try:
        ch = bus.channel("reads", max_deliveries=3, **BIG)
        a, b = ch.join("a"), ch.join("b")
        mid = a.send("b", "hello").id

        # when: wait() hands it out, then read() twice more
        first = b.wait(timeout=5).messages
        second = b.read("all")
        third = b.read("from:a")

        # then: each hand-out counts, whichever call made it
        assert [m.deliveries for m in first] == [1]
        assert [(m.id, m.deliveries) for m in second] == [(mid, 2)]
        assert [(m.id, m.deliveries) for m in third] == [(mid, 3)]

        # when: read once more, past max_deliveries
        fourth = b.read("all")

        # then: it is dead-lettered instead of returned, and b's count is down to 0
        assert fourth == []
        assert [d.original_id for d in ch.dead_letters()] == [mid]
        assert bus.redis.hget(ch.keys.inbox, "b") in ("0", b"0")
        assert b.receipt(mid)[0].status == "failed"
    finally:
        bus.close()


def test_messages_only_ever_read_dead_letter_too(redis_url: str, face: str) -> None:
    # given: an agent that never waits, only reads everything, and never marks done
    bus = make(face, redis_url)
    try:
        ch = bus.channel("only-reads", max_deliveries=2, **BIG)
        a, b = ch.join("a"), ch.join("b")
        mid = a.send("b", "hello").id
        counts = [[m.deliveries for m in b.read("all")] for _ in range(3)]
        assert counts == [[1], [2], []]
        assert [d.original_id for d in ch.dead_letters()] == [mid]
    finally:
        bus.close()


def test_a_cancelled_agents_replica_is_handed_nothing_more(redis_url: str, face: str) -> None:
    # given: child c with two replicas (two buses); a message to c handed to the first and
    # never done; then the parent cancels c and the first replica takes the cancel
    bus1, bus2 = make(face, redis_url), make(face, redis_url)
    try:
        ch1 = bus1.channel("lapsed", routing="family", lease_s=0.3, **BIG)
        parent = ch1.join("lead")
        c1 = ch1.join("c", parent="lead")
        c2 = bus2.channel("lapsed").join("c", parent="lead")
        parent.send("c", "work")
        assert [m.body for m in c1.wait(timeout=5).messages] == ["work"]
        parent.cancel("c")
        assert c1.wait(timeout=5).kind == "cancelled"

        # when: the message's lease runs out and the second replica waits
        time.sleep(0.4)
        res = c2.wait(timeout=2)

        # then: it is told the agent was cancelled, and the message is not handed out again
        assert (res.kind, res.messages) == ("cancelled", [])
        assert c2.wait(timeout=2).kind == "cancelled"
    finally:
        bus1.close()
        bus2.close()
