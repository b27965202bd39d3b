"""The fleet under load: ``channels`` channels of ``agents`` agents each, split over N client
processes; each process walks its channels round-robin, and on each one agent sends to the
next, which takes the message with ``wait()`` and marks it done. The same for one server and
for a Cluster, so the per-message figures of the two can be compared line by line.

Heartbeats are slowed to once an hour in the load (their cost is measured apart, in
``bench.scale_ops``): a channel's beat is one script call that would land in the window at an
arbitrary moment and count as message work.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event
from typing import Any

from redis.crc import key_slot

from bench.cases import LIMITS, check
from bench.common import RoundTrips, body
from bench.shards import NodeDelta, Topology, data_command, deltas, snapshot

#: The load's settings: heartbeats out of the window.
QUIET: dict[str, Any] = {"heartbeat_s": 3600.0, "agent_lease_s": 7200.0}


def turn(fleet: list[list[Any]], step: int, text: str, timeout: float = 5.0) -> None:
    """Step ``step`` of the fleet's walk: on channel ``step`` mod the channels, one agent
    sends ``text`` to the next, which takes it with ``wait()`` and marks it done; the agents
    take turns, channel after channel."""
    members = fleet[step % len(fleet)]
    at = step // len(fleet)
    a, b = members[at % len(members)], members[(at + 1) % len(members)]
    check(a.send(b.name, text))
    got = b.wait(timeout=timeout).messages
    if len(got) != 1:
        raise RuntimeError(f"{b.name} woke with {len(got)} messages, not 1")
    b.mark_done(got)


def channel_names(prefix: str, channels: int) -> list[str]:
    return [f"{prefix}-c{i}" for i in range(channels)]


def _worker(
    url: str,
    cluster: bool,
    names: list[str],
    agents: int,
    duration_s: float,
    ready: Any,
    go: Event,
    done: Event,
) -> None:
    from redisbus import Bus, BusSettings

    out: dict[str, Any] = {}
    try:
        with Bus.from_url(url, cluster=cluster, settings=BusSettings(**QUIET)) as bus:
            fleet = []
            for name in names:
                ch = bus.channel(name, **LIMITS)
                fleet.append([ch.join(f"a{j}") for j in range(agents)])

            # one turn of every agent first: each group then skips the entries addressed to
            # others as it will in the window (at its next wake), so the window sees the
            # steady state, not a fleet catching up
            warm = len(fleet) * agents
            for step in range(warm):
                turn(fleet, step, body())
            ready.put({"ready": True})
            go.wait()
            trips = RoundTrips(names=True)
            lat: list[int] = []
            sent, step = 0, warm
            cpu0, t0 = time.process_time(), time.perf_counter()
            deadline = t0 + duration_s
            with trips.counting():
                while time.perf_counter() < deadline:
                    c0 = time.perf_counter_ns()
                    turn(fleet, step, body())
                    lat.append(time.perf_counter_ns() - c0)
                    sent += 1
                    step += 1
            wall = time.perf_counter() - t0
            out = {
                "messages": sent,
                "wall_s": wall,
                "cpu_s": time.process_time() - cpu0,
                "sent": dict(trips.commands),
                "round_trips": trips.count,
                "cycle_p50_us": statistics.median(lat) / 1000 if lat else 0.0,
            }
            ready.put(out)
            done.wait(60)
    except Exception as exc:  # reported to the parent, which fails the run
        ready.put({"error": f"{type(exc).__name__}: {exc}"})


@dataclass
class LoadRun:
    """One (topology, processes) run."""

    topology: str
    processes: int
    channels: int
    agents: int
    messages: int
    wall_s: float
    client_cpu_s: float
    sent: Counter[str]
    round_trips: int
    cycle_p50_us: float
    #: per shard (in slot order): channels, messages (XACKs: each message's mark_done acknowledges
    #: it once; a send writes one entry and pushes its id on the recipient's doorbell), data
    #: commands, execution µs of
    #: the top-level commands, main-thread CPU s; replicas: execution µs and CPU s
    shard_channels: list[int] = field(default_factory=list)
    shard_messages: list[int] = field(default_factory=list)
    shard_commands: list[int] = field(default_factory=list)
    shard_usec: list[int] = field(default_factory=list)
    shard_cpu_s: list[float] = field(default_factory=list)
    #: each primary's main-thread CPU s per s with the fleet joined and silent (subtracted)
    shard_idle_cpu: list[float] = field(default_factory=list)
    #: data commands by name over the primaries (those scripts run included)
    calls: dict[str, int] = field(default_factory=dict)
    replica_usec: int = 0
    replica_cpu_s: float = 0.0
    redirects: int = 0

    @property
    def msgs_per_s(self) -> float:
        return self.messages / self.wall_s if self.wall_s else 0.0

    @property
    def commands_per_msg(self) -> float:
        return sum(self.shard_commands) / self.messages

    @property
    def usec_per_msg(self) -> float:
        return sum(self.shard_usec) / self.messages

    @property
    def cpu_us_per_msg(self) -> float:
        return sum(self.shard_cpu_s) * 1e6 / self.messages

    @property
    def client_cpu_us_per_msg(self) -> float:
        return self.client_cpu_s * 1e6 / self.messages

    def utilisation(self) -> list[float]:
        """Each shard's main thread: CPU seconds per second of the window."""
        return [c / self.wall_s for c in self.shard_cpu_s]

    def to_json(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.__dict__.items() if k != "sent"},
            "sent": dict(self.sent),
            "msgs_per_s": self.msgs_per_s,
            "commands_per_msg": self.commands_per_msg,
            "usec_per_msg": self.usec_per_msg,
            "cpu_us_per_msg": self.cpu_us_per_msg,
            "client_cpu_us_per_msg": self.client_cpu_us_per_msg,
            "utilisation": self.utilisation(),
        }


def load_run(
    topo: Topology,
    prefix: str,
    channels: int,
    agents: int,
    processes: int,
    duration_s: float,
    idle_s: float = 2.0,
    setup_timeout_s: float = 180.0,
) -> LoadRun:
    """Start ``processes`` workers on disjoint channel sets; measure the servers over the
    window in which all of them send."""
    names = channel_names(prefix, channels)
    spawn = mp.get_context("spawn")
    ready: Any = spawn.Queue()
    go, done = spawn.Event(), spawn.Event()
    procs = [
        spawn.Process(
            target=_worker,
            args=(topo.url, topo.cluster, names[i::processes], agents, duration_s, ready, go, done),
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            _expect(ready.get(timeout=setup_timeout_s))
        # what the servers spend with the fleet joined and silent (cron, replication pings,
        # the Cluster bus), per second: taken out of the CPU seconds of the run below
        idle0, i0 = snapshot(topo), time.perf_counter()
        time.sleep(idle_s)
        idle = deltas(idle0, snapshot(topo))
        idle_rate = {port: d.cpu_s / (time.perf_counter() - i0) for port, d in idle.items()}
        before = snapshot(topo)
        t0 = time.perf_counter()
        go.set()
        results = [_expect(ready.get(timeout=duration_s + 60)) for _ in procs]
        window = time.perf_counter() - t0
        d = deltas(before, snapshot(topo))
    finally:
        done.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    sent: Counter[str] = Counter()
    for r in results:
        sent.update(r["sent"])
    run = LoadRun(
        topology=topo.label,
        processes=processes,
        channels=channels,
        agents=agents,
        messages=sum(r["messages"] for r in results),
        wall_s=max(window, max(r["wall_s"] for r in results)),
        client_cpu_s=sum(r["cpu_s"] for r in results),
        sent=sent,
        round_trips=sum(r["round_trips"] for r in results),
        cycle_p50_us=statistics.median(r["cycle_p50_us"] for r in results),
    )
    fill_shards(run, topo, names, d, idle_rate)
    return run


def _expect(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise RuntimeError(f"load worker failed: {reply['error']}")
    return reply


def fill_shards(
    run: LoadRun,
    topo: Topology,
    names: list[str],
    d: dict[int, NodeDelta],
    idle_rate: dict[int, float],
) -> None:
    counts = Counter(topo.shard_of_channel(n) for n in names)
    run.shard_channels = [counts.get(i, 0) for i in range(len(topo.primaries))]
    for port in topo.primaries:
        nd = d[port]
        run.shard_messages.append(nd.calls.get("XACK", 0))
        run.shard_commands.append(nd.commands)
        run.shard_usec.append(nd.usec_of(run.sent))
        run.shard_cpu_s.append(max(0.0, nd.cpu_s - idle_rate[port] * run.wall_s))
        run.shard_idle_cpu.append(idle_rate[port])
        run.redirects += nd.redirects
        for name, calls in nd.calls.items():
            if data_command(name):
                run.calls[name] = run.calls.get(name, 0) + calls
    for port in topo.replicas:
        run.replica_usec += d[port].all_usec
        run.replica_cpu_s += max(0.0, d[port].cpu_s - idle_rate[port] * run.wall_s)


# --- where the keys are -------------------------------------------------------------------------


@dataclass
class KeyLayout:
    channels: int  # channels that have keys
    keys: int  # keys of those channels
    split: list[str]  # channels whose keys are in more than one slot (must be none)
    misplaced: int  # keys on a primary that does not serve their slot (must be none)
    outside: list[str]  # keys under the prefix that carry no channel's tag
    per_shard_keys: list[int]
    registry_shard: int  # the bus's set of channel names: one key, written on creation only


def key_layout(topo: Topology, prefix: str, bus_prefix: str = "rb") -> KeyLayout:
    """Scan every primary for the keys of the channels named ``prefix-...``: each channel's
    keys must share one slot, on the primary that serves it."""
    slots: dict[str, set[int]] = {}
    keys = misplaced = 0
    outside: list[str] = []
    per_shard: list[int] = []
    for i, port in enumerate(topo.primaries):
        client = topo.client(port)
        n = 0
        try:
            for raw in client.scan_iter(match=f"*{prefix}*", count=1000):
                key = raw.decode()
                n += 1
                lo, hi = key.find("{"), key.find("}")
                if lo < 0 or hi < lo:
                    outside.append(key)
                    continue
                channel, slot = key[lo + 1 : hi], key_slot(raw)
                keys += 1
                slots.setdefault(channel, set()).add(slot)
                if topo.shard_of_slot(slot) != i:
                    misplaced += 1
        finally:
            client.close()
        per_shard.append(n)
    split = sorted(c for c, s in slots.items() if len(s) > 1)
    registry = topo.shard_of_slot(key_slot(f"{bus_prefix}:channels".encode()))
    return KeyLayout(len(slots), keys, split, misplaced, outside, per_shard, registry)


def flush(topo: Topology) -> None:
    for port in topo.primaries:
        client = topo.client(port)
        try:
            client.flushall()
        finally:
            client.close()
