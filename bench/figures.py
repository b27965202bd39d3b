"""The figures of docs/benchmarks.md: each redisbus case beside its baseline, and its targets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench import baselines as b
from bench import cases as c
from bench import fanin, scale
from bench.common import Ctx, Metrics
from bench.otel import isolated
from bench.report import Metric, Target

Measure = Callable[[Ctx], Metrics]

THROUGHPUT = Metric("msgs_per_s", "throughput", "msg/s")
P50 = Metric("p50_us", "p50", "µs", higher_is_better=False)
P99 = Metric("p99_us", "p99", "µs", higher_is_better=False)
P50_PACED = Metric("p50_us", "latency p50 at 500 msg/s", "µs", higher_is_better=False)
P99_PACED = Metric("p99_us", "latency p99 at 500 msg/s", "µs", higher_is_better=False)
MISSED = Metric("missed", "messages never consumed", "", higher_is_better=False, ratio=False)
#: The sync face's wake-up, the reference of the async face's.
SYNC_WAIT = "sync wait()"
SERVER_US = Metric("server_us_per_msg", "server CPU per message", "µs", higher_is_better=False)
TRIPS = Metric("round_trips", "round trips per call", "", higher_is_better=False, ratio=False)


@dataclass(frozen=True)
class Figure:
    name: str
    title: str
    subject: Measure
    metrics: tuple[Metric, ...]
    baseline: tuple[str, Measure] | None = None
    targets: tuple[Target, ...] = ()
    refs: tuple[tuple[str, Measure], ...] = ()
    #: The baseline is itself a redisbus case (so it needs the core too).
    baseline_is_bus: bool = False
    #: Cap on rounds (slow figures).
    max_rounds: int | None = None
    note: str = ""


FIGURES: tuple[Figure, ...] = (
    Figure(
        "send",
        "send(), sequential, one client",
        c.bus_send_seq,
        (THROUGHPUT, P50, TRIPS),
        baseline=("raw XADD", b.raw_xadd_seq),
        targets=(Target("msgs_per_s", "ratio_min", 1.0, "≥ 1.0x raw"),),
    ),
    Figure(
        "batch",
        "batched send (send_many, 100 per call)",
        c.bus_send_many,
        (THROUGHPUT, TRIPS),
        baseline=("raw XADD, pipeline of 100", b.raw_xadd_pipelined),
        targets=(Target("msgs_per_s", "ratio_min", 0.8, "≥ 0.8x raw"),),
    ),
    Figure(
        "wakeup",
        "send → wait() wake-up at 1k msg/s (sender in another process)",
        c.bus_wait_wakeup,
        (P50, P99, MISSED),
        baseline=("raw XREADGROUP BLOCK", b.raw_xreadgroup_wakeup),
        targets=(
            Target("p50_us", "ratio_max", 1.3, "≤ 1.3x raw"),
            Target("p99_us", "max", 1500, "≤ 1,500 µs"),
            Target("missed", "max", 0, "none"),
        ),
    ),
    Figure(
        "async-wakeup",
        "send → AsyncBus wait() wake-up at 1k msg/s (sender in another process)",
        c.bus_async_wait_wakeup,
        (P50, P99, MISSED),
        baseline=("redis.asyncio XREADGROUP BLOCK", b.raw_async_xreadgroup_wakeup),
        targets=(
            Target("p50_us", "ratio_max", 1.3, "≤ 1.3x raw"),
            Target("p50_us", "ratio_max", 1.15, "≤ 1.15x sync wait()", ref=SYNC_WAIT),
            Target("p99_us", "max", 1500, "≤ 1,500 µs"),
            Target("missed", "max", 0, "none"),
        ),
        refs=((SYNC_WAIT, c.bus_wait_wakeup),),
        note="the cross-face ratio (async p50 / sync p50) is against the sync face's wait() "
        "measured in the same rounds, alternating with the async one",
    ),
    Figure(
        "recv-wakeup",
        "the receive side of the wake-up: wait() fed by a bare XADD of send()'s entry",
        c.bus_wait_wakeup_xadd,
        (P50, P99, MISSED),
        baseline=("raw XREADGROUP BLOCK", b.raw_xreadgroup_wakeup),
        refs=(("wait() fed by send()", c.bus_wait_wakeup),),
        targets=(Target("missed", "max", 0, "none"),),
        note="no target of its own: it splits the wake-up figure into the receiver's share "
        "(this one against raw) and the sender's (the send()-fed reference against this one)",
    ),
    Figure(
        "signing-send",
        "send() signed with a per-host Ed25519 key (signing off as baseline)",
        c.bus_send_seq_ed25519,
        (THROUGHPUT, P50, TRIPS),
        baseline=("send(), signing off", c.bus_send_seq),
        baseline_is_bus=True,
        refs=(("send(), shared HMAC", c.bus_send_seq_hmac),),
        note="signing is on the sender's side: one signature per send, no extra round trip",
    ),
    Figure(
        "signing-wakeup",
        "wake-up at 1k msg/s, verified with Ed25519 (signing off as baseline)",
        c.bus_wait_wakeup_ed25519,
        (P50, P99, MISSED),
        baseline=("wake-up, signing off", c.bus_wait_wakeup),
        baseline_is_bus=True,
        refs=(("wake-up, shared HMAC", c.bus_wait_wakeup_hmac),),
        targets=(Target("missed", "max", 0, "none"),),
        note="verification runs on the receiver after the fetch; the replay check rides on "
        "the settle script call already in the fetch's pipeline (no extra round trip)",
    ),
    Figure(
        "async",
        "AsyncBus send(), sequential, one agent",
        c.bus_async_send_seq,
        (THROUGHPUT,),
        baseline=("redis.asyncio XADD", b.raw_async_xadd_seq),
    ),
    Figure(
        "async100",
        "AsyncBus: 100 agents in one process, aggregate",
        c.bus_async_many_agents,
        (THROUGHPUT,),
        baseline=("sync send(), one client", c.bus_send_seq),
        baseline_is_bus=True,
        targets=(Target("msgs_per_s", "ratio_min", 3.0, "≥ 3x one sync client"),),
        refs=(("redis.asyncio XADD, 100 tasks", b.raw_async_xadd_concurrent),),
    ),
    Figure(
        "fanin",
        "100 agents waiting on one channel, direct messages from one producer, aggregate",
        fanin.bus_fanin,
        (THROUGHPUT, SERVER_US),
        baseline=("raw XREADGROUP, one stream per consumer", fanin.raw_fanin),
        targets=(Target("msgs_per_s", "ratio_min", 0.8, "≥ 0.8x raw"),),
        refs=(
            ("the same, 10 agents", fanin.bus_fanin_10),
            ("the same, 1,000 agents", fanin.bus_fanin_1000),
            ("raw, one stream, a group per consumer, all blocked on it", fanin.raw_fanin_shared),
            (
                "raw, the same, each woken by a doorbell, reading all since",
                fanin.raw_fanin_bell_scan,
            ),
        ),
        note="each agent blocks on its own doorbell: a direct message wakes its recipient "
        "only, so the server's work per message does not grow with the channel",
        max_rounds=3,
    ),
    Figure(
        "broadcast",
        "broadcast to 100 agents",
        c.bus_broadcast,
        (P50, P99, TRIPS),
        baseline=("raw XADD naming 100", b.raw_xadd_fanout),
        targets=(
            Target("p50_us", "max", 2000, "≤ 2,000 µs"),
            Target("round_trips", "max", 1, "one round trip"),
        ),
    ),
    Figure(
        "fleet",
        "1,000 agents on one channel",
        c.bus_fleet,
        (
            Metric("join_ms_per_agent", "join, per agent", "ms", False),
            Metric("roster_ms", "roster (agents())", "ms", False),
            Metric("tree_ms", "tree()", "ms", False),
            Metric("broadcast_ms", "broadcast to 999", "ms", False),
            Metric("read_us", "read(), per agent", "µs", False),
            Metric("read_round_trips", "read() round trips", "", False),
            Metric("read_commands", "read() server commands (incl. in scripts)", "", False),
            Metric("delivered_frac", "readers that got the broadcast", ""),
        ),
        targets=(Target("delivered_frac", "min", 1.0, "all"),),
        max_rounds=3,
    ),
    Figure(
        "broadcast_state",
        "rate state after every agent broadcasts once (peak)",
        c.bus_broadcast_state,
        (
            Metric("agents", "agents, each broadcasting once", "", ratio=False),
            Metric("rate_fields", "rate hash fields", "", False, False),
            Metric("rate_mib", "rate hash memory", "MiB", False, False),
            Metric("rate_mib_per_1000", "the same, per 1,000 agents", "MiB", False, False),
            Metric("broadcast_ms", "broadcast to all, per call", "ms", False),
        ),
        targets=(Target("rate_mib_per_1000", "max", 10.0, "≤ 10 MB for 1,000 agents"),),
        max_rounds=1,
        note=(
            "before a broadcast stopped keeping a bucket per pair (be9c687, same machine): "
            "1,000,003 fields, 91.9 MiB, 4.41 ms per broadcast"
        ),
    ),
    Figure(
        "memory",
        "messages sent and done, Redis used_memory",
        c.bus_memory,
        (
            Metric("messages", "messages", "", ratio=False),
            Metric("send_per_s", "send rate, batches of 1,000", "msg/s"),
            Metric("bytes_per_msg", "growth per message", "B", False),
            Metric("sent_mib", "after send", "MiB", False),
            Metric("done_mib", "after done", "MiB", False),
            Metric("trimmed_mib", "after trimming", "MiB", False),
            Metric("trimmed_entries", "entries trimmed (Channel.sweep)", "", ratio=False),
            Metric("trim_s", "trimming time", "s", False),
            Metric("done_per_s", "receive + mark_done rate", "msg/s"),
            Metric("missed_by_wait", "left for read() after wait() quiet", "", False, ratio=False),
            Metric("residual_mib", "left after trimming", "MiB", False),
            Metric("residual_pct", "left after trimming, % of growth", "%", False, ratio=False),
        ),
        baseline=("raw XADD + XACK + XTRIM", b.raw_memory),
        targets=(
            Target("residual_mib", "max", 1.0, "flat: ≤ 1 MiB left"),
            Target("missed_by_wait", "max", 0, "none"),
        ),
        max_rounds=1,
    ),
    Figure(
        "faststream_pub",
        "publish, one at a time (async) vs FastStream",
        c.bus_async_send_seq,
        (THROUGHPUT,),
        baseline=("FastStream publish", b.faststream_publish),
        targets=(Target("msgs_per_s", "ratio_min", 1.0, "faster (> 1x)"),),
    ),
    Figure(
        "faststream_pubsub",
        "publish → consume, one loop, vs FastStream group subscriber",
        c.bus_async_pubsub,
        (THROUGHPUT, P50_PACED, P99_PACED, MISSED),
        baseline=("FastStream publish → subscriber", b.faststream_pubsub),
        targets=(
            Target("msgs_per_s", "ratio_min", 1.0, "faster (> 1x)"),
            Target("missed", "max", 0, "none"),
        ),
    ),
)

OTEL_NOTE = (
    "Each side in a fresh process: opentelemetry not importable (the extra absent) as the "
    "baseline, the API without an SDK as redisbus, and an SDK with a BatchSpanProcessor and "
    "an exporter that drops the spans as the reference."
)

FIGURES += (
    Figure(
        "otel_send",
        "send() with tracing: extra absent / API, no SDK / SDK configured",
        isolated("api", c.bus_send_seq),
        (THROUGHPUT, P50),
        baseline=("opentelemetry absent", isolated("off", c.bus_send_seq)),
        baseline_is_bus=True,
        refs=(("SDK, BatchSpanProcessor", isolated("sdk", c.bus_send_seq)),),
        targets=(Target("msgs_per_s", "ratio_min", 0.95, "API only ≥ 0.95x absent"),),
        note=OTEL_NOTE,
    ),
    Figure(
        "otel_wakeup",
        "send → wait() wake-up with tracing: extra absent / API, no SDK / SDK configured",
        isolated("api", c.bus_wait_wakeup),
        (P50, P99, MISSED),
        baseline=("opentelemetry absent", isolated("off", c.bus_wait_wakeup)),
        baseline_is_bus=True,
        refs=(("SDK, BatchSpanProcessor", isolated("sdk", c.bus_wait_wakeup)),),
        targets=(
            Target("p50_us", "ratio_max", 1.05, "API only ≤ 1.05x absent"),
            Target("missed", "max", 0, "none"),
        ),
        note=OTEL_NOTE,
    ),
)

# The scale-out model (bench/scale.py): its own Cluster, one round; details in bench/SCALE.md.
FIGURES += (
    Figure(
        "scale",
        "scale-out: 10,000 agents over 1,000 channels, one server vs a 3-shard Cluster",
        scale.run,
        (
            Metric("one_cmds", "commands per message, one server", "", False, False),
            Metric("cluster_cmds", "commands per message, Cluster", "", False, False),
            Metric("cmds_ratio", "commands per message, Cluster / one server", "", False, False),
            Metric("one_us", "execution µs per message, one server", "µs", False, False),
            Metric("cluster_us", "execution µs per message, Cluster", "µs", False, False),
            Metric("us_ratio", "execution µs per message, Cluster / one server", "", False, False),
            Metric("one_cpu_us", "server CPU µs per message, one server", "µs", False, False),
            Metric("cluster_cpu_us", "server CPU µs per message, Cluster", "µs", False, False),
            Metric(
                "single_cpu_us", "server CPU µs per message, 1-shard Cluster", "µs", False, False
            ),
            Metric("scale_cpu_ratio", "server CPU µs per message, 3 shards / 1", "", False, False),
            Metric("one_ir", "server instructions per message, one server", "", False, False),
            Metric("cluster_ir", "server instructions per message, Cluster", "", False, False),
            Metric(
                "ir_ratio",
                "server instructions per message, Cluster / one server",
                "",
                False,
                False,
            ),
            Metric("raw_ir", "server instructions per message, raw Streams life", "", False, False),
            Metric(
                "life_ratio",
                "server instructions per message, one server / raw Streams life",
                "",
                False,
                False,
            ),
            Metric(
                "design_ir_ratio",
                "the smallest design keeping the features: instructions / raw, one stream",
                "",
                False,
                False,
            ),
            Metric(
                "design_cmds",
                "the smallest design keeping the features: commands per message",
                "",
                False,
                False,
            ),
            Metric("one_rate", "throughput, one server (best of 1-4 processes)", "msg/s"),
            Metric("cluster_rate", "throughput, Cluster (best of 1-4 processes)", "msg/s"),
            Metric("spread", "channels on the busiest shard / mean", "", False, False),
            Metric("msg_spread", "messages on the busiest shard / mean", "", False, False),
            Metric("redirects", "MOVED/ASK/CROSSSLOT replies", "", False, False),
            Metric("split", "channels with keys off their slot", "", False, False),
            Metric("per_core", "messages/s per shard core (server CPU)", "msg/s", ratio=False),
            Metric("one_per_core", "messages/s per core, one server", "msg/s", ratio=False),
            Metric("saturates_at", "busiest of 3 shards saturates at", "msg/s", ratio=False),
            Metric("bytes_agent", "bytes per idle agent", "B", False, False),
            Metric("bytes_channel", "bytes per channel", "B", False, False),
            Metric("bytes_msg", "bytes per message in flight", "B", False, False),
            Metric("agents_per_gib", "idle agents per GiB", "", ratio=False),
            Metric("shards_10000", "shards for 100k agents at 10k msg/s", "", False, False),
            Metric("shards_100000", "shards for 100k agents at 100k msg/s", "", False, False),
        ),
        targets=(
            Target("one_cmds", "max", 12, "≤ 12 per message life"),
            Target("life_ratio", "max", 4.0, "≤ 4x the raw Streams life"),
            Target("cmds_ratio", "max", 1.01, "same as one server (±1%)"),
            Target("us_ratio", "max", 1.15, "≤ 1.15x one server"),
            Target("scale_cpu_ratio", "max", 1.15, "≤ 1.15x one shard"),
            Target("ir_ratio", "max", 1.05, "same as one server (≤ 1.05x)"),
            Target("spread", "max", 1.15, "≤ 1.15x the mean"),
            Target("redirects", "max", 0, "none"),
            Target("split", "max", 0, "none"),
        ),
        max_rounds=1,
        note="bench/SCALE.md has the per-operation, per-shard and capacity tables, and the "
        "message's life beside the smallest design that keeps the bus's features "
        "(bench/design_floor.lua; its two rows here): what the ≤ 12-command and ≤ 4x targets "
        "ask of any such design; client processes and every redis-server share this machine's "
        "cores",
    ),
)

BY_NAME = {f.name: f for f in FIGURES}
