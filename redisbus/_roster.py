"""Members of a channel: the roster an agent sees (its family, by routing), the tree, and
the ranking of member cards. No I/O."""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ._errors import (
    UnknownAgent,
)
from ._model import (
    Member,
    Relationship,
    Roster,
)

log = logging.getLogger("redisbus")


def new_agent_id() -> str:
    return "ag-" + secrets.token_hex(6)


# -- roster -------------------------------------------------------------------------------------


def members_from_hashes(
    records: Mapping[str, str], statuses: Mapping[str, str], channel: str = ""
) -> dict[str, Member]:
    """Members from the members hash (name -> join.lua's JSON record) and the status hash. A
    record a raw write left unreadable (not JSON, not an object, a field of the wrong type)
    is read for what it holds: the member is still listed, by name and status, with the
    fields it lacks left empty; said once, as a warning, never raised (the tree, every
    roster and every ``discover`` would fail on it)."""
    out = {}
    for name, raw in records.items():
        r, why = _record(raw)
        if why:
            _warn(channel, name, raw, why)
        out[name] = Member(
            name=name,
            id=r["id"],
            parent=r["parent"] or None,
            depth=r["depth"],
            status=statuses.get(name, "running"),  # type: ignore[arg-type]
            host=r["host"],
            description=r["description"],
            skills=r["skills"],
        )
    return out


def _record(raw: object) -> tuple[dict[str, Any], str]:
    """A member's record as Member's fields (each of its type, the default where the record
    has none), and what was wrong with it ("" when nothing)."""
    out: dict[str, Any] = {"id": "", "parent": "", "depth": 0, "host": "", "description": ""}
    out["skills"] = ()
    try:
        r = json.loads(raw) if isinstance(raw, str | bytes) else None
    except (ValueError, RecursionError):
        return out, "not JSON"
    if not isinstance(r, dict):
        return out, "not a JSON object"
    wrong = []
    for k in ("id", "parent", "host", "description"):
        v = r.get(k)
        if isinstance(v, str):
            out[k] = v
        elif v is not None or k == "id":
            wrong.append(k)
    depth = r.get("depth", 0)
    if isinstance(depth, int) and not isinstance(depth, bool) and 0 <= depth < 1 << 31:
        out["depth"] = depth
    else:
        wrong.append("depth")
    skills = r.get("skills") or []  # (cjson writes an empty list as {})
    if isinstance(skills, list) and all(isinstance(x, str) for x in skills):
        out["skills"] = tuple(skills)
    else:
        wrong.append("skills")
    return out, f"bad {', '.join(wrong)}" if wrong else ""


# (channel, name, record) already warned about: one line per bad record and process, not one
# per roster read; bounded, so a flood of distinct records cannot grow it without end
_warned: set[tuple[str, str, str]] = set()


def _warn(channel: str, name: str, raw: object, why: str) -> None:
    key = (channel, name, str(raw)[:64])
    if key in _warned:
        return
    if len(_warned) >= 1024:
        _warned.clear()
    _warned.add(key)
    log.warning(
        "redisbus: channel %r: the record of member %r is unreadable (%s): %r; listed by name "
        "and status (a raw write made it)",
        channel, name, why, str(raw)[:64],
    )  # fmt: skip


def roster_of(me: str, members: Mapping[str, Member], routing: str, siblings: bool) -> Roster:
    if me not in members:
        raise UnknownAgent(f"{me!r} is not a member of this channel")
    self_m = members[me]
    groups: dict[Relationship, list[Member]] = {
        "parent": [],
        "sibling": [],
        "child": [],
        "member": [],
    }
    for name, m in members.items():
        if name == me:
            continue
        rel: Relationship
        if m.parent == me:
            rel = "child"
        elif self_m.parent is not None and name == self_m.parent:
            rel = "parent"
        elif m.parent == self_m.parent:
            rel = "sibling"
        else:
            rel = "member"
        reachable = (
            routing == "open" or rel in ("parent", "child") or (rel == "sibling" and siblings)
        )
        if reachable:
            groups[rel].append(replace(m, relationship=rel))
    family: list[Member] = []
    for rel in ("parent", "sibling", "child", "member"):
        family += sorted(groups[rel], key=lambda m: m.name)
    return Roster(self=self_m, family=family)


def tree_order(members: Mapping[str, Member]) -> list[Member]:
    """Every member, parents before children, siblings by name."""
    children: dict[str | None, list[Member]] = {}
    for m in members.values():
        children.setdefault(m.parent if m.parent in members else None, []).append(m)
    out: list[Member] = []
    stack = sorted(children.get(None, []), key=lambda m: m.name, reverse=True)
    while stack:
        m = stack.pop()
        out.append(m)
        stack += sorted(children.get(m.name, []), key=lambda c: c.name, reverse=True)
    return out


def rank_cards(query: str, roster: Roster, limit: int) -> list[Member]:
    """Agent cards ranked for a query: skill matches count double, then description and name."""
    words = [w for w in query.lower().replace(",", " ").split() if w]
    scored = []
    for pos, m in enumerate(roster.family):
        skills = " ".join(m.skills).lower()
        text = f"{m.name} {m.description}".lower()
        score = sum(2 * (w in skills) + (w in text) for w in words)
        if score or not words:
            scored.append((-score, pos, m))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [m for _, _, m in scored[:limit]]
