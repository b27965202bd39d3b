"""The core contract, unchanged, against a Redis Cluster of three primaries with one replica
each; then a primary SIGKILLed during steady durable traffic
(docs/delivery.md#redis-cluster-and-sentinel).

The contract tests are the functions of ``tests.contract.test_contract``, collected here a
second time with this module's ``make_bus`` and ``chan_name``: buses built with
``from_url(cluster=True)`` and channel names picked round-robin so the channels land on every shard.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from redis.cluster import RedisCluster
from redis.exceptions import MovedError

from redisbus import AsyncBus, Bus, BusConnectionError
from redisbus.embedded import free_port

pytest.register_assert_rewrite("tests.support.cluster_servers")

from tests.conftest import Synced, settings  # noqa: E402
from tests.contract import test_contract, test_family  # noqa: E402
from tests.faults import test_reliability  # noqa: E402
from tests.support.cluster_servers import (  # noqa: E402
    Cluster,
    Consumer,
    Traffic,
    bus_on,
    read_everything,
    run_failover,
    wait_until,
)

pytest_plugins = ["tests.support.cluster_servers"]

# Collect every contract test here too; the fixtures below decide what they run against.
globals().update({n: f for n, f in vars(test_contract).items() if n.startswith("test_")})

# And the reliability tests written for one standalone ``redis7`` server (all but the slow
# million-message figure and those that start servers of their own).
RELIABILITY = [
    "test_sigkilled_replica_messages_go_to_the_other_replica",
    "test_messages_delivered_too_often_are_dead_lettered_and_can_be_replayed",
    "test_janitor_trims_acked_entries_and_keeps_pending_ones",
    "test_retention_trims_old_undone_messages_and_fixes_counters",
    "test_idle_consumers_are_removed_only_when_nothing_is_pending",
]
# Not test_script_flush_and_client_kill_lose_and_double_nothing: it kills one node's clients
# every 30 ms, and on a Cluster a wait() can exhaust its retries there. The Cluster version,
# which kills on every node a few times, is below.
globals().update({n: getattr(test_reliability, n) for n in RELIABILITY})

# And the agent-family tests (routing, cancellation cascades, outcomes, budgets, serve).
globals().update({n: f for n, f in vars(test_family).items() if n.startswith("test_")})

# channel name -> (primary its hash tag names, primary holding its keys when its test ended)
LANDED: dict[str, tuple[int, int]] = {}
_turn = itertools.count()


class ClusterSynced(Synced):
    """The async face behind the sync adapter, inspected through a Cluster client."""

    @property
    def redis(self) -> Any:
        if "_cluster_client" not in self.__dict__:
            self.__dict__["_cluster_client"] = RedisCluster.from_url(
                self.target.url, decode_responses=True
            )
        return self.__dict__["_cluster_client"]


@pytest.fixture
def cluster(redis_cluster: Cluster) -> Cluster:
    """The session's cluster, healthy (a failover test may have run) and flushed."""
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    return redis_cluster


class ClusterAsServer:
    """What the reliability tests use of a ``Server``, backed by the cluster: buses made from
    ``url`` are Cluster buses through ``REDISBUS_CLUSTER`` (worker processes inherit it)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def port(self) -> int:
        return self.cluster.any_live_port()

    def client(self) -> RedisCluster:
        return self.cluster.client()


@pytest.fixture
def redis7(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> ClusterAsServer:
    monkeypatch.setenv("REDISBUS_CLUSTER", "true")
    return ClusterAsServer(cluster)


@pytest.fixture
def redis_url(redis7: ClusterAsServer) -> str:
    return redis7.url


@pytest.fixture
def make_bus(cluster: Cluster, face: str) -> Iterator[Any]:
    """make_bus(sync=False, **settings): a Bus or AsyncBus on the cluster, from one node's URL."""
    made: list[Any] = []
    loop = asyncio.new_event_loop()

    def make(sync: bool = False, **kw: Any) -> Any:
        s = settings(**kw)
        b: Any
        if face == "sync" or sync:
            b = Bus.from_url(cluster.url, cluster=True, settings=s)
        else:
            b = ClusterSynced(AsyncBus.from_url(cluster.url, cluster=True, settings=s), loop)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
        if isinstance(b, ClusterSynced) and "_cluster_client" in b.__dict__:
            b.redis.close()
    loop.close()


@pytest.fixture
def chan_name(cluster: Cluster) -> Iterator[str]:
    """A fresh channel on the next primary in turn; records where its keys really landed."""
    primaries = cluster.primaries()
    meant = primaries[next(_turn) % len(primaries)]
    name = cluster.channel_on(meant)
    yield name
    for port in cluster.primaries():
        try:
            if cluster.node_client(port).exists(f"rb:{{{name}}}:meta"):
                LANDED[name] = (meant, port)
        except MovedError:
            continue  # not this node's slot


def test_contract_channels_landed_on_every_shard(cluster: Cluster) -> None:
    """Runs after the tests above (module order): each channel's keys sit on the primary its
    hash tag names, and together they covered every shard."""
    if not LANDED:  # run alone (-k), nothing to check: in a full run this is a failure
        if os.environ.get("CI"):
            pytest.fail("no contract test placed a channel before this check", pytrace=False)
        pytest.skip("no test with a channel ran before this one")
    assert all(meant == port for meant, port in LANDED.values()), LANDED
    if len(LANDED) >= len(cluster.primaries()):
        assert {port for _, port in LANDED.values()} == set(cluster.primaries()), LANDED


# -- failover ------------------------------------------------------------------------------------


FAILOVER_LIMITS = {
    "inbox_cap": 1_000_000,
    "pair_rate_burst": 0,
    "sender_rate_burst": 0,
}


def test_primary_killed_during_durable_traffic_loses_no_confirmed_message(
    cluster: Cluster, face: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given: two channels on the shard whose primary will die, one on a shard that stays up
    victim, survivor = cluster.primaries()[0], cluster.primaries()[1]
    names = [cluster.channel_on(victim, "fo-") for _ in range(2)]
    names.append(cluster.channel_on(survivor, "fo-"))
    with (
        bus_on(cluster.url, face, cluster=True) as bus,
        bus_on(cluster.url, face, cluster=True) as other,
    ):
        readers, senders = {}, []
        for n in names:
            ch = bus.channel(n, **FAILOVER_LIMITS)
            readers[n] = ch.join("reader")
            senders.append((ch.join("writer"), "reader"))
        # and a live agent on the failing shard, served from another Bus
        live = Consumer(other.channel(names[0]).join("live"))
        senders.append((senders[0][0], "live"))

        # when: the primary is SIGKILLed mid-traffic; a replica takes over; the old primary
        # comes back as a replica
        def heal(port: int) -> None:
            cluster.restart(port)
            cluster.wait_healthy()

        with live:
            run = run_failover(senders, lambda: (victim, cluster.fail_primary(victim)), heal)
            live.drain()

        # then: the same Buses kept working on the promoted shard; all they confirmed is there
        assert cluster.owner("{" + names[0] + "}") == run.new != victim
        figures = run.verify(readers, set(names[:2])) + "; " + run.verify_live(live)
    with capsys.disabled():
        print(f"\n[cluster failover, {face}] {figures}")


def test_script_flush_and_client_kill_on_every_node_lose_and_double_nothing(
    cluster: Cluster, face: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given: durable traffic to a reader and a live agent on every shard
    names = [cluster.channel_on(p, "sk-") for p in cluster.primaries()]
    with (
        bus_on(cluster.url, face, cluster=True) as bus,
        bus_on(cluster.url, face, cluster=True) as other,
    ):
        readers, senders = {}, []
        for n in names:
            ch = bus.channel(n, **FAILOVER_LIMITS)
            readers[n] = ch.join("reader")
            senders.append((ch.join("writer"), "reader"))
        live = Consumer(other.channel(names[0]).join("live"))
        senders.append((senders[0][0], "live"))

        # when: every node's script cache is flushed and its client connections killed, by turns
        killed = 0
        with live, Traffic(senders) as traffic:
            for turn in range(6):
                target = 100 * (turn + 1)

                def sent_enough(n: int = target) -> bool:
                    return traffic.sent_count() >= n

                wait_until(sent_enough, 10, "traffic")
                for port in cluster.nodes:
                    c = cluster.node_client(port)
                    if turn % 2:
                        c.script_flush()
                    else:
                        killed += int(c.client_kill_filter(_type="normal"))
            wait_until(lambda: traffic.sent_count() >= 700, 10, "traffic after the last blow")
            traffic.stop.set()
            live.drain()
        out = traffic.out

        # then: nothing failed, nothing confirmed is missing, nothing was stored twice
        assert killed > 0, "no bus connection was killed: the test proved nothing"
        assert not out.errors and not out.unconfirmed, (out.errors[:5], out.unconfirmed[:5])
        # a kill that lands between a send's script and its WAIT drops that WAIT, which the
        # send reports as durable=False (never retried: a new connection's WAIT vouches for
        # nothing). Replicas stayed up, so only those sends may come back short, and their
        # entries were appended all the same.
        kill_turns = sum(1 for turn in range(6) if turn % 2 == 0)
        assert len(out.unreached) <= kill_turns * len(senders), out.unreached
        for name, reader in readers.items():
            stored = read_everything(reader)
            sent = out.confirmed_to(name, "reader")
            assert {b: stored.get(b) for b in sent} == sent
            short = {b: i for b, (c, i) in out.unreached.items() if c == name}
            short = {b: i for b, i in short.items() if out.recipient[b] == "reader"}
            assert {b: stored.get(b) for b in short} == short
        mine = out.confirmed_to(names[0], "live")
        assert {b: live.got.get(b) for b in mine} == mine and not live.errors
    with capsys.disabled():
        print(
            f"\n[cluster script flush + client kill, {face}] {killed} connections killed; "
            f"{out.summary()}; {live.summary()}"
        )


def test_unreachable_cluster_is_a_bus_connection_error(face: str) -> None:
    # given: a cluster URL where nothing listens
    url = f"redis://127.0.0.1:{free_port()}/0"
    s = settings(connect_timeout_s=0.5, retry_attempts=1)
    # when / then: the typed error of the bus, from either face, never a raw redis-py one
    with pytest.raises(BusConnectionError):
        if face == "sync":
            Bus.from_url(url, cluster=True, settings=s).channel("nowhere")
        else:
            loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(
                    AsyncBus.from_url(url, cluster=True, settings=s).channel("nowhere")
                )
            finally:
                loop.close()


# -- one retry policy, the bus's (docs/delivery.md#faults-are-not-deaths) -----------------------


def _connection_retry(client: Any) -> Any:
    return client.connection_pool.connection_kwargs["retry"]


def test_every_client_kind_leaves_retrying_to_the_bus(cluster: Cluster) -> None:
    # given: a client of every kind, each face (none of these constructors but the sync
    # Cluster's connects, and the Sentinel address needs nothing listening)
    from redisbus._redis import async_client, sync_client

    s = settings()
    sentinel = f"redis+sentinel://127.0.0.1:{free_port()}/mymaster/0"
    loop = asyncio.new_event_loop()
    try:
        for make in (sync_client, async_client):
            clustered, _ = make(s.model_copy(update={"cluster": True}), cluster.url)
            standalone, _ = make(s, f"redis://127.0.0.1:{free_port()}/0")
            managed, _ = make(s, sentinel)
            # then: redis-py repeats nothing by itself; the bus alone decides what is safe
            assert clustered.retry.get_retries() == 0, make.__name__
            assert _connection_retry(standalone).get_retries() == 0, make.__name__
            assert _connection_retry(managed).get_retries() == 0, make.__name__
            for c in (clustered, standalone, managed):
                closing = c.aclose() if make is async_client else c.close()
                if asyncio.iscoroutine(closing):
                    loop.run_until_complete(closing)
    finally:
        loop.close()


def test_send_whose_reply_is_lost_is_written_once(cluster: Cluster, face: str) -> None:
    # given: a bus whose replies time out fast, and a send to warm its connections
    primary = cluster.primaries()[0]
    name = cluster.channel_on(primary, "once-")
    s = settings(socket_timeout_s=0.15, retry_attempts=3)
    loop = asyncio.new_event_loop()
    bus: Any = (
        Bus.from_url(cluster.url, cluster=True, settings=s)
        if face == "sync"
        else ClusterSynced(AsyncBus.from_url(cluster.url, cluster=True, settings=s), loop)
    )
    try:
        ch = bus.channel(name, pair_rate_burst=1000, pair_rate_per_s=1000)
        a = ch.join("a")
        ch.join("b")
        a.send("b", "warm")
        # when: the shard is busy (a long script) while a send without an idempotency key
        # waits for its reply: the send is executed, but its reply comes too late
        busy = threading.Thread(target=_busy, args=(cluster.node_client(primary), 0.6))
        busy.start()
        time.sleep(0.05)
        with contextlib.suppress(BusConnectionError):  # not retried: it may have been written
            a.send("b", "once")
        busy.join()
        # then: it was written once, never repeated by a client under the bus
        # the client decodes replies (decode_responses=True)
        entries = cast(
            list[tuple[str, dict[str, str]]], cluster.client().xrange(f"rb:{{{name}}}:s")
        )
        assert [f["b"] for _, f in entries] == ["warm", "once"]
    finally:
        bus.close()
        loop.close()


def _busy(node: Any, seconds: float) -> None:
    """Keep a node's one thread in a script for ``seconds`` (below the cluster node timeout)."""
    # Valkey's TIME stands still inside a script (it returns the script's start every time):
    # there the loop watches os.clock(), the CPU time, which Redis 7.0's Lua does not have
    node.eval(
        "local ok, clock = pcall(function() return os.clock end) "
        "local function us() "
        "  if ok and clock then return clock() * 1000000 end "
        "  local t = redis.call('TIME') return t[1] * 1000000 + t[2] "
        "end "
        "local start = us() repeat until us() - start > tonumber(ARGV[1]) "
        "return 1",
        0,
        int(seconds * 1_000_000),
    )
