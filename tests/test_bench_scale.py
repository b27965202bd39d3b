"""The scale-out model of the benchmarks (bench/scale.py), at a tiny size, against the
fixtures' real servers: one Redis 7 and a Cluster of three primaries with one replica each.
Checks that the figures the model reports are consistent with each other, not how fast."""

from __future__ import annotations

import uuid

import pytest

from bench.common import Ctx
from bench.scale import ScaleResult, Sizes, capacity, measure_topology, metrics
from bench.shards import Topology
from tests.cluster_servers import Cluster
from tests.servers import Server

pytest_plugins = ["tests.cluster_servers"]

SIZES = Sizes(
    channels=24, agents=3, processes=(2,), duration_s=1.0, op_calls=5, mem_channels=6,
    beat_window_s=1.2,
)  # fmt: skip


def cluster_topology(cluster: Cluster) -> Topology:
    shards = cluster.shards()
    assert all(len(s.slots) == 1 for s in shards), shards
    return Topology(
        "3-shard Cluster",
        cluster.url,
        True,
        tuple(s.primary for s in shards),
        tuple(s.slots[0] for s in shards),
        tuple(r for s in shards for r in s.replicas),
    )


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_scale_model_costs_the_same_per_message_on_one_server_and_a_cluster(
    redis7: Server, redis_cluster: Cluster
) -> None:
    # given one server and a 3-shard Cluster
    redis_cluster.wait_healthy()
    ctx = Ctx(redis7.url, "quick", uuid.uuid4().hex[:6], own_server=False, memory_messages=0)
    one_topo, cluster_topo = Topology.standalone(redis7.url), cluster_topology(redis_cluster)

    # when the scale model runs on both
    one = measure_topology(one_topo, ctx, SIZES)
    cl = measure_topology(cluster_topo, ctx, SIZES)
    result = ScaleResult(SIZES, one, cl, "test")
    result.capacity = capacity(result)
    m = metrics(result)

    # then every channel's keys share one slot, on the primary serving it
    for t in (one, cl):
        assert t.layout.channels == SIZES.channels
        assert t.layout.split == [] and t.layout.misplaced == 0 and t.layout.outside == []
    assert sum(cl.layout.per_shard_keys) == cl.layout.keys
    (run1,), (run3,) = one.runs, cl.runs
    # the channels and the messages spread over every shard, and the per-shard counts add up
    assert sum(run3.shard_channels) == SIZES.channels and min(run3.shard_channels) > 0
    assert run1.messages > 0 and run3.messages > 0
    assert sum(run1.shard_messages) == run1.messages
    assert sum(run3.shard_messages) == run3.messages and min(run3.shard_messages) > 0
    # no redirects, and a message costs the same commands on one server, on each shard
    assert run3.redirects == 0
    assert run1.commands_per_msg == run3.commands_per_msg == m["one_cmds"] == m["cluster_cmds"]
    for i, msgs in enumerate(run3.shard_messages):
        assert run3.shard_commands[i] == msgs * run1.commands_per_msg
    assert m["cmds_ratio"] == 1.0
    # each operation costs the same commands on one server, on every shard and in both faces
    for op in {o.op for o in one.ops}:
        seen = {o.commands for t in (one, cl) for o in t.ops if o.op == op}
        assert len(seen) == 1, (op, seen)
        shards = {o.shard for o in cl.ops if o.op == op}
        assert shards == {0, 1, 2}
    # memory: positive costs that add up; every channel beat in the idle window
    for t in (one, cl):
        mem = t.memory
        assert mem.bytes_per_channel > 0 and mem.bytes_per_agent > 0
        assert mem.bytes_per_message > 0
        assert mem.beats >= SIZES.mem_channels and mem.beat_us > 0
    # the capacity table: more messages never need fewer shards
    shards = [row["shards"] for row in result.capacity["rows"]]
    assert shards == sorted(shards) and shards[0] >= 1
    assert m["per_core"] == pytest.approx(1e6 / m["cluster_cpu_us"])
