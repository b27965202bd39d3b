"""What ``redisbus exporter`` reads from Redis besides the channels (``INFO memory``, the
streams' lengths and entries added, the janitors' dead-letter count), and the gauge families it
serves from one read. The fleet itself is :func:`redisbus.fleet.read_fleet`'s; the collector
that serves the last read is :class:`redisbus.exporter.FleetCollector`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from ._errors import RedisbusError
from ._keys import ChannelKeys, stats_key
from .fleet import FleetSnapshot
from .janitor import DEAD_LETTERED_FIELD

# -- what is read from Redis besides the channels -----------------------------------------------


@dataclass(frozen=True)
class RedisMemory:
    """``INFO memory``: bytes used, the limit (0: none) and the eviction policy."""

    used_bytes: int
    max_bytes: int
    policy: str

    @property
    def ratio(self) -> float:
        return self.used_bytes / self.max_bytes if self.max_bytes else 0.0

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> RedisMemory:
        """From ``INFO memory`` as redis-py parses it; on a Cluster (a dict per node) the
        node closest to its limit, which is the one that will refuse writes first."""
        if "used_memory" not in info and all(isinstance(v, dict) for v in info.values()):
            nodes = [cls.from_info(v) for v in info.values()]
            if not nodes:
                raise RedisbusError("INFO memory: no node answered")
            return max(nodes, key=lambda m: (m.ratio, m.used_bytes))
        return cls(
            int(info["used_memory"]),
            int(info.get("maxmemory", 0)),
            str(info.get("maxmemory_policy", "unknown")),
        )


def read_memory(r: Any) -> RedisMemory:
    """``INFO memory`` (allowed to the read-only ACL user, unlike ``CONFIG GET``)."""
    return RedisMemory.from_info(r.info("memory"))


STREAM_KINDS = ("channel", "dead_letter")


@dataclass(frozen=True)
class StreamTotals:
    """Entries of the channel and dead-letter streams, summed per kind: held now, and ever
    added (``None`` where Redis does not report it: before 7.0)."""

    held: dict[str, int]
    added: dict[str, int] | None

    @property
    def removed(self) -> dict[str, int] | None:
        """Trimmed or deleted: what was added and is no longer held."""
        if self.added is None:
            return None
        return {k: self.added[k] - self.held[k] for k in STREAM_KINDS}


def read_janitor_dead_lettered(r: Any, prefix: str) -> int:
    """What janitors have dead-lettered, as they counted it in Redis (0 before the first)."""
    return int(r.hget(stats_key(prefix), DEAD_LETTERED_FIELD) or 0)


def read_streams(r: Any, prefix: str, channels: Iterable[str]) -> StreamTotals:
    """``XINFO STREAM`` (O(1), allowed to the read-only user) of each channel's stream and
    dead-letter stream, in one pipeline; a stream not created yet counts 0."""
    keys = [ChannelKeys.build(prefix, name) for name in channels]
    pipe = r.pipeline(transaction=False)
    for k in keys:
        pipe.xinfo_stream(k.stream)
        pipe.xinfo_stream(k.dlq)
    replies = pipe.execute(raise_on_error=False) if keys else []
    held = dict.fromkeys(STREAM_KINDS, 0)
    added: dict[str, int] | None = dict.fromkeys(STREAM_KINDS, 0)
    for i, reply in enumerate(replies):
        kind = STREAM_KINDS[i % 2]
        if isinstance(reply, Exception):
            if "no such key" in str(reply).lower():
                continue
            raise reply
        held[kind] += int(reply["length"])
        if added is not None and reply.get("entries-added") is not None:
            added[kind] += int(reply["entries-added"])
        else:
            added = None  # Redis 6.2: not reported
    return StreamTotals(held, added)


# -- the collector ------------------------------------------------------------------------------

HELP = {
    "redisbus_channels": "Channels registered on the bus.",
    "redisbus_unread_messages": "Messages undone and not yet read (queued, or fetched by a "
    "replica that died), summed over recipients.",
    "redisbus_oldest_unread_age_seconds": "Age of the oldest unread message (Redis clock); "
    "0 when nothing is unread.",
    "redisbus_pending_messages": "Messages fetched and not acknowledged, over all agents.",
    "redisbus_dead_letters": "Messages held in dead-letter streams.",
    "redisbus_agents": "Agents by status.",
    "redisbus_channel_unread_messages": "Unread messages of the channels with the most unread "
    "(the exporter's top N).",
    "redisbus_watchdog_stale_unread_messages": "Unread messages older than the watchdog threshold.",
    "redisbus_redis_memory_used_bytes": "Memory Redis uses (INFO memory used_memory).",
    "redisbus_redis_memory_max_bytes": "Redis' maxmemory; 0 when it has no limit.",
    "redisbus_redis_maxmemory_policy": "1 for Redis' eviction policy (redisbus needs noeviction).",
    "redisbus_exporter_redis_up": "1 when the exporter's last read of Redis succeeded, else 0.",
    "redisbus_exporter_collect_duration_seconds": "Time the exporter's last read of Redis took.",
    "redisbus_stream_entries": "Entries held in the channel or dead-letter streams (XLEN).",
    "redisbus_stream_entries_added": "Entries ever added to the channel or dead-letter streams "
    "(XINFO STREAM entries-added, kept by Redis); falls only when entries vanish untrimmed.",
    "redisbus_stream_entries_removed": "Entries trimmed or deleted from the channel or "
    "dead-letter streams (added minus held).",
    "redisbus_exporter_channels_skipped": "Channels registered but not read (past the "
    "exporter's max channels): every other fleet figure leaves them out.",
    "redisbus_build_info": "Always 1; the version label says which redisbus the exporter runs.",
    "redisbus_janitor_dead_lettered_total": "Messages dead-lettered by janitors (in the "
    "exporter or `redisbus janitor`), as counted in Redis.",
}


def gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, HELP[name], value=value)


def fleet_families(snap: FleetSnapshot, top_n: int) -> Iterator[GaugeMetricFamily]:
    """The gauges of one snapshot of the channels."""
    yield gauge("redisbus_channels", snap.channels_total)
    yield gauge("redisbus_unread_messages", snap.unread)
    yield gauge("redisbus_oldest_unread_age_seconds", snap.oldest_unread_age_s)
    yield gauge("redisbus_pending_messages", snap.pending)
    yield gauge("redisbus_dead_letters", snap.dead_letters)
    agents = GaugeMetricFamily("redisbus_agents", HELP["redisbus_agents"], labels=["status"])
    for status, n in snap.agents_by_status().items():
        agents.add_metric([status], n)
    yield agents
    name = "redisbus_channel_unread_messages"
    per_channel = GaugeMetricFamily(name, HELP[name], labels=["channel"])
    for c in snap.top_channels(top_n):
        per_channel.add_metric([c.name], c.unread)
    yield per_channel
    yield gauge("redisbus_watchdog_stale_unread_messages", snap.stale)


def memory_families(memory: RedisMemory) -> Iterator[GaugeMetricFamily]:
    """Redis' memory and eviction policy."""
    yield gauge("redisbus_redis_memory_used_bytes", memory.used_bytes)
    yield gauge("redisbus_redis_memory_max_bytes", memory.max_bytes)
    name = "redisbus_redis_maxmemory_policy"
    policy = GaugeMetricFamily(name, HELP[name], labels=["policy"])
    policy.add_metric([memory.policy], 1)
    yield policy


def stream_families(streams: StreamTotals) -> Iterator[GaugeMetricFamily]:
    """Entries held, ever added and removed, per kind of stream; added and removed only where
    Redis reports entries-added."""
    values = {
        "redisbus_stream_entries": streams.held,
        "redisbus_stream_entries_added": streams.added,
        "redisbus_stream_entries_removed": streams.removed,
    }
    for name, per_kind in values.items():
        if per_kind is None:
            continue
        family = GaugeMetricFamily(name, HELP[name], labels=["stream"])
        for kind in STREAM_KINDS:
            family.add_metric([kind], per_kind[kind])
        yield family


# -- the exporter -------------------------------------------------------------------------------
