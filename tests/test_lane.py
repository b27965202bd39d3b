"""The sync client's script lane: one held connection for the hot path, which must behave
exactly like the pool it bypasses when connections die, threads compete, or processes fork."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import redis

from redisbus import Bus
from redisbus.testing import memory_bus
from tests.servers import Server

OPEN = {"routing": "open", "pair_rate_burst": 0, "sender_rate_burst": 0, "inbox_cap": 100_000}


def lane_of(bus: Bus) -> Any:
    lane = bus._io.lane
    assert lane is not None, "a plain redis:// Bus has a lane"
    return lane


def test_sends_use_one_held_connection(redis7: Server) -> None:
    # given: a Bus and its agents
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-held", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        r = redis.Redis(port=redis7.port)
        # when: many sends go out one after the other
        a.send("b", "warm up")
        conn = lane_of(bus).conn
        before = r.info("stats")["total_connections_received"]
        for i in range(200):
            a.send("b", f"m{i}")
        # then: they all went through the same connection, and arrived
        assert lane_of(bus).conn is conn
        assert r.info("stats")["total_connections_received"] == before
        assert len(b.read(limit=500)) == 201


def test_a_killed_connection_is_replaced_before_the_next_send(redis7: Server) -> None:
    # given: a Bus whose lane connection the server has closed
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-killed", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "first")
        killer = redis.Redis(port=redis7.port)
        before = killer.info("stats")["total_connections_received"]
        for _ in range(3):
            killer.client_kill_filter(_type="normal", skipme=True)
            # when: the next send (not retried: no idempotency key) goes out
            a.send("b", "after the kill")
        # then: it found the dead socket each time, connected afresh, and nothing failed
        assert killer.info("stats")["total_connections_received"] - before >= 3
        assert [m.body for m in b.read(limit=10)] == ["first"] + ["after the kill"] * 3


def test_threads_share_the_lane_and_the_pool(redis7: Server) -> None:
    # given: one Bus used by eight threads at once
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-threads", **OPEN)
        b = ch.join("b")
        senders = [ch.join(f"s{i}") for i in range(8)]
        errors: list[BaseException] = []

        def run(agent: Any) -> None:
            try:
                for i in range(150):
                    agent.send("b", f"{agent.name}-{i}")
            except BaseException as e:  # recorded and asserted empty
                errors.append(e)

        threads = [threading.Thread(target=run, args=(s,)) for s in senders]
        # when: they all send as fast as they can
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # then: every message arrived exactly once
        assert not errors, errors[:3]
        got = [m.body for m in b.read(limit=2000)]
        assert sorted(got) == sorted(f"s{i}-{j}" for i in range(8) for j in range(150))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_connection(redis7: Server) -> None:
    # given: a Bus whose lane holds a connection in the parent
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-fork", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "parent before")
        parent_conn = lane_of(bus).conn
        # when: a forked child sends through the same Bus object
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                a.send("b", "child")
                code = 0 if lane_of(bus).conn is not parent_conn else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        a.send("b", "parent after")
        # then: the child used a connection of its own; the parent's still works
        assert os.waitstatus_to_exitcode(status) == 0
        assert lane_of(bus).conn is parent_conn
        assert [m.body for m in b.read(limit=10)] == ["parent before", "child", "parent after"]


def test_tls_and_test_doubles_have_no_lane() -> None:
    with memory_bus() as bus:
        assert bus._io.lane is None
        ch = bus.channel("lane-memory", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "through the pool")
        assert [m.body for m in b.read()] == ["through the pool"]
