"""Small helpers the contract tests share: a snapshot of a channel's whole state."""

from __future__ import annotations

from typing import Any, cast

import redis


def channel_state(client: redis.Redis, channel: Any) -> dict[str, Any]:
    """Everything a refused call must leave untouched: stream, counters, buckets, marks."""
    k = channel.keys
    groups = client.xinfo_groups(k.stream) if client.exists(k.stream) else []
    return {
        "len": client.xlen(k.stream),
        "last": client.xrevrange(k.stream, count=1),
        "inbox": client.hgetall(k.inbox),
        "rate": client.hgetall(k.rate),
        "meta": client.hgetall(k.meta),
        "marks": client.hgetall(k.marks),
        "members": client.hgetall(k.members),
        "status": client.hgetall(k.status),
        "groups": sorted((g["name"], g["pending"], g["last-delivered-id"]) for g in groups),
    }


def stream_inbox_counts(client: redis.Redis, channel: Any) -> dict[str, int]:
    """Reconcile: undone messages per recipient, recomputed from the stream and receipt marks."""
    k = channel.keys
    marks = client.hgetall(k.marks)
    counts: dict[str, int] = {}
    # the client decodes replies (decode_responses=True)
    for entry_id, f in cast(list[tuple[str, dict[str, str]]], client.xrange(k.stream)):
        for name in f.get("t", "").split("\n"):
            if not name:
                continue
            mark = marks.get(f"{entry_id}\n{name}", "")
            if mark[:1] not in ("D", "F", "X"):
                counts[name] = counts.get(name, 0) + 1
    return counts
