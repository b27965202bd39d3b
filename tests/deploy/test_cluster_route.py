"""A Cluster bus sends each call straight to the primary serving its channel's slot: per
message the same server commands as on one server (no ``COMMAND GETKEYS``, no clock read of
its own), and a slot that moved (MOVED) is found again without losing a message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from redisbus import AsyncBus, Bus
from tests.conftest import Synced, settings
from tests.support.cluster_servers import Cluster
from tests.support.servers import Server

pytest_plugins = ["tests.support.cluster_servers"]

N = 40


@pytest.fixture
def cluster(redis_cluster: Cluster) -> Cluster:
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    return redis_cluster


@contextlib.contextmanager
def bus_at(url: str, face: str, cluster: bool) -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    b: Any
    unlimited = settings(pair_rate_burst=0, sender_rate_burst=0)
    if face == "sync":
        b = Bus.from_url(url, cluster=cluster, settings=unlimited)
    else:
        b = Synced(AsyncBus.from_url(url, cluster=cluster, settings=unlimited), loop)
    try:
        yield b
    finally:
        b.close()
        loop.close()


def stats(clients: list[redis.Redis]) -> dict[str, int]:
    """Calls per command, summed over ``clients`` (subcommands apart: command|getkeys). The
    test's own probes and replication's bookkeeping (a replica acknowledges its offset with
    REPLCONF every second, whatever the bus does) are left out."""
    out: dict[str, int] = {}
    for c in clients:
        for name, v in c.info("commandstats").items():
            cmd = name.removeprefix("cmdstat_")
            if cmd.split("|")[0] not in ("info", "config", "replconf", "psync", "sync"):
                out[cmd] = out.get(cmd, 0) + int(v["calls"])
    return out


def per_message(b: Any, name: str, clients: list[redis.Redis]) -> dict[str, float]:
    ch = b.channel(name)
    a, z = ch.join("a"), ch.join("z")
    for i in range(5):  # warm: scripts loaded, slot table read, groups made
        a.send("z", f"warm {i}")
        assert z.wait(timeout=5).messages
    for c in clients:
        c.config_resetstat()
    for i in range(N):
        a.send("z", f"m {i}")
        got = z.wait(timeout=5).messages
        assert [m.body for m in got] == [f"m {i}"]
    return {k: v / N for k, v in stats(clients).items()}


def test_cluster_message_costs_the_commands_of_one_server(
    cluster: Cluster, redis7: Server, face: str
) -> None:
    # given: a channel on one primary of the Cluster, and the same on one server
    primaries = cluster.primaries()
    name = cluster.channel_on(primaries[1], "rt-")
    nodes = [cluster.node_client(p) for p in primaries]
    one = redis.Redis.from_url(redis7.url, decode_responses=True)
    # when: N messages are sent and waited for on each
    with bus_at(cluster.url, face, True) as b:
        on_cluster = per_message(b, name, nodes)
    with bus_at(redis7.url, face, False) as b:
        on_one = per_message(b, name, [one])
    # then: no key lookups, no clock read apart, the very commands of one server
    assert not [k for k in on_cluster if k.startswith("command")], on_cluster
    assert "eval" not in on_cluster, on_cluster
    assert on_cluster == on_one, (on_cluster, on_one)


def _move_slot(cluster: Cluster, slot: int, src: int, dst: int) -> None:
    """Migrate ``slot`` (and its keys) from primary ``src`` to primary ``dst``."""
    s, d = cluster.node_client(src), cluster.node_client(dst)
    src_id, dst_id = s.execute_command("CLUSTER MYID"), d.execute_command("CLUSTER MYID")
    d.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    s.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    while keys := s.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
        s.execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", *keys)
    for c in (d, s):
        c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
    for p in cluster.primaries():
        if p not in (src, dst):
            cluster.node_client(p).execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


@contextlib.contextmanager
def talked_then_moved(cluster: Cluster, face: str, prefix: str) -> Iterator[Any]:
    """A bus that has talked on a channel, so it knows the primary serving its slot, whose
    slot (with the channel's keys) then moved to another primary; moved back after."""
    src, dst = cluster.primaries()[0], cluster.primaries()[2]
    name = cluster.channel_on(src, prefix)
    slot = cluster.keyslot("{" + name + "}")
    with bus_at(cluster.url, face, True) as b:
        ch = b.channel(name)
        a, z = ch.join("a"), ch.join("z")
        a.send("z", "before")
        assert [m.body for m in z.wait(timeout=5).messages] == ["before"]
        _move_slot(cluster, slot, src, dst)
        try:
            assert cluster.owner("{" + name + "}") == dst
            yield SimpleNamespace(bus=b, a=a, z=z, name=name, slot=slot, src=src, dst=dst)
        finally:
            _move_slot(cluster, slot, dst, src)


def test_channel_whose_slot_moved_keeps_delivering(cluster: Cluster, face: str) -> None:
    # given: a bus that has talked on a channel whose slot then moved to another primary
    with talked_then_moved(cluster, face, "mv-") as m:
        # then: its sends (refused with MOVED by the old node) and waits go on, once each
        for i in range(3):
            m.a.send("z", f"after {i}")
        got = [msg.body for msg in m.z.wait(timeout=5).messages]
        assert got == [f"after {i}" for i in range(3)]
        assert cluster.node_client(m.dst).xlen(f"rb:{{{m.name}}}:s") >= 4


def test_moved_reply_is_followed_when_a_refresh_reads_a_node_that_has_not_heard(
    cluster: Cluster, face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a bus that has talked on a channel whose slot then moved to another primary
    with talked_then_moved(cluster, face, "st-") as m:
        # and: its slot table names the old primary, and every refresh of the table reads a
        # node that has not heard of the move yet (as in the seconds after a failover, while
        # the nodes' views of who serves a slot disagree)
        nodes = getattr(m.bus, "_target", m.bus)._io.r.nodes_manager
        old = nodes.get_node(host="127.0.0.1", port=m.src)

        def stale(*_: Any, **__: Any) -> None:
            nodes.slots_cache[m.slot] = [old]

        async def stale_async(*_: Any, **__: Any) -> None:
            stale()

        stale()
        # (on the class: the async client's keeps no instance dict)
        monkeypatch.setattr(type(nodes), "initialize", stale if face == "sync" else stale_async)
        # when: it sends and waits, each call refused with MOVED by the old primary
        for i in range(3):
            m.a.send("z", f"after {i}")
        got = [msg.body for msg in m.z.wait(timeout=5).messages]
        # then: each went where the MOVED reply said, once, and nothing was lost
        assert got == [f"after {i}" for i in range(3)]
        assert cluster.node_client(m.dst).xlen(f"rb:{{{m.name}}}:s") >= 4
        assert nodes.slots_cache[m.slot][0].port == m.dst


def test_moved_reply_is_followed_when_other_calls_refresh_the_table_before_the_next_try(
    cluster: Cluster, face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a bus that has talked on a channel whose slot then moved to another primary
    with talked_then_moved(cluster, face, "rf-") as m:
        # and: before every lookup of a slot's node, a refresh (as other calls ask for while a
        # failover settles) reads a node that has not heard of the move, so the table names
        # the old primary again, whatever a MOVED reply just put there
        client = getattr(m.bus, "_target", m.bus)._io.r
        nodes = client.nodes_manager
        old = nodes.get_node(host="127.0.0.1", port=m.src)
        lookup = type(client).get_node_from_key

        def stale_lookup(self: Any, key: str, replica: bool = False) -> Any:
            nodes.slots_cache[m.slot] = [old]
            return lookup(self, key, replica)

        monkeypatch.setattr(type(client), "get_node_from_key", stale_lookup)
        # when: it sends and waits, each call refused with MOVED by the old primary first
        for i in range(3):
            m.a.send("z", f"after {i}")
        got = [msg.body for msg in m.z.wait(timeout=5).messages]
        # then: each went to the node the MOVED reply named, once, and nothing was lost
        assert got == [f"after {i}" for i in range(3)]
        assert cluster.node_client(m.dst).xlen(f"rb:{{{m.name}}}:s") >= 4
