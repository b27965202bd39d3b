"""After a ``python -m bench`` run: ``SCALE.md`` from the ``scale`` figure, and the plots
(matplotlib PNGs in ``plots/`` beside the markdown): throughput against client processes for
one server and the Cluster, and the wake-up latency distributions every wake-up figure of the
run recorded (``quantiles_us``), each face beside raw Redis. RESULTS.md gets links to them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench import report
from bench.report import FigureResult
from bench.scale import HEADROOM, IN_FLIGHT_S, LAST, SHARD_GIB, ScaleResult, TopologyResult

PLOTS = "plots"
THROUGHPUT_PNG = "scale-throughput.png"
WAKEUP_PNG = "wakeup-latency.png"


def wakeup_png(md_path: Path) -> str:
    """The wake-up plot's file name for the table at ``md_path``: the full run's
    (``RESULTS.md``) is the committed plot; any other table has its own, named after it, so a
    run of some figures leaves the plot the full table links alone."""
    if md_path.name == "RESULTS.md":
        return WAKEUP_PNG
    return f"wakeup-latency-{md_path.stem.lower()}.png"


def write(figures: list[FigureResult], machine: dict[str, Any], md_path: Path) -> list[Path]:
    """Write what this run has data for; return the paths written."""
    out_dir = md_path.parent
    written: list[Path] = []
    links: list[str] = []
    ran_scale = any(f.name == "scale" and not f.subject.error for f in figures)
    if ran_scale and LAST:
        png = out_dir / PLOTS / THROUGHPUT_PNG
        plot_throughput(LAST[0], png)
        scale_md = out_dir / "SCALE.md"
        scale_md.write_text(markdown(LAST[0], machine))
        written += [scale_md, png]
        links.append(
            "- The scale-out model (figure `scale`): `bench/SCALE.md`, "
            f"`bench/{PLOTS}/{THROUGHPUT_PNG}`"
        )
    series = wakeup_series(figures)
    if series:
        name = wakeup_png(md_path)
        png = out_dir / PLOTS / name
        plot_wakeups(series, png)
        written.append(png)
        links.append(f"- Wake-up latency distributions: `bench/{PLOTS}/{name}`")
    if links:
        # paths, not links: docs/benchmarks.md includes this file, from another directory
        with md_path.open("a") as f:
            f.write("\n" + "\n".join(["See also:", "", *links]) + "\n")
    return written


# --- plots --------------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(r: ScaleResult, path: Path) -> None:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 5.2))
    styles = {r.one.topology.label: ("o", "C0"), r.cluster.topology.label: ("s", "C1")}
    for t in r.loaded:
        marker, color = styles.get(t.topology.label, ("^", "C2"))
        procs = [x.processes for x in t.runs]
        label = t.topology.label
        ax1.plot(procs, [x.msgs_per_s for x in t.runs], marker=marker, color=color, label=label)
        ax2.plot(
            procs,
            [x.cpu_us_per_msg for x in t.runs],
            marker=marker,
            color=color,
            label=f"{label}: main-thread CPU",
        )
        ax2.plot(
            procs,
            [x.usec_per_msg for x in t.runs],
            marker=marker,
            color=color,
            linestyle="--",
            label=f"{label}: command execution",
        )
    s = r.sizes
    ax1.set_title(f"send + wait + mark_done, {s.channels * s.agents:,} agents")
    ax1.set_xlabel("client processes (sharing the machine's cores with the servers)")
    ax1.set_ylabel("messages/s")
    ax1.set_ylim(bottom=0)
    ax2.set_title("server µs per message, all primaries")
    ax2.set_xlabel("client processes")
    ax2.set_ylabel("µs per message")
    ax2.set_ylim(bottom=0)
    for ax in (ax1, ax2):
        ax.set_xticks(list(s.processes))
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8, loc="upper left")
    ax2.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def wakeup_series(figures: list[FigureResult]) -> list[tuple[str, list[float]]]:
    """(label, pooled quantiles in µs) of every side of every wake-up figure that recorded
    its distribution (left out: the signing and tracing variants, which compare settings, and
    the receive side's split, which repeats the wake-up's sides)."""
    out: list[tuple[str, list[float]]] = []
    for f in figures:
        if "wakeup" not in f.name or f.name.startswith(("signing", "otel", "recv")):
            continue
        for side in (f.baseline, f.subject, *f.refs):
            if side is None or side.error:
                continue
            pooled = sorted(v for run in side.quantiles for v in run.get("", []))
            if pooled:
                label = side.label if side is not f.subject else f"redisbus ({f.name})"
                out.append((label, pooled))
    return out


def plot_wakeups(series: list[tuple[str, list[float]]], path: Path) -> None:
    plt = _pyplot()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, values in series:
        n = len(values)
        ax.plot(values, [(i + 1) / n for i in range(n)], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("send → wake-up latency, µs (sender in another process, 1k msg/s)")
    ax.set_ylabel("fraction of messages")
    ax.set_title("wake-up latency distributions, each face beside raw Redis")
    ax.axhline(0.5, color="grey", linewidth=0.5)
    ax.axhline(0.99, color="grey", linewidth=0.5)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- SCALE.md -----------------------------------------------------------------------------------


def _n(v: float, digits: int = 1) -> str:
    if math.isnan(v):
        return "—"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _ops_tables(r: ScaleResult) -> list[str]:
    sync = [o for t in (r.one, r.cluster) for o in t.ops if o.face == "sync"]
    ops = list(dict.fromkeys(o.op for o in sync))
    shards = len(r.cluster.topology.primaries)
    head = ["operation", "sent", "one server: cmds / µs"]
    head += [f"Cluster shard {i}: cmds / µs" for i in range(shards)]
    rows = []
    for op in ops:
        mine = [o for o in sync if o.op == op]
        one = next(o for o in mine if o.topology == r.one.topology.label)
        row = [op, one.sent, f"{one.commands:.1f} / {one.server_us:.1f}"]
        for i in range(shards):
            c = next(o for o in mine if o.topology != one.topology and o.shard == i)
            more = f" (+{c.elsewhere:.1f} elsewhere)" if c.elsewhere else ""
            row.append(f"{c.commands:.1f}{more} / {c.server_us:.1f}")
        rows.append(row)
    lines = _table(head, rows)
    diff = max(
        abs(a.commands + a.elsewhere - b.commands - b.elsewhere)
        for t in (r.one, r.cluster)
        for a in t.ops
        for b in t.ops
        if a.face == "sync" and b.face == "async" and a.op == b.op and a.shard == b.shard
    )
    lines += [
        "",
        f"The async face sends the same commands (largest difference in server commands per "
        f"call between the faces: {diff:.1f}).",
        "",
        "Client cost per call, by face (one server / Cluster, shard 0): wall p50 µs and the "
        "calling process's CPU µs.",
        "",
    ]
    head = ["operation", "sync wall", "sync CPU", "async wall", "async CPU"]
    rows = []
    for op in ops:
        cells = [op]
        for face in ("sync", "async"):
            wall: list[str] = []
            cpu: list[str] = []
            for t in (r.one, r.cluster):
                o = next(o for o in t.ops if o.op == op and o.face == face and o.shard == 0)
                wall.append(_n(o.wall_us))
                cpu.append(_n(o.client_cpu_us))
            cells += [" / ".join(wall), " / ".join(cpu)]
        rows.append(cells)
    return lines + _table(head, rows)


def _memory_tables(r: ScaleResult) -> list[str]:
    head = ["", "per channel", "per idle agent", "per message in flight", "left per agent"]
    head += ["beat µs (exec / CPU)"]
    rows = []
    for t in (r.one, r.cluster):
        m = t.memory
        assert m is not None
        rows.append(
            [
                t.topology.label,
                f"{_n(m.bytes_per_channel)} B ({_n(m.usage_per_channel)})",
                f"{_n(m.bytes_per_agent)} B ({_n(m.usage_per_agent)})",
                f"{_n(m.bytes_per_message)} B ({_n(m.usage_per_message)})",
                f"{_n(m.residual_per_agent)} B",
                f"{_n(m.beat_us)} / {_n(m.beat_cpu_us)}",
            ]
        )
    m = r.cluster.memory
    assert m is not None
    lines = _table(head, rows)
    lines += [
        "",
        f"{m.channels:,} channels of {m.agents // m.channels} agents: `used_memory` summed over "
        "the primaries as the channels are created, the agents join (and beat once), each agent "
        "is sent one message, and all are done and swept ('left per agent'); in brackets, "
        "`MEMORY USAGE` summed over the channels' keys (the values without the allocator's "
        "and the keyspace's overhead). A beat is one "
        f"script call per channel per `heartbeat_s` ({m.beats:,} in the idle window). One "
        "channel's keys (`MEMORY USAGE`, Cluster), idle and with one message in flight per agent:",
        "",
    ]
    keys = list(dict.fromkeys([*m.key_bytes_loaded, *m.key_bytes_idle]))
    rows = [
        [f"`{k}`", f"{m.key_bytes_idle.get(k, 0):,}", f"{m.key_bytes_loaded.get(k, 0):,}"]
        for k in keys
    ]
    return lines + _table(["key", "idle B", "loaded B"], rows)


def _load_tables(r: ScaleResult) -> list[str]:
    head = ["topology", "processes", "msg/s", "cmds/msg", "exec µs/msg", "CPU µs/msg"]
    head += ["replica CPU µs/msg", "client CPU µs/msg", "shard CPU use", "redirects"]
    rows = []
    for t in r.loaded:
        for x in t.runs:
            use = " / ".join(f"{u:.2f}" for u in x.utilisation())
            rows.append(
                [
                    t.topology.label,
                    str(x.processes),
                    _n(x.msgs_per_s),
                    f"{x.commands_per_msg:.2f}",
                    _n(x.usec_per_msg),
                    _n(x.cpu_us_per_msg),
                    _n(x.replica_cpu_s * 1e6 / x.messages),
                    _n(x.client_cpu_us_per_msg),
                    use,
                    str(x.redirects),
                ]
            )
    lines = _table(head, rows)
    lines += ["", *_by_name(r)]
    c: TopologyResult = r.cluster
    head = ["shard", "slots", "channels", "keys"]
    head += [f"messages, {x.processes} proc" for x in c.runs]
    head += ["cmds/msg", "exec µs/msg", "CPU µs/msg"]
    rows = []
    last = c.runs[-1]
    for i, (lo, hi) in enumerate(c.topology.ranges):
        msgs = last.shard_messages[i] or 1
        rows.append(
            [
                str(i),
                f"{lo}-{hi}",
                str(last.shard_channels[i]),
                f"{c.layout.per_shard_keys[i]:,}",
                *(f"{x.shard_messages[i]:,}" for x in c.runs),
                f"{last.shard_commands[i] / msgs:.2f}",
                _n(last.shard_usec[i] / msgs),
                _n(last.shard_cpu_s[i] * 1e6 / msgs),
            ]
        )
    lay = c.layout
    lines += [
        "",
        f"Per shard, Cluster (per-message columns at {last.processes} processes):",
        "",
        *_table(head, rows),
        "",
        f"Key layout after the run: {lay.channels:,} channels, {lay.keys:,} keys; channels with "
        f"keys in more than one slot: {len(lay.split)}; keys on a primary that does not serve "
        f"their slot: {lay.misplaced}. The one key outside every channel's slot is the bus's "
        f"set of channel names (on shard {lay.registry_shard}), written when a channel is "
        "created, never per message.",
    ]
    return lines


def _by_name(r: ScaleResult) -> list[str]:
    """Commands per message by name on each topology (the most processes)."""
    last = [t.runs[-1] for t in r.loaded]
    names = sorted({n for x in last for n in x.calls}, key=lambda n: -last[-1].calls.get(n, 0))
    rows = []
    for name in names:
        per = [x.calls.get(name, 0) / x.messages for x in last]
        if max(per) >= 0.005:
            rows.append([f"`{name}`", *(f"{v:.2f}" for v in per)])
    idle = "; ".join(
        f"{t.topology.label}: " + " / ".join(f"{u:.3f}" for u in t.runs[-1].shard_idle_cpu)
        for t in r.loaded
    )
    return [
        "Server commands per message by name (those scripts run included), "
        f"{last[-1].processes} processes:",
        "",
        *_table(["command", *(t.topology.label for t in r.loaded)], rows),
        "",
        "CPU µs per message leave out what each primary spends with the fleet joined and "
        f"silent, measured just before each run ({idle} of a core).",
    ]


def _scale_line(r: ScaleResult) -> list[str]:
    if r.single is None:
        return []
    one, three = r.single, r.cluster
    o1, on = r.one.runs[0], r.one.runs[-1]
    pairs = "; ".join(
        f"{t.topology.label}, {x.processes} proc: {_n(x.msgs_per_s / len(x.shard_messages))} "
        f"msg/s per shard, {_n(x.cpu_us_per_msg)} µs"
        for t in (one, three)
        for x in t.runs
    )
    return [
        f"- **Adding shards adds no commands per message**: "
        f"{three.per_msg('commands_per_msg'):.1f} on 3 shards, "
        f"{one.per_msg('commands_per_msg'):.1f} on a 1-shard Cluster with the same client path "
        f"(medians over the process counts); CPU per message {_n(three.per_msg('cpu_us_per_msg'))}"
        f" and {_n(one.per_msg('cpu_us_per_msg'))} µs.",
        _load_line(o1.cpu_us_per_msg, o1.processes, on.cpu_us_per_msg, on.processes)
        + " Compare shards at the same load per shard, not at the same process count "
        f"({pairs}). The Cluster's shards ran far from a full core here, so their CPU per "
        "message is high and the capacity per core here is a floor.",
    ]


def _load_line(first: float, first_procs: int, last: float, last_procs: int) -> str:
    """What one server's CPU per message did as the client processes grew, as measured: a
    busier server usually spends less (more requests share each pass of its event loop), but
    on a shared two-core machine the clients can take the cores from it instead."""
    span = f"{_n(first)} µs at {first_procs} process to {_n(last)} at {last_procs}"
    if last < first:
        return (
            f"- **A busier server spends less CPU per message**: one server's fell from {span},"
            " as more requests share each pass of its event loop."
        )
    return (
        f"- **One server's CPU per message did not fall with the load here**: it went from "
        f"{span}; with the client processes on the same two cores, a busier server is also a "
        "server with less of a core to itself."
    )


def _instruction_lines(r: ScaleResult) -> list[str]:
    from bench.instructions import AGENTS, FLEET_CHANNELS, FLEET_CYCLES

    head = [
        "## Server instructions per message",
        "",
        "Server µs move by a third between runs on a shared machine; the instructions a server "
        "runs do not (repeatable to about 1%). `python -m bench.instructions --fleet`: each "
        "server under valgrind's callgrind (no replicas), the fleet's cycle (send, `wait()`, "
        f"`mark_done`) over {FLEET_CHANNELS} channels of {AGENTS} agents, one turn of every agent "
        f"first, then {FLEET_CYCLES:,} messages counted, less what the servers run idle over as "
        "long:",
        "",
    ]
    if isinstance(r.instructions, str):
        return [*head, f"{r.instructions}.", ""]
    one = r.instructions["one server"]["per_msg"]
    rows = []
    for topo, v in r.instructions.items():
        shards = [v[k] for k in sorted(k for k in v if k.startswith("server"))]
        rows.append(
            [
                topo,
                f"{v['per_msg']:,.0f}",
                f"{v['per_msg'] / one:.3f}x",
                " / ".join(f"{x:,.0f}" for x in shards),
                f"{v['idle_share']:.2%}",
            ]
        )
    table = _table(
        ["topology", "instructions per message", "/ one server", "per server", "idle, subtracted"],
        rows,
    )
    return [
        *head,
        *table,
        "",
        "The same messages cost a Cluster's primaries, all together, what they cost one "
        "server, give or take Cluster mode's own work (compare the 1-shard Cluster with one "
        "server); more shards split the work by the channels' slots and add none (the split "
        f"follows the channels: {FLEET_CHANNELS} are too few to spread evenly).",
        "",
    ]


def _design_lines(r: ScaleResult) -> list[str]:
    """What a re-layout could reach: the life beside the smallest design that keeps the
    bus's features (``bench.instructions.design``), against the ≤ 4x and ≤ 12 targets."""
    head = [
        "## A message's life beside the smallest design that keeps the features",
        "",
        "`python -m bench.instructions --design`: a message's life (send, read, "
        "acknowledgement, one round trip each, a 64-byte message in a channel of two) counted on "
        "one server under callgrind four ways: raw Streams on one stream that grows as a "
        "channel's does, raw Streams on 300 streams of a few entries (the shape of the baseline "
        "above), the smallest design that keeps the bus's features (`bench/design_floor.lua`: "
        "limits on the Redis clock, statuses, inbox depth, doorbell and wakeup, timed read and "
        "done marks, every counter in one hash; a yardstick, not redisbus) and redisbus:",
        "",
    ]
    if isinstance(r.design, str):
        return [*head, f"{r.design}.", ""]
    from bench.instructions import BUS, DESIGN_HEAD, RAW_DEEP, RAW_SHALLOW, YARDSTICK, design_cells

    table = _table(DESIGN_HEAD, design_cells(r.design))
    deep, shallow = r.design[RAW_DEEP]["instructions"], r.design[RAW_SHALLOW]["instructions"]
    floor, bus = r.design[YARDSTICK], r.design[BUS]
    below = []
    if floor["instructions"] > 4 * deep:
        ratios = f"{floor['instructions'] / deep:.2f}x and {floor['instructions'] / shallow:.2f}x"
        below.append(f"≤ 4x raw: the yardstick is {ratios}")
    if floor["commands"] > 12:
        below.append(f"≤ 12 commands: the yardstick runs {floor['commands']:.0f}")
    verdict = (
        "Targets below the yardstick, which no design that keeps these features in Lua scripts "
        "reaches: " + "; ".join(below) + "."
        if below
        else "The yardstick meets both the ≤ 4x and the ≤ 12-command targets."
    )
    return [
        *head,
        *table,
        "",
        f"A re-layout could save at most {1 - floor['instructions'] / bus['instructions']:.0%} "
        f"of redisbus's instructions per life and {bus['commands'] - floor['commands']:.0f} of "
        f"its {bus['commands']:.0f} commands (the gap also pays for what the yardstick leaves "
        f"out: idempotency, the pause switch, loop protection, ttl and signing). {verdict}",
        "",
    ]


def _capacity_tables(r: ScaleResult) -> list[str]:
    cap = r.capacity
    m = r.cluster.memory
    assert m is not None
    lines = [
        f"- **Messages/s per shard core: {_n(cap['msgs_per_core'])}** (1 s / "
        f"{_n(cap['cpu_us_per_msg'])} µs of a primary's main-thread CPU per message: send + "
        f"wake-up + mark_done, with reading, parsing and replying); "
        f"{_n(cap['msgs_per_core_exec'])} counting command execution alone "
        f"({_n(cap['exec_us_per_msg'])} µs, `commandstats`), an upper bound. Each replica "
        f"spends {_n(cap['replica_cpu_us_per_msg'])} µs per message applying the writes.",
        f"- **On one server a message costs {_n(cap['one_cpu_us_per_msg'])} µs of CPU "
        f"({_n(cap['msgs_per_core_one_path'])} msg/s per core).** The scripts and the data "
        "commands of a message are the same on both (the table of commands by name): the "
        "Cluster bus sends each call straight to the primary serving its channel's slot, "
        "as it sends it to one server (the wake-up in one pipeline, the clock read in it, "
        "no `COMMAND GETKEYS`). The last column of the table below is the fleet's need at "
        "one server's cost per message.",
        *_scale_line(r),
        f"- **Where one shard saturates**: traffic spread evenly over channels loads each shard "
        f"by its share of channels; the busiest of the 3 holds {cap['channel_spread']:.2f}x the "
        f"mean, so this Cluster's busiest primary reaches one core at "
        f"{_n(cap['saturates_at'])} msg/s (3 x {_n(cap['msgs_per_core'])} / "
        f"{cap['channel_spread']:.2f}). The load runs above used at most "
        f"{max(max(x.utilisation()) for x in r.cluster.runs):.2f} of a core on any primary: "
        "the clients, sharing the cores, ran out first.",
        f"- **Memory**: {_n(m.bytes_per_agent)} B per idle agent, {_n(m.bytes_per_channel)} B "
        f"per channel, {_n(m.bytes_per_message)} B per message in flight: "
        f"{_n(cap['agents_per_gib'])} idle agents per GiB in channels of {r.sizes.agents} "
        f"({_n(cap['agents_per_gib_in_flight'])} with one message in flight each). Replicas "
        "hold the same again.",
        f"- **Heartbeats**: {cap['fleet_channels']:,} channels beating every 5 s cost "
        f"{cap['beat_cores_100k']:.3f} cores in all (one script call per channel and process "
        "per period: a channel whose agents live in k processes costs k times that).",
        "",
        f"Shards for a fleet of 100,000 agents in channels of {r.sizes.agents}, each primary "
        f"planned at ≤ {HEADROOM:.0%} of a core with the measured channel spread, and "
        f"≤ {SHARD_GIB} GiB; messages in flight = rate x {IN_FLIGHT_S:g} s (send to done):",
        "",
    ]
    rows = [
        [
            f"{row['rate']:,}",
            f"{row['cores']:.2f}",
            str(row["by_cpu"]),
            f"{row['gib']:.2f}",
            str(row["by_mem"]),
            f"**{row['shards']}**",
            str(row["shards_one_path"]),
        ]
        for row in cap["rows"]
    ]
    head = ["msg/s", "primary cores", "shards by CPU", "GiB (primaries)", "shards by memory"]
    head += ["shards", "shards at one server's cost per message"]
    return lines + _table(head, rows)


def markdown(r: ScaleResult, machine: dict[str, Any]) -> str:
    s = r.sizes
    lines = [
        "# Scale-out model, measured",
        "",
        f"`python -m bench --only scale` (or `make bench`) — {report.now_iso()}. Machine: "
        f"{report.machine_line(machine)}. Cluster: 3 primaries with one replica each, "
        f"redis-server {r.cluster_version}, persistence off, on this machine.",
        "",
        f"**This machine has {machine.get('cores')} cores, shared by the client processes, the "
        "one server and the six Cluster nodes.** Wall throughput shows how fast the clients "
        "went, not what a shard can do; per-core figures come from the server time each message "
        "cost (`INFO cpu` of each primary's main thread, and `INFO commandstats` execution µs).",
        "",
        "## Cost per operation, per shard",
        "",
        "Server commands (those scripts run included) and execution µs of the commands sent, "
        "per call, on the primary serving the channel (a channel of 2, and a channel of "
        f"{s.agents} for the broadcast):",
        "",
        *_ops_tables(r),
        "",
        "## Memory and heartbeats",
        "",
        *_memory_tables(r),
        "",
        "## The fleet under load",
        "",
        f"{s.channels * s.agents:,} agents over {s.channels:,} channels, split over N client "
        f"processes (sync `Bus`); for {s.duration_s:g} s each process walks its channels: one "
        "agent sends to the next, which takes it with `wait()` and marks it done. Per message: "
        "server figures summed over the primaries; 'shard CPU use' is each primary's "
        "main-thread CPU seconds per second.",
        "",
        *_load_tables(r),
        "",
        *_instruction_lines(r),
        *_design_lines(r),
        "## Capacity",
        "",
        *_capacity_tables(r),
        "",
        f"![throughput against client processes]({PLOTS}/{THROUGHPUT_PNG})",
        "",
    ]
    return "\n".join(lines)
