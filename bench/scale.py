"""The scale-out model, measured (figure ``scale``): one server beside a private Cluster of
three primaries with one replica each, the same fleet on both.

1. What each operation costs the shard serving its channel (commands, execution µs) and the
   client calling it (wall and CPU µs, sync and async faces): ``bench.scale_ops``.
2. What Redis memory a channel, an idle agent and a message in flight take, and what a
   channel's heartbeat costs while the fleet idles.
3. The fleet under load from 1, 2, 4 client processes: commands, execution µs and CPU µs per
   message on each shard, channels and messages per shard, redirects: ``bench.scale_load``.
4. From those, a capacity table: messages/s per shard core, agents per GiB, and the shards
   a fleet of 100,000 agents needs at a given message rate.

This machine has few cores, shared by the client processes and every redis-server: wall
throughput here says how fast the clients go, not where a shard saturates. Per-core figures
come from what each shard's main thread spent per message (``INFO cpu``), and, as an upper
bound, from command execution alone (``INFO commandstats``).
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.cluster import private_cluster, private_pair
from bench.common import Ctx, Metrics
from bench.scale_load import KeyLayout, LoadRun, flush, key_layout, load_run
from bench.scale_ops import Footprint, OpCost, footprint, op_costs
from bench.shards import Topology

#: The fleet of the issue: 10,000 agents over 1,000 channels.
CHANNELS, AGENTS = 1_000, 10
#: A shard is planned to run its core at most this busy.
HEADROOM = 0.7
#: Fleet sizes and message rates of the capacity table.
FLEET = 100_000
RATES = (1_000, 10_000, 100_000, 1_000_000)
#: Little's law for messages in flight: seconds from send to done (an agent's turn).
IN_FLIGHT_S = 10.0
HEARTBEAT_S = 5.0  # BusSettings.heartbeat_s's default
#: Memory a shard's primary is planned to hold (GiB).
SHARD_GIB = 8


@dataclass
class Sizes:
    channels: int
    agents: int
    processes: tuple[int, ...]
    duration_s: float
    op_calls: int
    mem_channels: int
    beat_window_s: float = 3.0

    @classmethod
    def of(cls, ctx: Ctx) -> Sizes:
        if ctx.mode == "quick":
            return cls(100, AGENTS, (1, 2), 2.0, 30, 100)
        return cls(CHANNELS, AGENTS, (1, 2, 4), 8.0, 100, CHANNELS)


@dataclass
class TopologyResult:
    topology: Topology
    ops: list[OpCost]
    memory: Footprint | None
    runs: list[LoadRun]
    layout: KeyLayout

    def per_msg(self, attr: str) -> float:
        """Median over the load runs of a per-message figure."""
        values: list[float] = [getattr(r, attr) for r in self.runs]
        return statistics.median(values)


@dataclass
class ScaleResult:
    sizes: Sizes
    one: TopologyResult
    cluster: TopologyResult
    cluster_version: str
    #: a Cluster of one shard (one primary, one replica: the processes of ``one``), load only
    single: TopologyResult | None = None
    capacity: dict[str, Any] = field(default_factory=dict)
    #: server instructions per message by topology (``bench.instructions.fleet``), when
    #: valgrind is on PATH; else why not
    instructions: dict[str, dict[str, float]] | str = ""
    #: a message's life on raw Streams, in the smallest design that keeps the bus's features
    #: and in redisbus (``bench.instructions.design``), when valgrind is on PATH; else why not
    design: dict[str, dict[str, float]] | str = ""

    @property
    def loaded(self) -> list[TopologyResult]:
        """The topologies under load, fewest shards first."""
        return [t for t in (self.one, self.single, self.cluster) if t is not None]


#: The last measurement, for ``bench.scale_report`` to write out after the run.
LAST: list[ScaleResult] = []


def measure_topology(
    topo: Topology, ctx: Ctx, sizes: Sizes, load_only: bool = False
) -> TopologyResult:
    prefix = ctx.name("scale")
    ops: list[OpCost] = []
    memory: Footprint | None = None
    if not load_only:
        ops = op_costs(topo, prefix, k=sizes.agents - 1, n=sizes.op_calls)
        flush(topo)
        memory = footprint(topo, prefix, sizes.mem_channels, sizes.agents, sizes.beat_window_s)
    runs: list[LoadRun] = []
    layout: KeyLayout | None = None
    for n in sizes.processes:
        flush(topo)
        run_prefix = f"{prefix}-p{n}"
        runs.append(load_run(topo, run_prefix, sizes.channels, sizes.agents, n, sizes.duration_s))
        layout = key_layout(topo, run_prefix)
    flush(topo)
    assert layout is not None
    return TopologyResult(topo, ops, memory, runs, layout)


def run(ctx: Ctx) -> Metrics:
    """The ``scale`` figure: both topologies, then the capacity model."""
    sizes = Sizes.of(ctx)
    with private_pair() as pair:
        shard = pair.shards[0]
        topo = Topology(
            "one server", pair.url, False, (shard.primary,), ((0, 16_383),), tuple(shard.replicas)
        )
        one = measure_topology(topo, ctx, sizes)
    with private_cluster(shards=1) as pc:
        shard = pc.shards[0]
        topo = Topology(
            "1-shard Cluster", pc.url, True, (shard.primary,), ((0, 16_383),), tuple(shard.replicas)
        )
        single = measure_topology(topo, ctx, sizes, load_only=True)
    with private_cluster() as pc:
        topo = Topology(
            "3-shard Cluster",
            pc.url,
            True,
            tuple(pc.primaries),
            tuple((s.lo, s.hi) for s in pc.shards),
            tuple(pc.replicas),
        )
        cluster = measure_topology(topo, ctx, sizes)
    result = ScaleResult(sizes, one, cluster, pc.version, single)
    result.instructions = instruction_counts(ctx.mode == "quick")
    result.design = design_counts(ctx.mode == "quick")
    result.capacity = capacity(result)
    LAST[:] = [result]
    return metrics(result)


def instruction_counts(quick: bool = False) -> dict[str, dict[str, float]] | str:
    """The fleet's server instructions per message on one server and on Clusters of 1 and 3
    shards (the primaries under callgrind): what µs on a shared machine cannot show, repeatable
    to about 1%. Needs valgrind; a ``--quick`` run leaves them out (a minute and more under
    valgrind)."""
    from bench import instructions

    return _uncounted(quick) or instructions.fleet()


def design_counts(quick: bool = False) -> dict[str, dict[str, float]] | str:
    """A message's life counted on raw Streams, in the smallest design that keeps the bus's
    features and in redisbus (``bench.instructions.design``): what a re-layout could reach.
    Needs valgrind, as :func:`instruction_counts`; left out of a ``--quick`` run."""
    from bench import instructions

    return _uncounted(quick) or instructions.design()


def _uncounted(quick: bool) -> str:
    """Why instructions are not counted in this run ("" when they are)."""
    if quick:
        return "not counted in a --quick run"
    missing = [t for t in ("valgrind", "callgrind_control") if not shutil.which(t)]
    if missing:
        return f"not counted: needs {' and '.join(missing)} on PATH (Debian: valgrind)"
    return ""


def spread(counts: list[int]) -> float:
    """Busiest shard over the mean."""
    return max(counts) / statistics.fmean(counts) if counts and sum(counts) else math.nan


def capacity(r: ScaleResult) -> dict[str, Any]:
    c = r.cluster
    cpu_us = c.per_msg("cpu_us_per_msg")
    exec_us = c.per_msg("usec_per_msg")
    replica_cpu_us = statistics.median(x.replica_cpu_s * 1e6 / x.messages for x in c.runs)
    mem = c.memory
    assert mem is not None
    per_agent = mem.bytes_per_agent + mem.bytes_per_channel / r.sizes.agents
    chan_spread = spread(c.runs[-1].shard_channels)
    shards = len(c.topology.primaries)
    per_core = 1e6 / cpu_us
    channels = FLEET // r.sizes.agents
    beat_cores = channels / HEARTBEAT_S * mem.beat_cpu_us / 1e6
    # what a message costs a server when the client reaches it as it reaches one server (one
    # round trip per call, no COMMAND GETKEYS): the same scripts, so the same work per message
    one_cpu_us = r.one.per_msg("cpu_us_per_msg")
    rows = []
    for rate in RATES:
        cores = rate * cpu_us / 1e6 + beat_cores
        # at N shards the busiest holds ~spread/N of the channels: N = cores x spread / headroom
        by_cpu = max(1, math.ceil(cores * chan_spread / HEADROOM))
        cores_one = rate * one_cpu_us / 1e6 + beat_cores
        by_cpu_one = max(1, math.ceil(cores_one * chan_spread / HEADROOM))
        in_flight = rate * IN_FLIGHT_S
        gib = (FLEET * per_agent + in_flight * mem.bytes_per_message) / 2**30
        by_mem = max(1, math.ceil(gib / SHARD_GIB))
        rows.append(
            {
                "rate": rate,
                "cores": cores,
                "by_cpu": by_cpu,
                "gib": gib,
                "by_mem": by_mem,
                "shards": max(by_cpu, by_mem),
                "shards_one_path": max(by_cpu_one, by_mem),
            }
        )
    return {
        "cpu_us_per_msg": cpu_us,
        "exec_us_per_msg": exec_us,
        "replica_cpu_us_per_msg": replica_cpu_us,
        "msgs_per_core": per_core,
        "msgs_per_core_exec": 1e6 / exec_us,
        "one_cpu_us_per_msg": one_cpu_us,
        "msgs_per_core_one_path": 1e6 / one_cpu_us,
        "bytes_per_agent_with_channel": per_agent,
        "agents_per_gib": 2**30 / per_agent,
        "agents_per_gib_in_flight": 2**30 / (per_agent + mem.bytes_per_message),
        "channel_spread": chan_spread,
        "saturates_at": per_core * shards / chan_spread,
        "beat_cores_100k": beat_cores,
        "fleet_channels": channels,
        "rows": rows,
    }


def metrics(r: ScaleResult) -> Metrics:
    one, cl, cap = r.one, r.cluster, r.capacity
    mem = cl.memory
    assert mem is not None
    out: Metrics = {
        "one_cmds": one.per_msg("commands_per_msg"),
        "cluster_cmds": cl.per_msg("commands_per_msg"),
        "one_us": one.per_msg("usec_per_msg"),
        "cluster_us": cl.per_msg("usec_per_msg"),
        "one_cpu_us": one.per_msg("cpu_us_per_msg"),
        "cluster_cpu_us": cl.per_msg("cpu_us_per_msg"),
        "one_rate": max(x.msgs_per_s for x in one.runs),
        "cluster_rate": max(x.msgs_per_s for x in cl.runs),
        "spread": cap["channel_spread"],
        "msg_spread": max(spread(x.shard_messages) for x in cl.runs),
        "redirects": float(sum(x.redirects for x in cl.runs)),
        "split": float(len(cl.layout.split) + cl.layout.misplaced),
        "per_core": cap["msgs_per_core"],
        "one_per_core": cap["msgs_per_core_one_path"],
        "saturates_at": cap["saturates_at"],
        "bytes_agent": mem.bytes_per_agent,
        "bytes_channel": mem.bytes_per_channel,
        "bytes_msg": mem.bytes_per_message,
        "agents_per_gib": cap["agents_per_gib"],
    }
    if r.single is not None:
        out["single_cmds"] = r.single.per_msg("commands_per_msg")
        out["single_cpu_us"] = r.single.per_msg("cpu_us_per_msg")
        out["scale_cpu_ratio"] = out["cluster_cpu_us"] / out["single_cpu_us"]
    if isinstance(r.instructions, dict):
        out["one_ir"] = r.instructions["one server"]["per_msg"]
        out["cluster_ir"] = r.instructions["3-shard Cluster"]["per_msg"]
        out["ir_ratio"] = out["cluster_ir"] / out["one_ir"]
        out["raw_ir"] = r.instructions["raw Streams, one server"]["per_msg"]
        out["life_ratio"] = out["one_ir"] / out["raw_ir"]
    if isinstance(r.design, dict):
        from bench.instructions import RAW_DEEP, YARDSTICK

        floor = r.design[YARDSTICK]
        out["design_ir_ratio"] = floor["instructions"] / r.design[RAW_DEEP]["instructions"]
        out["design_cmds"] = floor["commands"]
    out["cmds_ratio"] = out["cluster_cmds"] / out["one_cmds"]
    out["us_ratio"] = out["cluster_us"] / out["one_us"]
    for row in cap["rows"]:
        out[f"shards_{row['rate']}"] = float(row["shards"])
    return out
