"""What one operation costs the shard that serves its channel, and the client that calls it,
per face; what a channel, an idle agent and a message in flight take in Redis memory; what a
channel's heartbeat costs.

Server figures per call come from ``INFO commandstats`` on the channel's primary, before and
after each call, as in ``bench.costs`` (whose ``command_stats`` this uses): commands counted
with those a script runs, µs of the top-level commands the call sent. Client figures: wall
time (median) and the calling process's CPU time (mean) per call.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.cases import LIMITS, check
from bench.common import RoundTrips, body, maybe_await
from bench.costs import command_stats
from bench.shards import Topology, data_command, deltas, snapshot

Call = Callable[[], Awaitable[object]]
FACES = ("sync", "async")


@dataclass
class OpCost:
    op: str
    face: str
    topology: str
    shard: int
    commands: float  # server commands per call on the channel's shard, scripts' included
    elsewhere: float  # ... on the other shards (a Cluster client's COMMAND GETKEYS)
    server_us: float  # execution µs of the top-level commands, per call, on every shard
    sent: str  # top-level commands per call (sync face; the async face sends the same)
    wall_us: float  # median
    client_cpu_us: float  # mean


def channel_on(topo: Topology, shard: int, stem: str) -> str:
    """A channel name whose hash tag lands on ``shard``."""
    for j in itertools.count():
        name = f"{stem}-{j}"
        if topo.shard_of_channel(name) == shard:
            return name
    raise AssertionError("unreachable")


async def _open(topo: Topology, face: str) -> Any:
    from bench.scale_load import QUIET
    from redisbus import AsyncBus, Bus, BusSettings

    settings = BusSettings(**QUIET)
    if face == "sync":
        return Bus.from_url(topo.url, cluster=topo.cluster, settings=settings)
    return await maybe_await(AsyncBus.from_url(topo.url, cluster=topo.cluster, settings=settings))


async def _close(bus: Any) -> None:
    await maybe_await(bus.aclose() if hasattr(bus, "aclose") else bus.close())


async def _measure(
    nodes: list[Any],
    call: Call,
    setup: Call | None,
    n: int,
    top: set[str] | None,
) -> tuple[float, float, float, Counter[str], float, float]:
    """(commands on the first node, on the others, server µs on all, sent names, wall µs p50,
    client CPU µs mean) per call. ``top``: the top-level command names, when the call's own
    (counted on sync sockets only) are not known."""
    for _ in range(min(10, n)):  # warm-up
        if setup:
            await setup()
        await call()
    trips = RoundTrips(names=True)
    walls: list[int] = []
    cpu = 0.0
    here = elsewhere = usec = 0
    for _ in range(n):
        if setup:
            await setup()
        before = [command_stats(node) for node in nodes]
        with trips.counting():
            c0, t0 = time.process_time(), time.perf_counter_ns()
            await call()
            walls.append(time.perf_counter_ns() - t0)
            cpu += time.process_time() - c0
        after = [command_stats(node) for node in nodes]
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            for name, (calls, us) in a.items():
                c, u = b.get(name, (0, 0))
                if not data_command(name):
                    continue
                if i == 0:
                    here += calls - c
                else:
                    elsewhere += calls - c
                if name in (trips.commands if top is None else top):
                    usec += us - u
    wall = statistics.median(walls) / 1e3
    return here / n, elsewhere / n, usec / n, trips.commands, wall, cpu * 1e6 / n


async def _face_costs(
    topo: Topology, face: str, prefix: str, k: int, n: int, names: dict[str, Counter[str]]
) -> list[OpCost]:
    bus = await _open(topo, face)
    out: list[OpCost] = []
    try:
        for shard, port in enumerate(topo.primaries):
            nodes = [topo.client(p) for p in (port, *(p for p in topo.primaries if p != port))]
            stem = f"{prefix}-ops-{face}-s{shard}"
            quiet = await maybe_await(bus.channel(channel_on(topo, shard, stem + "q"), **LIMITS))
            x = await maybe_await(quiet.join("x"))
            y = await maybe_await(quiet.join("y"))
            held: list[Any] = []

            async def send_one(x: Any = x) -> None:
                check(await maybe_await(x.send("y", body())))

            async def take(y: Any = y, held: list[Any] = held) -> None:
                held[:] = (await maybe_await(y.wait(timeout=1))).messages

            async def settle(y: Any = y, held: list[Any] = held) -> None:
                if held:
                    await maybe_await(y.mark_done(held))
                held.clear()

            async def ready(settle: Call = settle, send_one: Call = send_one) -> None:
                await settle()
                await send_one()

            async def fetched(ready: Call = ready, take: Call = take) -> None:
                await ready()
                await take()

            async def drain(y: Any = y) -> None:
                while msgs := await maybe_await(y.read(limit=1_000)):
                    await maybe_await(y.mark_done(msgs))

            wide = await maybe_await(bus.channel(channel_on(topo, shard, stem + "w"), **LIMITS))
            alice = await maybe_await(wide.join("alice"))
            for i in range(k):
                await maybe_await(wide.join(f"agent-{i}"))

            async def broadcast(alice: Any = alice) -> None:
                check(await maybe_await(alice.send("all", body())))

            async def fill(x: Any = x, y: Any = y) -> None:
                check(await maybe_await(x.send_many([("y", body())] * 100)))
                await maybe_await(y.mark_done(await maybe_await(y.read(limit=100))))

            async def sweep(quiet: Any = quiet) -> None:
                await maybe_await(quiet.sweep())

            plan: list[tuple[str, Call, Call | None, int]] = [
                ("send() to one", send_one, None, n),
                ("wait(), one message ready", take, ready, n),
                ("mark_done(one)", settle, fetched, n),
                (f"send('all') to {k}", broadcast, None, max(10, n // 4)),
                ("sweep(), 100 done entries to trim", sweep, fill, max(5, n // 10)),
            ]
            for op, call, setup, count in plan:
                if op == "wait(), one message ready":
                    await drain()
                if op.startswith("sweep"):
                    await settle()
                    await drain()
                top = set(names[op]) if op in names else None
                cmds, other, us, sent, wall, cpu = await _measure(nodes, call, setup, count, top)
                sent = names.setdefault(op, sent)
                shown = ", ".join(f"{c}x{v / count:g}" for c, v in sent.most_common())
                out.append(OpCost(op, face, topo.label, shard, cmds, other, us, shown, wall, cpu))
            for node in nodes:
                node.close()
    finally:
        await _close(bus)
    return out


def op_costs(topo: Topology, prefix: str, k: int = 9, n: int = 100) -> list[OpCost]:
    """Every operation on a channel of every shard, through both faces."""
    names: dict[str, Counter[str]] = {}  # filled by the sync face, which runs first
    out: list[OpCost] = []
    for face in FACES:
        out += asyncio.run(_face_costs(topo, face, prefix, k, n, names))
    return out


# --- memory and heartbeats ----------------------------------------------------------------------


@dataclass
class Footprint:
    topology: str
    channels: int
    agents: int  # in all
    bytes_per_channel: float  # an empty channel
    bytes_per_agent: float  # an idle agent (joined, heartbeating, nothing addressed to it)
    bytes_per_message: float  # a message in flight (sent, not yet done)
    residual_per_agent: float  # after every message was done and the channels swept
    key_bytes_idle: dict[str, int]  # MEMORY USAGE of one channel's keys, by key suffix
    key_bytes_loaded: dict[str, int]  # the same with one message in flight per agent
    #: the same three from MEMORY USAGE summed over every key of the channels: what the
    #: values take, without the allocator's and the keyspace's overhead (exact at any size)
    usage_per_channel: float
    usage_per_agent: float
    usage_per_message: float
    beats: int  # heartbeat script calls in the window (one per channel per period)
    beat_us: float  # execution µs per beat (a channel of its agents)
    beat_cpu_us: float  # main-thread CPU µs per beat, the server's idle work taken out


def _used(topo: Topology) -> int:
    return sum(s.used_memory for s in snapshot(topo, topo.primaries).values())


def _usage(topo: Topology, match: str) -> int:
    """MEMORY USAGE summed over the keys matching ``match`` on every primary."""
    total = 0
    for port in topo.primaries:
        node = topo.client(port)
        try:
            keys = list(node.scan_iter(match=match, count=1000))
            for i in range(0, len(keys), 500):
                pipe = node.pipeline(transaction=False)
                for key in keys[i : i + 500]:
                    pipe.memory_usage(key, samples=0)
                total += sum(int(v or 0) for v in pipe.execute())
        finally:
            node.close()
    return total


def _key_bytes(topo: Topology, channel: str) -> dict[str, int]:
    node = topo.client(topo.primaries[topo.shard_of_channel(channel)])
    try:
        out: dict[str, int] = {}
        for raw in node.scan_iter(match=f"*{{{channel}}}*", count=1000):
            suffix = raw.decode().rsplit("}", 1)[-1].lstrip(":") or "?"
            out[suffix] = int(node.memory_usage(raw, samples=0) or 0)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))
    finally:
        node.close()


def footprint(
    topo: Topology, prefix: str, channels: int, agents: int, beat_window_s: float = 3.0
) -> Footprint:
    """Memory deltas over the primaries as channels are created, agents join, one message is
    sent to every agent, then all are done and swept; heartbeats counted while idle."""
    from redisbus import Bus, BusSettings

    settings = BusSettings(heartbeat_s=1.0, agent_lease_s=60.0)
    match = f"*{{{prefix}-mem-c*"
    with Bus.from_url(topo.url, cluster=topo.cluster, settings=settings) as bus:
        idle0, t0 = snapshot(topo, topo.primaries), time.perf_counter()
        time.sleep(1.0)
        idle = deltas(idle0, snapshot(topo, topo.primaries))
        idle_rate = sum(d.cpu_s for d in idle.values()) / (time.perf_counter() - t0)
        m0 = _used(topo)
        chans = [bus.channel(f"{prefix}-mem-c{i}", **LIMITS) for i in range(channels)]
        m1, u1 = _used(topo), _usage(topo, match)
        fleet = [[ch.join(f"a{j}") for j in range(agents)] for ch in chans]
        time.sleep(1.5)  # every channel has had its first beat: its lease fields exist
        before, t0 = snapshot(topo), time.perf_counter()
        time.sleep(beat_window_s)
        d = deltas(before, snapshot(topo))
        window = time.perf_counter() - t0
        # (a script call is an FCALL where the server has Functions, else an EVALSHA)
        beats = sum(d[p].calls.get(v, 0) for p in topo.primaries for v in ("FCALL", "EVALSHA"))
        usec = sum(d[p].usec.get(v, 0) for p in topo.primaries for v in ("FCALL", "EVALSHA"))
        beat_us = usec / max(beats, 1)
        beat_cpu = sum(d[p].cpu_s for p in topo.primaries) - idle_rate * window
        beat_cpu = max(0.0, beat_cpu) * 1e6 / max(beats, 1)
        idle_keys = _key_bytes(topo, chans[0].name)
        m2, u2 = _used(topo), _usage(topo, match)
        for members in fleet:
            for j, a in enumerate(members):
                check(a.send(members[(j + 1) % agents].name, body()))
        m3, u3 = _used(topo), _usage(topo, match)
        loaded_keys = _key_bytes(topo, chans[0].name)
        for members in fleet:
            for a in members:
                a.mark_done(a.read(limit=10))
        for ch in chans:
            ch.sweep()
        m4 = _used(topo)
    total = channels * agents
    return Footprint(
        topology=topo.label,
        channels=channels,
        agents=total,
        bytes_per_channel=(m1 - m0) / channels,
        bytes_per_agent=(m2 - m1) / total,
        bytes_per_message=(m3 - m2) / total,
        residual_per_agent=(m4 - m1) / total,
        key_bytes_idle=idle_keys,
        key_bytes_loaded=loaded_keys,
        usage_per_channel=u1 / channels,
        usage_per_agent=(u2 - u1) / total,
        usage_per_message=(u3 - u2) / total,
        beats=beats,
        beat_us=beat_us,
        beat_cpu_us=beat_cpu,
    )
