"""What the console shows of one channel, read without touching its state.

The console never joins a channel: it has no consumer group, sets no read mark and acks
nothing. It reads the channel through the public API where there is a call for it (``tree``,
``dead_letters``, ``refresh``) and otherwise with read-only commands on keys from the key
builder: ``XREVRANGE``/``XREAD`` on the stream, ``receipt.lua`` (which only reads the groups and
marks), and a few counters for spotting change.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _bindings as bind
from .. import _core as core
from .._errors import InvalidInput, UnknownAgent
from .._keys import ChannelKeys
from .._model import Message, Receipt
from .._validate import channel_name
from ..aio import AsyncBus, AsyncChannel

# a recipient's receipt in one of these never changes again: no need to read it twice
FINAL = frozenset({"done", "failed", "expired", "rejected"})


def ms(d: Any) -> int | None:
    return None if d is None else int(d.timestamp() * 1000)


def receipt_json(r: Receipt) -> dict[str, object]:
    return {
        "to": r.to,
        "status": r.status,
        "queued_ms": ms(r.queued_at),
        "delivered_ms": ms(r.delivered_at),
        "read_ms": ms(r.read_at),
        "done_ms": ms(r.done_at),
        "result": r.result,
    }


def message_json(
    m: Message, receipts: Sequence[Receipt], now_ms: int, stuck_after_s: float
) -> dict[str, object]:
    created = ms(m.created_at) or 0
    waiting = [r for r in receipts if r.status not in FINAL]
    return {
        "id": m.id,
        "from": m.sender,
        "to": list(m.to),
        "subject": m.subject,
        "body": m.body,
        "type": m.type,
        "priority": m.priority,
        "reply_to": m.reply_to,
        "depth": m.depth,
        "created_ms": created,
        "receipts": [receipt_json(r) for r in receipts],
        # unread: some recipient has not had it in full yet; stuck: some recipient has not
        # finished it within stuck_after_s
        "unread": any(r.status in ("queued", "delivered") for r in receipts),
        "stuck": bool(waiting) and now_ms - created > stuck_after_s * 1000,
    }


def threads(messages: Sequence[dict[str, Any]]) -> list[dict[str, object]]:
    """Group messages by reply chain: each thread is a root and every reply under it. A reply
    whose parent is no longer on screen starts a thread of its own (``partial``)."""
    by_id = {m["id"]: m for m in messages}
    root_of: dict[str, str] = {}

    def root(mid: str) -> str:
        seen = []
        cur = mid
        while cur not in root_of:
            seen.append(cur)
            parent = by_id[cur]["reply_to"]
            if parent is None or parent not in by_id or parent in seen:
                root_of[cur] = cur
                break
            cur = parent
        r = root_of[cur]
        for s in seen:
            root_of[s] = r
        return r

    groups: dict[str, list[dict[str, Any]]] = {}
    for m in messages:
        groups.setdefault(root(m["id"]), []).append(m)
    out = [
        {
            "root": rid,
            "subject": by_id[rid]["subject"],
            "partial": by_id[rid]["reply_to"] is not None,
            "last_id": msgs[-1]["id"],
            "messages": msgs,
        }
        for rid, msgs in groups.items()
    ]
    # the thread with the latest message first
    out.sort(key=lambda t: _id_key(str(t["last_id"])), reverse=True)
    return out


def _id_key(entry_id: str) -> tuple[int, int]:
    a, _, b = entry_id.partition("-")
    return int(a), int(b or 0)


async def open_channel(bus: AsyncBus, name: str) -> AsyncChannel:
    """The channel as stored, without creating it: ``bus.channel(name)`` would create a missing
    channel, and looking must never do that."""
    cname = channel_name(name)
    keys = ChannelKeys.build(bus.settings.prefix, cname)
    meta = await bus._io.call(bus.redis.hgetall, keys.meta)
    if not meta:
        raise UnknownAgent(f"no such channel: {cname!r}")
    return AsyncChannel(bus, keys, core.config_from_hash(cname, meta))


@dataclass
class ChannelView:
    """The messages on one screen and what has been read of them: a live stream keeps one."""

    channel: AsyncChannel
    limit: int = 200
    stuck_after_s: float = 60.0
    last_id: str = "0-0"
    messages: list[Message] = field(default_factory=list)
    receipts: dict[str, list[Receipt]] = field(default_factory=dict)
    fingerprint: object = None

    @property
    def _io(self) -> Any:
        return self.channel.bus._io

    @property
    def keys(self) -> ChannelKeys:
        return self.channel.keys

    async def load(self) -> None:
        """The latest ``limit`` messages of the channel."""
        r = self._io.r
        entries = await self._io.call(r.xrevrange, self.keys.stream, count=self.limit)
        self.messages = [self._message(i, f) for i, f in reversed(entries)]
        if self.messages:
            self.last_id = self.messages[-1].id

    def _message(self, entry_id: str, fields: dict[str, str]) -> Message:
        return core.message_from_fields(self.channel.name, entry_id, fields, read=False)

    def add(self, entries: Iterable[tuple[str, dict[str, str]]]) -> bool:
        new = [self._message(i, f) for i, f in entries]
        if not new:
            return False
        self.messages = (self.messages + new)[-self.limit :]
        self.last_id = new[-1].id
        kept = {m.id for m in self.messages}
        self.receipts = {k: v for k, v in self.receipts.items() if k in kept}
        return True

    async def follow(self, block_ms: int) -> bool:
        """Block on the stream for entries after the last one seen; True when some came."""
        r = self._io.r
        reply = await self._io.call(
            r.xread, {self.keys.stream: self.last_id}, count=100, block=block_ms
        )
        return self.add(reply[0][1] if reply else [])

    async def changed(self) -> bool:
        """Whether anything a receipt, the tree or the dead letters show has changed since the
        last call: the groups' cursors and pending counts, the marks, statuses, pause switch
        and dead-letter count (a handful of reads, whatever the number of messages)."""
        k = self.keys
        pipe = self._io.r.pipeline(transaction=False)
        pipe.xinfo_groups(k.stream)
        pipe.hlen(k.marks)
        pipe.hgetall(k.status)
        pipe.hget(k.meta, "paused")
        pipe.xlen(k.dlq)
        got = await self._io.call(pipe.execute, raise_on_error=False)
        groups = got[0] if isinstance(got[0], list) else []
        fp = repr(
            (
                sorted(
                    (str(g.get("name")), g.get("last-delivered-id"), g.get("pending"), g.get("lag"))
                    for g in groups
                ),
                *(x if not isinstance(x, Exception) else None for x in got[1:]),
            )
        )
        if fp == self.fingerprint:
            return False
        self.fingerprint = fp
        return True

    async def _refresh_receipts(self) -> None:
        def settled(mid: str) -> bool:
            known = self.receipts.get(mid)
            return known is not None and all(r.status in FINAL for r in known)

        todo = [m.id for m in self.messages if m.to and not settled(m.id)]
        if not todo:
            return
        replies = await self._io.scripts([bind.receipt(self.keys, i) for i in todo])
        for mid, reply in zip(todo, replies, strict=True):
            try:
                self.receipts[mid] = core.parse_receipt(mid, reply)
            except InvalidInput:  # trimmed since it was read
                self.receipts[mid] = []

    async def snapshot(self, writable: bool) -> dict[str, object]:
        """Everything the page shows, as JSON-ready data."""
        await self._refresh_receipts()
        cfg = await self.channel.refresh()
        tree = await self.channel.tree()
        dead = await self.channel.dead_letters(limit=self.limit)
        sec, usec = await self._io.call(self._io.r.time)
        now_ms = int(sec) * 1000 + int(usec) // 1000
        msgs = [
            message_json(m, self.receipts.get(m.id, []), now_ms, self.stuck_after_s)
            for m in self.messages
        ]
        return {
            "channel": self.channel.name,
            "routing": cfg.routing,
            "paused": cfg.paused,
            "writable": writable,
            "now_ms": now_ms,
            "stuck_after_s": self.stuck_after_s,
            "limit": self.limit,
            "tree": [m.as_dict() for m in tree],
            "threads": threads(msgs),
            "unread": sum(1 for m in msgs if m["unread"]),
            "stuck": sum(1 for m in msgs if m["stuck"]),
            "dead_letters": [
                {
                    "id": d.id,
                    "original_id": d.original_id,
                    "recipient": d.recipient,
                    "deliveries": d.deliveries,
                    "reason": d.reason,
                    "dead_ms": ms(d.dead_at),
                    "from": d.message.sender,
                    "subject": d.message.subject,
                    "body": d.message.body,
                }
                for d in dead
            ],
        }


async def channel_list(bus: AsyncBus) -> list[dict[str, object]]:
    """Every channel with its size, pause switch and member count."""
    out = []
    r = bus.redis
    for name in await bus.channels():
        k = ChannelKeys.build(bus.settings.prefix, name)
        pipe = r.pipeline(transaction=False)
        pipe.hget(k.meta, "paused")
        pipe.xlen(k.stream)
        pipe.hlen(k.members)
        pipe.xlen(k.dlq)
        paused, length, members, dead = await bus._io.call(pipe.execute)
        out.append(
            {
                "name": name,
                "paused": paused == "1",
                "messages": int(length),
                "members": int(members),
                "dead_letters": int(dead),
            }
        )
    return out
