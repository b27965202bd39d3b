"""Channels as stored in Redis: their limits and routing (``ChannelConfig``), the arguments
of channel.lua, and what a janitor pass and the dead-letter stream report. No I/O."""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from . import _validate as check
from ._entries import malformed
from ._errors import (
    ChannelMismatch,
    InvalidInput,
    UnknownAgent,
)
from ._filters import ENTRY_ID
from ._messages import message_from_fields
from ._model import (
    DeadLetter,
    ms_to_dt,
)
from ._settings import MAX_COUNT, MAX_DURATION_S, MAX_RATE, BusSettings

log = logging.getLogger("redisbus")

Routing = Literal["open", "family"]


class ChannelLimits(TypedDict, total=False):
    """The limits a channel stores in Redis, each with its type: the keyword arguments of
    ``bus.channel(name, ...)`` and ``ch.configure(...)``. One left out takes the ``BusSettings``
    field of the same name (see the configuration reference); any other name is refused
    (InvalidInput)."""

    inbox_cap: int
    max_body_bytes: int
    max_name_chars: int
    pair_rate_burst: float
    pair_rate_per_s: float
    sender_rate_burst: float
    sender_rate_per_s: float
    max_chain_depth: int
    max_chain_messages: int
    max_depth: int
    max_members: int
    max_messages: int
    retention_s: float
    lease_s: float
    max_deliveries: int
    dampen_turns: int
    dampen_window_s: float
    breaker_failures: int
    breaker_window_s: float
    breaker_cooldown_s: float
    auto_reply_deny: Sequence[str]  # senders whose messages get no automatic reply


# The numeric channel limits, in the order channel.lua gets them: ChannelLimits' numbers.
LIMITS: tuple[str, ...] = tuple(f for f in ChannelLimits.__annotations__ if f != "auto_reply_deny")
_INT_LIMITS = frozenset(
    {
        "inbox_cap",
        "max_body_bytes",
        "max_name_chars",
        "max_chain_depth",
        "max_chain_messages",
        "max_depth",
        "max_members",
        "max_messages",
        "max_deliveries",
        "dampen_turns",
        "breaker_failures",
    }
)
_DURATION_LIMITS = frozenset(
    {"retention_s", "lease_s", "dampen_window_s", "breaker_window_s", "breaker_cooldown_s"}
)


def limit_range(field: str) -> float:
    """The largest value channel limit ``field`` may hold (the smallest is 0): what every host
    can turn into milliseconds, and every script into a number, without overflowing."""
    if field in _INT_LIMITS:
        return MAX_COUNT
    return MAX_DURATION_S if field in _DURATION_LIMITS else MAX_RATE


@functools.cache
def limit_bounds(field: str) -> tuple[float, bool, float]:
    """(lowest, lowest excluded, highest): the range ``BusSettings`` allows the default of
    channel limit ``field``, which a value passed to ``bus.channel()`` or ``ch.configure()`` is
    held to as well (an inbox cap of 0, say, would be a channel nobody can receive on)."""
    lo, strict, hi = 0.0, False, limit_range(field)
    for bound in BusSettings.model_fields[field].metadata:
        if getattr(bound, "ge", None) is not None:
            lo = max(lo, float(bound.ge))
        if getattr(bound, "gt", None) is not None:
            lo, strict = max(lo, float(bound.gt)), True
        if getattr(bound, "le", None) is not None:
            hi = min(hi, float(bound.le))
    return lo, strict, hi


def fmt_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """A channel's configuration as stored in Redis (every host enforces the same numbers).

    Each limit of ``ChannelLimits`` is an attribute; it is None when Redis holds no readable
    value for it (a hand-written or out-of-range one), and the host's ``BusSettings`` value
    applies then. ``limits`` maps the names of the stored ones to their values."""

    name: str
    routing: Routing
    siblings: bool
    paused: bool
    limits: Mapping[str, float]
    created_ms: int
    inbox_cap: int | None = None
    max_body_bytes: int | None = None
    max_name_chars: int | None = None
    pair_rate_burst: float | None = None
    pair_rate_per_s: float | None = None
    sender_rate_burst: float | None = None
    sender_rate_per_s: float | None = None
    max_chain_depth: int | None = None
    max_chain_messages: int | None = None
    max_depth: int | None = None
    max_members: int | None = None
    max_messages: int | None = None
    retention_s: float | None = None
    lease_s: float | None = None
    max_deliveries: int | None = None
    dampen_turns: int | None = None
    dampen_window_s: float | None = None
    breaker_failures: int | None = None
    breaker_window_s: float | None = None
    breaker_cooldown_s: float | None = None


def plan_channel(
    settings: BusSettings, routing: object, siblings: object, overrides: Mapping[str, object]
) -> list[tuple[str, str, bool]]:
    """The channel's settings as channel.lua takes them: (field, value, explicit: the caller
    passed it) for each. ``overrides`` is checked here, not trusted to match
    ``ChannelLimits``: an unknown name or a bad value is InvalidInput."""
    overrides = dict(overrides)
    deny = overrides.pop("auto_reply_deny", None)
    unknown = set(overrides) - set(LIMITS)
    if unknown:
        raise InvalidInput(f"unknown channel limit(s): {', '.join(sorted(unknown))}")
    if routing is not None and routing not in ("open", "family"):
        raise InvalidInput(f"routing must be 'open' or 'family', got {routing!r}")
    if siblings is not None and not isinstance(siblings, bool):
        raise InvalidInput("siblings must be True or False")
    default_siblings = "1" if (routing or "open") == "open" else "0"
    out: list[tuple[str, str, bool]] = [
        ("routing", str(routing or "open"), routing is not None),
        ("siblings", default_siblings if siblings is None else ("1" if siblings else "0"),
         siblings is not None),
    ]  # fmt: skip
    for field in LIMITS:
        if field in overrides and overrides[field] is not None:
            value = overrides[field]
            lo, strict, hi = limit_bounds(field)
            if field in _INT_LIMITS:
                v: float = check.integer(value, field, int(lo) + strict, int(hi))
            elif field in _DURATION_LIMITS:
                v = check.seconds(value, field, maximum=hi, allow_zero=not strict)
            else:
                v = check.positive_number(value, field, allow_zero=not strict, maximum=hi)
            explicit = True
        else:
            v = float(getattr(settings, field))
            explicit = False
        out.append((field, fmt_number(v), explicit))
    if deny is None:
        out.append(("auto_reply_deny", "\n".join(settings.auto_reply_deny), False))
    else:
        if isinstance(deny, str) or not isinstance(deny, list | tuple | set | frozenset):
            raise InvalidInput("auto_reply_deny must be a list of agent names")
        names = [check.member(n, "denied sender") for n in deny]
        out.append(("auto_reply_deny", "\n".join(names), True))
    return out


def parse_channel(name: str, reply: Sequence[Any]) -> tuple[bool, ChannelConfig]:
    if int(reply[0]) == 0:
        _, field, stored, wanted = reply
        raise ChannelMismatch(
            f"channel {name!r} exists with {field}={stored}; you passed {wanted} "
            f"(attach without it, or reconfigure with ch.configure({field}=...))"
        )
    created = int(reply[1]) == 1
    flat = list(reply[2:])
    return created, config_from_hash(name, dict(zip(flat[::2], flat[1::2], strict=True)))


def config_from_hash(name: str, h: Mapping[str, str]) -> ChannelConfig:
    if not h:
        raise UnknownAgent(f"no such channel: {name!r}")
    limits = {f: v for f in LIMITS if f in h and (v := _stored(name, f, h[f])) is not None}
    typed: dict[str, Any] = {f: int(v) if f in _INT_LIMITS else v for f, v in limits.items()}
    return ChannelConfig(
        name=name,
        routing="family" if h.get("routing") == "family" else "open",
        siblings=h.get("siblings") == "1",
        paused=h.get("paused") == "1",
        limits=limits,
        created_ms=int(h.get("created_ms", "0")),
        **typed,
    )


# (channel, field, stored text) already warned about: one line per poisoned value and process,
# not one per attach; bounded, so a flood of distinct values cannot grow it without end
_warned: set[tuple[str, str, str]] = set()


def _first(seen: set[tuple[str, str]] | set[tuple[str, str, str]], key: Any) -> bool:
    """Whether ``key`` is new to ``seen`` (then added): what a warning is said once for. The
    set is bounded (cleared at 1,024), so a flood of distinct values cannot grow it."""
    if key in seen:
        return False
    if len(seen) >= 1024:
        seen.clear()
    seen.add(key)
    return True


def _stored(channel: str, field: str, raw: str) -> float | None:
    """A stored limit as every reader may use it: within 0..limit_range(field). Meta written
    raw (by hand, an attacker, an old version) can hold anything: a number past the range is
    read as the range's end, anything else (text, NaN, a negative number) as missing, so each
    reader falls back to its own default. Said once, as a warning, never raised: raising
    would break every wait() and sweep() of the channel on every host."""
    top = limit_range(field)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        v = math.nan
    if 0 <= v <= top:
        return v
    clamped = top if v > top else None
    if _first(_warned, (channel, field, str(raw)[:64])):
        log.warning(
            "redisbus: channel %r stores %s=%r, outside 0..%s: %s (ch.configure(%s=...) "
            "stores a good one)",
            channel, field, str(raw)[:64], fmt_number(top),
            f"read as {fmt_number(top)}" if clamped is not None else "the default applies",
            field,
        )  # fmt: skip
    return clamped


def _count(text: str | None) -> int:
    """A whole number field of a dead letter, 0 when a raw write left something else."""
    return int(text) if text and text.isdigit() and len(text) < 20 else 0


#: The fields sweep.lua's dead_letter() writes before the message's own (whose 'a', a
#: broadcast's flag, it drops, and whose 'g' and 'n' it keeps as 'og' and 'on').
_DLQ_OWN = frozenset({"o", "a", "n", "w", "dead_ms", "og", "on"})
#: The last millisecond a datetime holds (9999-12-31T23:59:59.999Z): past it, no time at all.
_MAX_MS = 253_402_300_799_999
_NUMBER = re.compile(r"[0-9]{1,18}")


def dead_letter_fault(f: Mapping[str, str]) -> str:
    """ "" when the fields of a dead-letter stream entry are a dead letter as sweep.lua writes
    one, else what is wrong. Anything else came from a raw write (by hand, an attacker, a
    bug): ``ch.dead_letters()`` passes it over and ``ch.replay()`` refuses it."""
    orig = f.get("o")
    if orig is None or not ENTRY_ID.match(orig) or int(orig.partition("-")[0]) > _MAX_MS:
        return "no original entry id"
    try:
        check.member(f.get("a"), "recipient")
    except InvalidInput:
        return "no recipient"
    for k in ("n", "dead_ms", "on"):
        v = f.get(k)
        if (v is not None or k == "n") and not (v and _NUMBER.fullmatch(v)):
            return f"field {k} is not a number"
    if int(f.get("dead_ms") or 0) > _MAX_MS:
        return "field dead_ms is out of range"
    message = {k: v for k, v in f.items() if k not in _DLQ_OWN}
    if "on" in f:
        message["n"] = f["on"]
    if "og" in f:
        message["g"] = f["og"]
    why = malformed(message)
    return f"message: {why}" if why else ""


# (channel, dead-letter entry id) already warned about: one line per entry and process, not
# one per listing (a console lists them every few seconds); bounded
_warned_dead: set[tuple[str, str]] = set()


def parse_dead_letters(
    channel: str,
    entries: Sequence[Any],
    rejected: Callable[[str, str], None] | None = None,
) -> list[DeadLetter]:
    """The dead letters among the entries of a dead-letter stream. A malformed entry (see
    ``dead_letter_fault``) is passed over, never raised: one raw write must not hide every
    dead letter of the channel. Each is said once, as a warning, and given to ``rejected``
    (entry id, what is wrong) the first time, for a metric."""
    out = []
    for entry_id, f in entries:
        why = dead_letter_fault(f)
        if not why:
            try:
                out.append(_dead_letter(channel, str(entry_id), f))
                continue
            except (ValueError, TypeError, OverflowError) as e:  # (belt and braces)
                why = f"unreadable: {e}"
        if _first(_warned_dead, (channel, str(entry_id))):
            log.warning(
                "redisbus: channel %r: dead-letter entry %s is malformed (%s), passed over; "
                "a raw write made it (XDEL removes it)",
                channel, entry_id, why,
            )  # fmt: skip
            if rejected is not None:
                rejected(str(entry_id), why)
    return out


def _dead_letter(channel: str, entry_id: str, f: Mapping[str, str]) -> DeadLetter:
    orig = f["o"]
    dead_ms = f.get("dead_ms")
    return DeadLetter(
        id=entry_id,
        original_id=orig,
        recipient=f["a"],
        deliveries=_count(f.get("n")),
        reason=f.get("w", ""),
        dead_at=ms_to_dt(int(dead_ms)) if dead_ms else None,
        message=message_from_fields(channel, orig, f, read=False),
    )


@dataclass(frozen=True, slots=True)
class SweepReport:
    trimmed: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0
    expired_undone: int = 0
    rate_pruned: int = 0  # idle rate fields dropped (refilled buckets, past windows)
    rate_scanning: int = 0  # 1 while the walk over the rate fields has not come round
