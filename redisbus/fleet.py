"""A read-only look at every channel of a bus: the numbers ``redisbus exporter`` publishes.

Public API: ``read_fleet`` and the snapshot it returns (its ``__all__``; see
docs/reference/api.md): what the exporter and the console show, for your own tools.

Definitions (per recipient agent of a channel; a message to several agents counts once for
each of them, as it does in their inboxes):

* **undone**: the agent's inbox counter (``…:inbox``): addressed to it, not yet done, failed
  or expired. The send, done, claim and sweep scripts keep it in step with the stream.
* **unread**: undone and not yet read: ``undone`` minus the messages the agent has on hand,
  i.e. its pending entries that carry a read mark (``R…`` in ``…:marks``) or that a live
  replica holds (its heartbeat deadline in ``…:beat`` not passed). What is left are messages
  queued behind the agent's group cursor and messages a replica fetched but died before
  handing over. (``wait()`` and ``read()`` mark what they return read on the server, in the
  same round trip; a live replica's unmarked entries are counted on hand all the same, so
  that a fetch in flight never looks like a stuck message.)
* **oldest unread age**: Redis ``TIME`` minus the millisecond of the oldest unread entry id
  (the Redis clock at both ends, as for delivery latency).
* **stale**: unread and older than the watchdog threshold.
* Agents that will never read again (status ``failed``, ``cancelled`` or ``lost``) have no
  unread messages: what is left in their inboxes (the control message announcing a loss,
  for one) is not a backlog anyone can work off, and counting it would keep the stale-unread
  alert firing until retention trims it.
* **pending**: entries fetched and not acknowledged, summed over the consumer groups
  (``XINFO GROUPS``, the same number as ``XPENDING``'s summary).
* **dead letters**: entries in the channels' dead-letter streams.

Only commands the exporter's least-privilege ACL user has are used (``SMEMBERS``, ``TIME``,
``XINFO GROUPS``, ``XPENDING``, ``XRANGE``, ``XLEN``, ``HGETALL``, ``HMGET``). Work per read is
bounded: at most ``max_channels`` channels (the first in name order; the rest are left out
and the snapshot says how many), ``pel_cap`` pending entries per agent (read marks past it
are not looked at, so those entries count as unread), and ``scan_cap`` stream entries
scanned per agent to find queued unread messages (when that scan stops short, the oldest
unread age is taken from the last entry scanned: an overestimate, never a miss). Agents with
nothing undone cost nothing beyond the channel's first pipeline. Each stage is one pipeline
for all channels, so a read costs a handful of round trips whatever the number of channels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import ResponseError

from ._keys import ChannelKeys, registry_key
from ._model import id_ms
from .metrics import AGENT_STATUSES

__all__ = ["CLOSED_STATUSES", "AgentBacklog", "ChannelStats", "FleetSnapshot", "read_fleet"]

_SCAN_BATCH = 500

#: Agents in these states never read again: their inboxes are not counted as unread.
CLOSED_STATUSES = frozenset({"failed", "cancelled", "lost"})


@dataclass(frozen=True)
class AgentBacklog:
    """Unread messages of one agent of one channel."""

    channel: str
    agent: str
    unread: int
    stale: int
    oldest_unread_ms: int | None  # entry id millisecond (Redis clock)


@dataclass
class ChannelStats:
    """What one channel holds, summed over its agents."""

    name: str
    unread: int = 0
    pending: int = 0
    dead_letters: int = 0
    stale: int = 0
    oldest_unread_ms: int | None = None
    statuses: Counter[str] = field(default_factory=Counter)
    backlogs: list[AgentBacklog] = field(default_factory=list)


@dataclass(frozen=True)
class FleetSnapshot:
    """Every scanned channel at one Redis ``TIME``; totals are over the scanned channels."""

    now_ms: int
    channels_total: int
    channels: tuple[ChannelStats, ...]

    @property
    def capped(self) -> bool:
        return len(self.channels) < self.channels_total

    @property
    def unread(self) -> int:
        return sum(c.unread for c in self.channels)

    @property
    def pending(self) -> int:
        return sum(c.pending for c in self.channels)

    @property
    def dead_letters(self) -> int:
        return sum(c.dead_letters for c in self.channels)

    @property
    def stale(self) -> int:
        return sum(c.stale for c in self.channels)

    @property
    def oldest_unread_age_s(self) -> float:
        """Age of the oldest unread message of the fleet; 0 when nothing is unread."""
        oldest = [c.oldest_unread_ms for c in self.channels if c.oldest_unread_ms is not None]
        return max(0.0, (self.now_ms - min(oldest)) / 1000) if oldest else 0.0

    def agents_by_status(self) -> dict[str, int]:
        """Agents per status, every known status present (0 when none)."""
        total: Counter[str] = Counter()
        for c in self.channels:
            total.update(c.statuses)
        return {s: total[s] for s in AGENT_STATUSES}

    def top_channels(self, n: int) -> list[ChannelStats]:
        """The ``n`` channels with the most unread messages (ties by name)."""
        return sorted(self.channels, key=lambda c: (-c.unread, c.name))[:n]

    def stale_backlogs(self) -> list[AgentBacklog]:
        return [b for c in self.channels for b in c.backlogs if b.stale > 0]


@dataclass
class _Agent:
    """Working state of one agent while its backlog is computed."""

    keys: ChannelKeys
    name: str
    undone: int
    cursor: str
    live: frozenset[str]  # replicas whose heartbeat deadline has not passed
    pending: list[tuple[str, str]] = field(default_factory=list)  # (entry id, replica)
    on_hand: int = 0
    unread_pending_ids: list[str] = field(default_factory=list)


def read_fleet(
    r: Any,
    prefix: str,
    *,
    stale_s: float,
    max_channels: int = 1000,
    pel_cap: int = 1000,
    scan_cap: int = 10_000,
) -> FleetSnapshot:
    """One snapshot of every channel registered under ``prefix`` (redis-py client ``r``)."""
    names = sorted(r.smembers(registry_key(prefix)))
    now_s, now_us = r.time()
    now_ms = int(now_s) * 1000 + int(now_us) // 1000
    keys = [ChannelKeys.build(prefix, n) for n in names[:max_channels]]
    stats, agents = _read_channels(r, keys, now_ms)
    _read_pending(r, agents, pel_cap)
    candidates = _read_marks(r, agents)
    _sort_unmarked(r, candidates)
    cutoff_ms = now_ms - int(stale_s * 1000)
    for a in agents:
        backlog = _backlog(r, a, cutoff_ms, scan_cap)
        _add(stats[a.keys.channel], backlog)
    return FleetSnapshot(now_ms, len(names), tuple(stats[k.channel] for k in keys))


def _pipeline_results(r: Any, calls: Iterable[tuple[str, Sequence[Any]]]) -> list[Any]:
    """Run ``(method, args)`` calls in one non-transactional pipeline; errors come back as
    values (a channel whose stream does not exist yet must not spoil the others)."""
    pipe = r.pipeline(transaction=False)
    n = 0
    for method, args in calls:
        getattr(pipe, method)(*args)
        n += 1
    if n == 0:
        return []
    return list(pipe.execute(raise_on_error=False))


def _read_channels(
    r: Any, keys: list[ChannelKeys], now_ms: int
) -> tuple[dict[str, ChannelStats], list[_Agent]]:
    calls: list[tuple[str, Sequence[Any]]] = []
    for k in keys:
        calls += [
            ("xinfo_groups", (k.stream,)),
            ("hgetall", (k.inbox,)),
            ("hgetall", (k.status,)),
            ("xlen", (k.dlq,)),
            ("hgetall", (k.beat,)),
        ]
    replies = _pipeline_results(r, calls)
    stats: dict[str, ChannelStats] = {}
    agents: list[_Agent] = []
    for i, k in enumerate(keys):
        groups, inbox, status, dlq, beat = replies[5 * i : 5 * i + 5]
        c = stats[k.channel] = ChannelStats(k.channel)
        c.dead_letters = int(dlq) if isinstance(dlq, int) else 0
        c.statuses.update(v for v in _mapping(status).values() if v in AGENT_STATUSES)
        undone = {a: int(n) for a, n in _mapping(inbox).items()}
        closed = {a for a, s in _mapping(status).items() if s in CLOSED_STATUSES}
        live = _live_replicas(_mapping(beat), now_ms)
        for g in groups if isinstance(groups, list) else []:
            name = g["name"]
            c.pending += int(g["pending"])
            if undone.get(name, 0) > 0 and name not in closed:
                replicas = frozenset(live.get(name, ()))
                agents.append(_Agent(k, name, undone[name], g["last-delivered-id"], replicas))
    return stats, agents


def _live_replicas(beat: dict[str, str], now_ms: int) -> dict[str, set[str]]:
    """agent -> replicas whose heartbeat deadline (``AGENT\\nREPLICA`` -> ms) is ahead."""
    live: dict[str, set[str]] = {}
    for key, deadline in beat.items():
        agent, _, replica = key.partition("\n")
        if agent and float(deadline) > now_ms:  # ("\n#judged" is beat.lua's own field)
            live.setdefault(agent, set()).add(replica)
    return live


def _mapping(reply: Any) -> dict[str, str]:
    return reply if isinstance(reply, dict) else {}


def _read_pending(r: Any, agents: list[_Agent], pel_cap: int) -> None:
    calls = [("xpending_range", (a.keys.stream, a.name, "-", "+", pel_cap)) for a in agents]
    for a, reply in zip(agents, _pipeline_results(r, calls), strict=True):
        if isinstance(reply, list):
            a.pending = [(str(p["message_id"]), str(p["consumer"])) for p in reply]


def _read_marks(r: Any, agents: list[_Agent]) -> list[tuple[_Agent, str, str]]:
    """Count pending entries with a read mark as on hand; return the others."""
    with_pel = [a for a in agents if a.pending]
    calls = [("hmget", (a.keys.marks, [f"{i}\n{a.name}" for i, _ in a.pending])) for a in with_pel]
    unmarked = []
    for a, marks in zip(with_pel, _pipeline_results(r, calls), strict=True):
        marks = marks if isinstance(marks, list) else [None] * len(a.pending)
        for (entry_id, replica), mark in zip(a.pending, marks, strict=True):
            if mark and mark.startswith("R"):
                a.on_hand += 1
            else:
                unmarked.append((a, entry_id, replica))
    return unmarked


def _sort_unmarked(r: Any, unmarked: list[tuple[_Agent, str, str]]) -> None:
    """Pending entries without a read mark: those addressed to the agent are on hand when a
    live replica holds them, else unread. Entries not addressed to it are skipped: they are
    acknowledged right after the fetch (or with the next call, after a failed one), so for a
    moment they are pending in its group."""
    calls = [("xrange", (a.keys.stream, i, i)) for a, i, _ in unmarked]
    for (a, entry_id, replica), reply in zip(unmarked, _pipeline_results(r, calls), strict=True):
        if not (isinstance(reply, list) and reply and _addressed(reply[0][1], a.name)):
            continue
        if replica in a.live:
            a.on_hand += 1
        else:
            a.unread_pending_ids.append(entry_id)


def _addressed(fields: Any, agent: str) -> bool:
    return isinstance(fields, dict) and agent in str(fields.get("t", "")).split("\n")


def _backlog(r: Any, a: _Agent, cutoff_ms: int, scan_cap: int) -> AgentBacklog:
    unread = max(a.undone - a.on_hand, 0)
    pending_ms = [id_ms(i) for i in a.unread_pending_ids]
    oldest = min(pending_ms, default=None)
    stale = sum(1 for ms in pending_ms if ms < cutoff_ms)
    queued = unread - len(pending_ms)
    if queued > 0:
        q_oldest, q_stale = _scan_queued(r, a, queued, cutoff_ms, scan_cap)
        if oldest is None:
            oldest = q_oldest
        stale += q_stale
    if unread == 0:
        oldest = None
    return AgentBacklog(a.keys.channel, a.name, unread, stale, oldest)


def _scan_queued(
    r: Any, a: _Agent, queued: int, cutoff_ms: int, scan_cap: int
) -> tuple[int | None, int]:
    """(oldest ms, stale count) of entries after the group cursor addressed to the agent.

    Stops once every queued message is found, once entries are newer than the cutoff and the
    oldest is known, or after ``scan_cap`` entries (then the last entry scanned stands in for
    the oldest: its age is an upper bound).
    """
    oldest: int | None = None
    found = stale = scanned = 0
    last_ms: int | None = None
    start = f"({a.cursor}"
    while scanned < scan_cap:
        want = min(_SCAN_BATCH, scan_cap - scanned)
        try:
            batch = r.xrange(a.keys.stream, start, "+", count=want)
        except ResponseError:
            break
        for entry_id, fields in batch:
            ms = id_ms(entry_id)
            last_ms = ms
            if oldest is not None and ms >= cutoff_ms:
                return oldest, stale
            if _addressed(fields, a.name):
                found += 1
                oldest = ms if oldest is None else oldest
                stale += ms < cutoff_ms
                if found >= queued:
                    return oldest, stale
        scanned += len(batch)
        if len(batch) < want:
            return oldest, stale
        start = f"({batch[-1][0]}"
    return (oldest if oldest is not None else last_ms), stale


def _add(c: ChannelStats, b: AgentBacklog) -> None:
    c.backlogs.append(b)
    c.unread += b.unread
    c.stale += b.stale
    if b.oldest_unread_ms is not None:
        c.oldest_unread_ms = min(b.oldest_unread_ms, c.oldest_unread_ms or b.oldest_unread_ms)
