"""What a raw stream entry must hold to be read as a message (``malformed``), and its ttl field.
No I/O; the Lua scripts read the same fields with the same rules (``entry_ttl`` in
_prelude.lua)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ._filters import ENTRY_ID

__all__ = ["malformed", "ttl_seconds"]

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
