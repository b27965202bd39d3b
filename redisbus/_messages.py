"""Messages as read back: fields of a stream entry -> ``Message``, who an entry is for, the
arguments of view.lua (read/list) and the parsing of its reply. No I/O."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from . import _validate as check
from ._filters import ENTRY_ID, Filter, later_id, parse_filter, parse_since
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


_DIGITS = re.compile(r"[0-9]{1,18}")
#: The longest ttl a message may carry (send() refuses more): past it, a raw write
_MAX_TTL_S = 1e9


def ttl_seconds(text: str | None) -> float | None:
    """A ttl field as seconds, or None when it is absent or not a finite positive number."""
    if not text or len(text) > 32:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if 0 < v <= _MAX_TTL_S else None


def malformed(f: Mapping[str, str]) -> str:
    """ "" when a stream entry's fields decode as a message, else what is wrong. send.lua and
    outcome.lua only write well-formed entries; anything else came from a raw write, and every
    reader rejects it (reason "malformed": acknowledged, counted down, marked rejected) instead
    of failing on it. The Lua scripts read the same fields with the same rules (``entry_ttl``
    in _prelude.lua)."""
    get = f.get
    if not get("f"):
        return "no sender"
    for k in ("p", "d", "n"):
        v = get(k)
        if v is not None and not _DIGITS.fullmatch(v):
            return f"field {k} is not a number"
    if int(get("p") or 0) > 2:
        return "priority out of range"
    x = get("x")
    if x is not None and ttl_seconds(x) is None:
        return "ttl is not a positive number"
    for k in ("r", "u"):
        v = get(k)
        if v and not ENTRY_ID.match(v):
            return f"field {k} is not an entry id"
    a = get("a")
    if a is not None and a not in ("0", "1"):
        return "broadcast flag is not 0 or 1"
    return ""


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
    m.created_at = _EPOCH + timedelta(milliseconds=int(entry_id.partition("-")[0]))
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


def verdict(
    signer: Signer | None,
    unsigned: str,
    channel: str,
    entry_id: str,
    f: Mapping[str, str],
    me: str,
    my_id: str = "",
    *,
    cascade: bool = False,
) -> tuple[bool | None, str]:
    """(verified, reason) of an entry fetched by ``me``: (None, "") signing off; (True, "")
    verified; (False, "") unsigned and delivered flagged (``unsigned="flag"``); (False,
    reason) rejected: the caller never hands it over and records the reason. An entry that is
    no message at all (``malformed``) is rejected whether signing is on or off."""
    if malformed(f):
        return (None if signer is None or not signer.enabled else False), "malformed"
    if signer is None or not signer.enabled:
        return None, ""
    reason = signer.check(channel, entry_id, f, me, my_id, cascade=cascade)
    if not reason:
        return True, ""
    if reason == "unsigned" and unsigned == "flag":
        return False, ""
    return False, reason


def parse_view(
    channel: str,
    agent: str,
    reply: Sequence[Any],
    *,
    preview_chars: int | None,
    signer: Signer | None = None,
    unsigned: str = "reject",
    agent_id: str = "",
    rejected: list[tuple[str, str]] | None = None,
) -> list[Message]:
    """The messages of a view reply; entries that fail the signature checks are left out, and
    those addressed to ``agent`` are listed in ``rejected`` as (entry id, reason)."""
    out = []
    for entry_id, flat, mark, *handed in reply[VIEW_ENTRIES:]:
        f = fields_from_flat(flat)
        ok, reason = verdict(signer, unsigned, channel, entry_id, f, agent, agent_id)
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
