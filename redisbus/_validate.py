"""Argument checks shared by every face: wrong types and shapes become InvalidInput at once.

Limits that live in Redis (sizes, caps, rates) are checked by the scripts, which are the single
authority; these checks only catch what no script should ever see.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._errors import InvalidInput
from ._settings import MAX_DURATION_S, MAX_NAME_CHARS, MAX_RATE, MAX_WAIT_S

RESERVED = frozenset({"all", "parent", "me"})


def name(value: object, what: str = "agent name", max_chars: int = 128) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > max_chars:
        raise InvalidInput(f"{what} must be 1..{max_chars} characters, got {len(value)}")
    if not value.isprintable() or value != value.strip():
        raise InvalidInput(f"{what} must be printable, without control characters: {value!r}")
    return value


def member(value: object, what: str) -> str:
    """A name that refers to a member (a recipient, a parent, a child): as long as the longest
    name any channel allows, since its channel's own ``max_name_chars`` held when it joined;
    whether it is a member is the script's to say."""
    return name(value, what, MAX_NAME_CHARS)


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
        raise InvalidInput(
            "message body is not valid UTF-8 (it holds a lone surrogate, which UTF-8 cannot encode)"
        ) from None
    return value


def recipients(to: object) -> tuple[str, list[str]]:
    """Return (mode, names): mode "one", "many" or "all"."""
    if isinstance(to, str):
        if to == "all":
            return "all", []
        return "one", [member(to, "recipient")]
    if isinstance(to, Iterable) and not isinstance(to, bytes | dict):
        names = [member(n, "recipient") for n in to]
        if not names:
            raise InvalidInput("recipient list is empty")
        if "all" in names:
            raise InvalidInput('"all" cannot be combined with other recipients')
        return "many", names
    raise InvalidInput(f"to must be a name, a list of names or 'all', got {type(to).__name__}")


def _shown(value: float) -> str:
    """A refused number as an error message shows it: a huge int by its size (its digits could
    be more than Python converts to text)."""
    if isinstance(value, int) and abs(value) > 10**30:
        return f"{'-' if value < 0 else ''}2**{value.bit_length() - 1} or more"
    return repr(value)


def _bounded(value: object, what: str, unit: str, lo: float, hi: float) -> float:
    """A finite int or float within [lo, hi] (not a bool): the one place numbers are judged,
    before any conversion, so an int too large for a float is refused, not an OverflowError."""
    # (the range's text is made only for an error: every wait() passes through here)
    if isinstance(value, bool) or not isinstance(value, int | float):
        span = f"between {lo:.15g} and {hi:.15g}{unit}"
        raise InvalidInput(f"{what} must be a number {span}, got {type(value).__name__}")
    if not lo <= value <= hi:  # NaN compares false: refused here too
        raise InvalidInput(
            f"{what} must be between {lo:.15g} and {hi:.15g}{unit}, got {_shown(value)}"
        )
    return float(value)


def seconds(
    value: object, what: str, *, maximum: float = MAX_WAIT_S, allow_zero: bool = True
) -> float:
    v = _bounded(value, what, " seconds", 0.0, maximum)
    if v == 0 and not allow_zero:
        raise InvalidInput(f"{what} must be more than 0 and at most {maximum:.15g} seconds")
    return v


def duration(value: object, what: str) -> float:
    """Seconds that end up as milliseconds in Redis: 0 up to ten years."""
    return seconds(value, what, maximum=MAX_DURATION_S)


def integer(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        kind = type(value).__name__
        raise InvalidInput(f"{what} must be an integer between {lo} and {hi}, got {kind}")
    if not lo <= value <= hi:
        raise InvalidInput(f"{what} must be between {lo} and {hi}, got {_shown(value)}")
    return value


def positive_number(
    value: object, what: str, *, allow_zero: bool = True, maximum: float = MAX_RATE
) -> float:
    """A finite number from 0 (or above 0) up to ``maximum``: by default MAX_RATE, whose
    thousandfold (milliseconds, per-mille refills) is still an exact integer."""
    v = _bounded(value, what, "", 0.0, maximum)
    if v == 0 and not allow_zero:
        raise InvalidInput(f"{what} must be more than 0 and at most {maximum:.15g}")
    return v
