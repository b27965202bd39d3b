"""Argument checks shared by every face: wrong types and shapes become InvalidInput at once.

Limits that live in Redis (sizes, caps, rates) are checked by the scripts, which are the single
authority; these checks only catch what no script should ever see.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ._errors import InvalidInput
from ._settings import MAX_WAIT_S

RESERVED = frozenset({"all", "parent", "me"})


def name(value: object, what: str = "agent name", max_chars: int = 128) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > max_chars:
        raise InvalidInput(f"{what} must be 1..{max_chars} characters, got {len(value)}")
    if not value.isprintable() or value != value.strip():
        raise InvalidInput(f"{what} must be printable, without control characters: {value!r}")
    return value


def agent_name(value: object, max_chars: int = 128) -> str:
    v = name(value, "agent name", max_chars)
    if v in RESERVED:
        raise InvalidInput(f"{v!r} is reserved and cannot name an agent")
    return v


def channel_name(value: object) -> str:
    v = name(value, "channel name")
    if "{" in v or "}" in v:
        raise InvalidInput("channel name cannot contain braces (they delimit the hash tag)")
    return v


def text(
    value: object, what: str, max_chars: int | None = None, allow_newlines: bool = False
) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if max_chars is not None and len(value) > max_chars:
        raise InvalidInput(f"{what} must be at most {max_chars} characters")
    if allow_newlines:
        bad = any(not (c.isprintable() or c in "\n\t\r") for c in value)
    else:
        bad = not value.isprintable()
    if bad:
        raise InvalidInput(f"{what} has control characters")
    return value


def body(value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"message body must be a string, got {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("message body is not valid Unicode (lone surrogate)") from None
    return value


def recipients(to: object) -> tuple[str, list[str]]:
    """Return (mode, names): mode "one", "many" or "all"."""
    if isinstance(to, str):
        if to == "all":
            return "all", []
        return "one", [name(to, "recipient")]
    if isinstance(to, Iterable) and not isinstance(to, bytes | dict):
        names = [name(n, "recipient") for n in to]
        if not names:
            raise InvalidInput("recipient list is empty")
        if "all" in names:
            raise InvalidInput('"all" cannot be combined with other recipients')
        return "many", names
    raise InvalidInput(f"to must be a name, a list of names or 'all', got {type(to).__name__}")


def seconds(
    value: object, what: str, *, maximum: float = MAX_WAIT_S, allow_zero: bool = True
) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number of seconds, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or v < 0 or (v == 0 and not allow_zero):
        raise InvalidInput(f"{what} must be {'>= 0' if allow_zero else '> 0'} seconds, got {value}")
    if v > maximum:
        raise InvalidInput(f"{what} must be at most {maximum:g} seconds, got {value}")
    return v


def integer(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{what} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} must be between {lo} and {hi}, got {value}")
    return value


def positive_number(value: object, what: str, *, allow_zero: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or math.isinf(v) or v < 0 or (v == 0 and not allow_zero):
        raise InvalidInput(f"{what} must be a finite number >= 0, got {value}")
    return v
