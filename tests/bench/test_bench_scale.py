"""The scale-out model of the benchmarks (bench/scale.py), at a tiny size, against the
fixtures' real servers: one Redis 7 and a Cluster of three primaries with one replica each.
Checks that the figures the model reports are consistent with each other, not how fast."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, cast

import pytest

from bench.common import Ctx
from bench.scale import ScaleResult, Sizes, capacity, measure_topology, metrics
from bench.shards import Topology

if TYPE_CHECKING:
    from tests.support.cluster_servers import Cluster
    from tests.support.servers import Server

pytest_plugins = ["tests.support.cluster_servers"]

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
    # (instruction counts as bench.instructions gives them: counting them needs valgrind and
    # minutes; test_bench_smoke.py runs the counters themselves)
    result.instructions = {
        "one server": {"per_msg": 430_000.0},
        "raw Streams, one server": {"per_msg": 50_000.0},
        "3-shard Cluster": {"per_msg": 455_000.0},
    }
    result.design = DESIGN
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
    # no redirects; a message's own work (the scripts' commands) is the same on one server and
    # on the Cluster, whose client sends each call to the primary of its slot (no COMMAND
    # GETKEYS, no clock read apart)
    assert run3.redirects == 0
    for name in ("XADD", "RPUSH", "HINCRBY", "HSETNX", "GET", "HGET", "HMGET", "HSET"):
        per_msg = [run.calls.get(name, 0) / run.messages for run in (run1, run3)]
        assert per_msg[0] == pytest.approx(per_msg[1], rel=0.05), (name, per_msg)
    # one entry per message, and two pushes: its id on its recipient's doorbell and the wakeup
    # (the bell was empty: its recipient's wait had taken what was rung before)
    assert run1.calls["XADD"] == run1.messages and run3.calls["XADD"] == run3.messages
    assert run1.calls["RPUSH"] == 2 * run1.messages and run3.calls["RPUSH"] == 2 * run3.messages
    assert "COMMAND|GETKEYS" not in run1.calls and "COMMAND|GETKEYS" not in run3.calls
    assert "EVAL" not in run3.calls
    assert m["one_cmds"] == run1.commands_per_msg and m["cluster_cmds"] == run3.commands_per_msg
    assert m["cmds_ratio"] == pytest.approx(run3.commands_per_msg / run1.commands_per_msg)
    assert sum(run3.shard_commands) == sum(
        c for n, c in run3.calls.items() if n not in ("INFO", "PING")
    )
    # each operation costs the same commands on every shard, in both faces, and on one server
    for op in {o.op for o in one.ops}:
        per_topology = [{o.commands + o.elsewhere for o in t.ops if o.op == op} for t in (one, cl)]
        assert all(len(seen) == 1 for seen in per_topology), (op, per_topology)
        assert per_topology[0] == per_topology[1], (op, per_topology)
        assert {o.shard for o in cl.ops if o.op == op} == {0, 1, 2}
    # memory (the keys' MEMORY USAGE: used_memory deltas are noise at this size): a channel,
    # an agent and a message in flight each take the same on one server and on the Cluster
    for t in (one, cl):
        mem = t.memory
        assert mem is not None
        assert mem.usage_per_channel > 0 and mem.usage_per_agent > 0
        assert mem.usage_per_message > 0
        assert mem.beats >= SIZES.mem_channels and mem.beat_us > 0
    for attr in ("usage_per_channel", "usage_per_agent", "usage_per_message"):
        same = [getattr(t.memory, attr) for t in (one, cl)]
        assert same[0] == pytest.approx(same[1], rel=0.1), (attr, same)
    # the capacity table: more messages never need fewer shards
    shards = [row["shards"] for row in result.capacity["rows"]]
    assert shards == sorted(shards) and shards[0] >= 1
    assert m["per_core"] == pytest.approx(1e6 / m["cluster_cpu_us"])
    # the ≤ 4x target's ratio is one server's life over the raw Streams life of the same fleet;
    # the yardstick's is over raw Streams on one stream, its commands those of its life
    assert m["life_ratio"] == pytest.approx(8.6)
    assert m["design_ir_ratio"] == pytest.approx(4.5) and m["design_cmds"] == 19


#: bench.instructions.design's shape, its figures rounded
DESIGN = {
    "raw Streams, one stream": {"instructions": 73_000.0, "commands": 3.0},
    "raw Streams, 300 streams of a few entries": {"instructions": 55_000.0, "commands": 3.0},
    "smallest design keeping the features": {"instructions": 328_500.0, "commands": 19.0},
    "redisbus": {"instructions": 438_000.0, "commands": 23.0},
}


def test_scale_md_says_which_targets_are_below_the_smallest_design() -> None:
    # SCALE.md's section on the yardstick (bench/design_floor.lua) says, from the counts, what
    # a re-layout could save and which of the ≤ 4x and ≤ 12-command targets are below it
    from types import SimpleNamespace

    from bench.scale_report import _design_lines

    def text(design: object) -> str:
        return "\n".join(_design_lines(cast(ScaleResult, SimpleNamespace(design=design))))

    found = text(DESIGN)
    assert "| smallest design keeping the features | 328,500 | 19.00 | 4.50x | 5.97x |" in found
    assert "save at most 25% of redisbus's instructions per life and 4 of its 23 commands" in found
    assert "≤ 4x raw: the yardstick is 4.50x and 5.97x; ≤ 12 commands: the yardstick runs 19" in (
        found
    )
    # a yardstick within both would say so, not claim a floor it does not show
    within = dict(DESIGN)
    within["smallest design keeping the features"] = {"instructions": 200_000.0, "commands": 12.0}
    assert "The yardstick meets both" in text(within) and "below the yardstick" not in text(within)
    # not counted (no valgrind, a --quick run): the reason, no table
    assert text("not counted in a --quick run").endswith("not counted in a --quick run.\n")


def test_the_capacity_note_says_which_way_cpu_per_message_went_with_the_load() -> None:
    # SCALE.md's line on one server's CPU per message as the client processes grew follows
    # the measurement: it said "fell" even when a loaded two-core machine made it rise
    from bench.scale_report import _load_line

    fell = _load_line(153.0, 1, 109.0, 4)
    assert "spends less CPU per message" in fell and "fell from 153 µs" in fell
    rose = _load_line(185.0, 1, 201.0, 4)
    assert "did not fall" in rose and "went from 185 µs at 1 process to 201 at 4" in rose
    assert "fell" not in rose
