"""Members of a channel: the roster an agent sees (its family, by routing), the tree, and
the ranking of member cards. No I/O."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import replace

from ._errors import (
    UnknownAgent,
)
from ._model import (
    Member,
    Relationship,
    Roster,
)


def new_agent_id() -> str:
    return "ag-" + secrets.token_hex(6)


# -- roster -------------------------------------------------------------------------------------


def members_from_hashes(
    records: Mapping[str, str], statuses: Mapping[str, str]
) -> dict[str, Member]:
    out = {}
    for name, raw in records.items():
        r = json.loads(raw)
        skills = r.get("skills") or []
        out[name] = Member(
            name=name,
            id=r["id"],
            parent=r.get("parent") or None,
            depth=int(r.get("depth", 0)),
            status=statuses.get(name, "running"),  # type: ignore[arg-type]
            host=r.get("host", ""),
            description=r.get("description", ""),
            skills=tuple(skills) if isinstance(skills, list) else (),
        )
    return out


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
