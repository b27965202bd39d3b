"""Channels as stored in Redis: their limits and routing (``ChannelConfig``), the arguments
of channel.lua, and what a janitor pass and the dead-letter stream report. No I/O."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import _validate as check
from ._errors import (
    ChannelMismatch,
    InvalidInput,
    UnknownAgent,
)
from ._messages import message_from_fields
from ._model import (
    DeadLetter,
    ms_to_dt,
)
from ._settings import BusSettings

Routing = Literal["open", "family"]

# Channel limits stored in Redis, with the BusSettings field each defaults from.
LIMITS: tuple[str, ...] = (
    "inbox_cap",
    "max_body_bytes",
    "max_name_chars",
    "pair_rate_burst",
    "pair_rate_per_s",
    "sender_rate_burst",
    "sender_rate_per_s",
    "max_chain_depth",
    "max_chain_messages",
    "max_depth",
    "max_members",
    "max_messages",
    "retention_s",
    "lease_s",
    "max_deliveries",
    "dampen_turns",
    "dampen_window_s",
    "breaker_failures",
    "breaker_window_s",
    "breaker_cooldown_s",
)
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


def fmt_number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """A channel's configuration as stored in Redis (every host enforces the same numbers)."""

    name: str
    routing: Routing
    siblings: bool
    paused: bool
    limits: Mapping[str, float]
    created_ms: int

    def __getattr__(self, item: str) -> float:
        try:
            return self.limits[item]
        except KeyError:
            raise AttributeError(item) from None


def plan_channel(
    settings: BusSettings, routing: object, siblings: object, overrides: Mapping[str, object]
) -> list[str]:
    """ARGV for channel.lua: (field, value, explicit) triples."""
    overrides = dict(overrides)
    deny = overrides.pop("auto_reply_deny", None)
    unknown = set(overrides) - set(LIMITS)
    if unknown:
        raise InvalidInput(f"unknown channel limit(s): {', '.join(sorted(unknown))}")
    if routing is not None and routing not in ("open", "family"):
        raise InvalidInput(f"routing must be 'open' or 'family', got {routing!r}")
    if siblings is not None and not isinstance(siblings, bool):
        raise InvalidInput("siblings must be True or False")
    argv: list[str] = [
        "routing",
        str(routing or "open"),
        "1" if routing is not None else "0",
        "siblings",
        "1"
        if siblings
        else ("0" if siblings is not None else ("1" if (routing or "open") == "open" else "0")),
        "1" if siblings is not None else "0",
    ]
    for field in LIMITS:
        if field in overrides and overrides[field] is not None:
            value = overrides[field]
            if field in _INT_LIMITS:
                v: float = check.integer(value, field, 0, 2**31)
            else:
                v = check.positive_number(value, field)
            explicit = "1"
        else:
            v = float(getattr(settings, field))
            explicit = "0"
        argv += [field, fmt_number(v), explicit]
    if deny is None:
        argv += ["auto_reply_deny", "\n".join(settings.auto_reply_deny), "0"]
    else:
        if isinstance(deny, str) or not isinstance(deny, list | tuple | set | frozenset):
            raise InvalidInput("auto_reply_deny must be a list of agent names")
        names = [check.name(n, "denied sender") for n in deny]
        argv += ["auto_reply_deny", "\n".join(names), "1"]
    return argv


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
    limits = {f: float(h[f]) for f in LIMITS if f in h}
    return ChannelConfig(
        name=name,
        routing="family" if h.get("routing") == "family" else "open",
        siblings=h.get("siblings") == "1",
        paused=h.get("paused") == "1",
        limits=limits,
        created_ms=int(h.get("created_ms", "0")),
    )


def parse_dead_letters(channel: str, entries: Sequence[Any]) -> list[DeadLetter]:
    out = []
    for entry_id, f in entries:
        orig = f.get("o", "0-0")
        out.append(
            DeadLetter(
                id=entry_id,
                original_id=orig,
                recipient=f.get("a", ""),
                deliveries=int(f.get("n", "0")),
                reason=f.get("w", ""),
                dead_at=ms_to_dt(int(f["dead_ms"])) if f.get("dead_ms") else None,
                message=message_from_fields(channel, orig, f, read=False),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class SweepReport:
    trimmed: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0
    expired_undone: int = 0
    rate_pruned: int = 0  # idle rate fields dropped (refilled buckets, past windows)
    rate_scanning: int = 0  # 1 while the walk over the rate fields has not come round
