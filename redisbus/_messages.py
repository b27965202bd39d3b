"""Messages as read back: fields of a stream entry -> ``Message``, who an entry is for, the
arguments of view.lua (read/list) and the parsing of its reply. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from . import _validate as check
from ._entries import ttl_seconds
from ._filters import Filter, later_id, parse_filter, parse_since
from ._model import (
    _EPOCH,
    Message,
    WaitKind,
    _OpenMessage,
    frozen_as,
    id_ms,
)
from ._signing import Signer

# -- messages -----------------------------------------------------------------------------------

#: The time of an entry id past what a datetime holds (an XADD with an explicit id may write one)
_LAST = datetime.max.replace(tzinfo=UTC)


def message_from_fields(
    channel: str,
    entry_id: str,
    f: Mapping[str, str],
    *,
    read: bool,
    deliveries: int = 1,
    verified: bool | None = None,
) -> Message:
    # Every wake-up makes one of these: one lookup per field, and the eighteen fields set on
    # an unguarded twin that then becomes a Message (see _model.frozen_as for why and what
    # guards it; tests/contract/test_model.py compares the result with the keyword form)
    get = f.get
    to, prio, depth, ttl = get("t"), get("p"), get("d"), get("x")
    m: Any = _OpenMessage()
    m.id, m.channel, m.sender, m.to = (
        entry_id,
        channel,
        get("f", ""),
        tuple(to.split("\n")) if to else (),
    )
    m.subject, m.body, m.type = get("s", ""), get("b", ""), get("k", "message")
    m.priority = int(prio) if prio and prio.isdigit() else 0
    m.reply_to = get("r") or None
    m.depth = int(depth) if depth and depth.isdigit() else 0
    try:
        m.created_at = _EPOCH + timedelta(milliseconds=int(entry_id.partition("-")[0]))
    except (ValueError, OverflowError):  # a raw write's id: past 9999, or no id at all
        m.created_at = _LAST if entry_id[:1].isdigit() else _EPOCH
    m.ttl_s = ttl_seconds(ttl)  # (never raises: a raw entry's fields are checked by malformed())
    m.read, m.truncated, m.verified, m.deliveries = read, False, verified, deliveries
    m.idempotency_key, m.trace = get("i") or None, get("c") or None
    return frozen_as(m, Message)


def fields_from_flat(flat: Sequence[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=False))


def addressed_to(f: Mapping[str, str], agent: str) -> bool:
    to = f.get("t")
    return to is not None and (to == agent or agent in to.split("\n"))


def expired_at(entry_id: str, f: Mapping[str, str], now_ms: int) -> bool:
    ttl = ttl_seconds(f.get("x"))
    return ttl is not None and id_ms(entry_id) + ttl * 1000 < now_ms


def wait_kind(agent: str, messages: Sequence[Message]) -> WaitKind:
    """The kind of a wait() that returns ``messages``: "cancelled" when any is a cancel,
    "outcome" when all are outcomes, else "message"."""
    outcomes = bool(messages)
    for m in messages:
        if m.type != "outcome":
            if m.type == "control" and m.subject == "cancel":
                return "cancelled"
            outcomes = False
    return "outcome" if outcomes else "message"


# -- views (read / list) ------------------------------------------------------------------------


# view.lua's reply: {now_ms, scanned, more, resume, entry, ...}
VIEW_ENTRIES = 4


@dataclass(frozen=True, slots=True)
class ViewPlan:
    filter: Filter
    argv: list[str]
    limit: int


def plan_view(
    agent: str,
    consumer: str,
    routing: str,
    filter_by: object,
    since: object,
    limit: object,
    *,
    pull: bool,
    mark: bool,
) -> ViewPlan:
    flt = parse_filter(filter_by)
    lim = check.integer(limit, "limit", 1, 10_000)
    lower = later_id(parse_since(since), flt.after)
    to = agent if flt.to == "me" else (flt.to or "")
    scope = "board" if routing == "open" else "own"
    argv = [
        agent,
        consumer,
        "1" if pull else "0",
        "1" if mark else "0",
        lower or "",
        str(lim),
        "1" if flt.unread else "0",
        flt.sender or "",
        to,
        subject_forms(flt.subject or ""),
        scope,
    ]
    return ViewPlan(flt, argv, lim)


def subject_forms(text: str) -> str:
    """A ``subject:`` filter as view.lua matches it: per character, the forms it takes in any
    case (lower, upper, title, case-folded), so "subject:Émile" finds "ÉMILE" and "émile" with
    Python's Unicode case rules (Lua's ``string.lower`` knows only ASCII)."""
    groups = []
    for ch in text:
        forms = dict.fromkeys((ch, ch.lower(), ch.upper(), ch.title(), ch.casefold()))
        groups.append("\t".join(forms))
    return "\n".join(groups)


def parse_view(
    channel: str,
    agent: str,
    reply: Sequence[Any],
    *,
    preview_chars: int | None,
    signer: Signer,
    unsigned: str = "reject",
    agent_id: str = "",
    rejected: list[tuple[str, str]] | None = None,
) -> list[Message]:
    """The messages of a view reply; entries that fail the signature checks are left out, and
    those addressed to ``agent`` are listed in ``rejected`` as (entry id, reason)."""
    out = []
    for entry_id, flat, mark, *handed in reply[VIEW_ENTRIES:]:
        f = fields_from_flat(flat)
        ok, reason = signer.verdict(channel, entry_id, f, agent, agent_id, unsigned=unsigned)
        if reason:
            if rejected is not None and addressed_to(f, agent):
                rejected.append((entry_id, reason))
            continue
        n = int(handed[0]) if handed and int(handed[0]) > 0 else 1
        msg = message_from_fields(
            channel, entry_id, f, read=(mark != ""), verified=ok, deliveries=n
        )
        if preview_chars is not None and len(msg.body) > preview_chars:
            msg = replace(msg, body=msg.body[:preview_chars], truncated=True)
        out.append(msg)
    return out
