"""Where a run's keys live and what each server did: the topology (one server or a Cluster's
shards) and per-node snapshots of ``INFO commandstats``, ``cpu`` and ``errorstats``.

Server µs come in two kinds. ``usec`` of ``INFO commandstats`` is command execution only (a
script's time includes the commands it calls, which are counted again under their own names,
so only the names a client sent are added up). The main thread's CPU seconds (``INFO cpu``)
add what execution leaves out: reading, parsing and writing replies, the event loop, cron.
A core is saturated when the second reaches one second per second.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.crc import key_slot

from bench.costs import Stats, command_stats

#: Commands of the bench's own bookkeeping and of replication, never a message's work.
#: (``COMMAND GETKEYS`` is not among them: redis-py's Cluster client sends it to find the keys
#: of commands whose keys move, XREADGROUP's among them, once per call.)
ADMIN = frozenset(
    [
        "INFO",
        "CLUSTER",
        "CLIENT",
        "HELLO",
        "CONFIG",
        "PING",
        "SCRIPT",
        "MEMORY",
        "DBSIZE",
        "SCAN",
        "FLUSHALL",
        "READONLY",
        "REPLCONF",
        "SELECT",
        "PSYNC",
        "SYNC",
        "AUTH",
        "TYPE",
    ]
)


def data_command(name: str) -> bool:
    return name.split("|", 1)[0] not in ADMIN


@dataclass(frozen=True)
class Topology:
    """One server (one shard serving every slot) or a Cluster: its primaries in slot order,
    each with the slot range it serves, and the replicas."""

    label: str
    url: str
    cluster: bool
    primaries: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    replicas: tuple[int, ...] = ()
    host: str = "127.0.0.1"

    @classmethod
    def standalone(cls, url: str, label: str = "one server") -> Topology:
        port = redis.Redis.from_url(url).connection_pool.connection_kwargs.get("port", 6379)
        return cls(label, url, False, (int(port),), ((0, 16_383),))

    def shard_of_slot(self, slot: int) -> int:
        return next(i for i, (lo, hi) in enumerate(self.ranges) if lo <= slot <= hi)

    def shard_of_channel(self, channel: str) -> int:
        """The shard serving a channel's hash tag (every key of the channel has it)."""
        return self.shard_of_slot(key_slot(channel.encode()))

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host=self.host, port=port, socket_timeout=30)

    @property
    def nodes(self) -> tuple[int, ...]:
        return self.primaries + self.replicas


@dataclass
class NodeStats:
    commands: Stats
    cpu_s: float
    errors: dict[str, int]
    used_memory: int


def node_stats(client: redis.Redis) -> NodeStats:
    cpu: dict[str, Any] = client.info("cpu")
    main = cpu.get("used_cpu_user_main_thread")
    if main is not None:  # Redis 7: the thread that runs commands and does the I/O
        cpu_s = float(main) + float(cpu["used_cpu_sys_main_thread"])
    else:
        cpu_s = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    try:
        errs: dict[str, Any] = client.info("errorstats")
    except redis.ResponseError:  # Redis 6.0 and older
        errs = {}
    errors = {
        k.removeprefix("errorstat_"): int(v["count"])
        for k, v in errs.items()
        if isinstance(v, dict)
    }
    mem: dict[str, Any] = client.info("memory")
    return NodeStats(command_stats(client), cpu_s, errors, int(mem["used_memory"]))


def snapshot(topo: Topology, ports: Iterable[int] | None = None) -> dict[int, NodeStats]:
    out: dict[int, NodeStats] = {}
    for port in topo.nodes if ports is None else ports:
        client = topo.client(port)
        try:
            out[port] = node_stats(client)
        finally:
            client.close()
    return out


@dataclass
class NodeDelta:
    """What one node did between two snapshots (the snapshots' own INFO calls left out)."""

    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)
    cpu_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    memory: int = 0

    @property
    def commands(self) -> int:
        """Data commands executed, those run inside scripts included."""
        return sum(c for n, c in self.calls.items() if data_command(n))

    def usec_of(self, sent: Iterable[str]) -> int:
        """Execution µs of the top-level commands named in ``sent`` (scripts include what
        they call)."""
        return sum(self.usec.get(n, 0) for n in set(sent) if data_command(n))

    @property
    def all_usec(self) -> int:
        """Execution µs of every data command: right on a replica, which applies a script's
        effects as plain commands (no nesting), an over-count on a primary."""
        return sum(u for n, u in self.usec.items() if data_command(n))

    @property
    def redirects(self) -> int:
        """Replies that sent a client elsewhere or refused keys of several slots."""
        return sum(v for k, v in self.errors.items() if k in ("MOVED", "ASK", "CROSSSLOT"))


def delta(before: NodeStats, after: NodeStats) -> NodeDelta:
    d = NodeDelta(cpu_s=after.cpu_s - before.cpu_s, memory=after.used_memory - before.used_memory)
    for name, (calls, usec) in after.commands.items():
        c0, u0 = before.commands.get(name, (0, 0))
        if calls != c0:
            d.calls[name] = calls - c0
            d.usec[name] = usec - u0
    for name, count in after.errors.items():
        if count != before.errors.get(name, 0):
            d.errors[name] = count - before.errors.get(name, 0)
    return d


def deltas(before: dict[int, NodeStats], after: dict[int, NodeStats]) -> dict[int, NodeDelta]:
    return {port: delta(before[port], after[port]) for port in before if port in after}
