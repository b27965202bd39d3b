"""The one error tree of redisbus.

::

    RedisbusError
    ├── InvalidInput (also a ValueError)       bad argument, malformed filter or time
    │   └── ChannelMismatch                    limits differ from the stored channel
    ├── LimitExceeded (.limit .current .retry_after_s)
    │   ├── InboxFull                          recipient has too many undone messages
    │   ├── RateLimited                        per-pair or per-sender token bucket empty
    │   ├── TooLarge                           body, name or subject over its limit
    │   ├── ChainTooDeep                       reply of a reply ... past max_chain_depth
    │   ├── LoopRefused                        auto-reply rules, ping-pong dampener
    │   ├── CircuitOpen                        recipient dead-lettering repeatedly: paused
    │   ├── BudgetExceeded                     team budget: depth, members or messages
    │   └── ServerFull                         Redis at maxmemory (noeviction): sends refused
    │                                          until consumers drain and the janitor trims
    ├── RoutingRefused                         recipient outside the sender's reach
    ├── NotPermitted                           e.g. cancelling an agent that is not your child
    ├── ClockSkew (.skew_s .limit_s)           this host's clock is too far from Redis's to
    │                                          sign: fix the clock (NTP)
    ├── UnknownAgent                           no such member
    │   └── UnknownChannel                     no such channel
    ├── AgentClosed                            the agent failed, was cancelled or lost
    │   └── RecipientClosed                    ... and so cannot receive
    ├── ChannelPaused                          the channel refuses sends until resumed
    ├── MessageRejected (.reason)              a receiver refused the entry (signature, key,
    │                                          time, replay): on a receipt, never raised
    ├── DeadLettered (.reason)                 delivered too many times: on a receipt, never
    │                                          raised
    ├── BusClosed                              the bus was closed: no call works any more
    ├── AskTimeout (also a TimeoutError)       ask(): no reply before the timeout (.request_id)
    └── BusConnectionError                     Redis unreachable after retries

Every public call raises only these; Redis exceptions are wrapped with ``raise ... from``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

__all__ = [
    "AgentClosed",
    "AskTimeout",
    "BudgetExceeded",
    "BusClosed",
    "BusConnectionError",
    "ChainTooDeep",
    "ChannelMismatch",
    "ChannelPaused",
    "CircuitOpen",
    "ClockSkew",
    "DeadLettered",
    "InboxFull",
    "InvalidInput",
    "LimitExceeded",
    "LoopRefused",
    "MessageRejected",
    "NotPermitted",
    "RateLimited",
    "RecipientClosed",
    "RedisbusError",
    "RoutingRefused",
    "ServerFull",
    "TooLarge",
    "UnknownAgent",
    "UnknownChannel",
    "human_bytes",
    "human_number",
]


def human_number(value: float) -> str:
    """A number as people write it: ``1048576``, ``0.002``, ``2.5`` (never ``1.04858e+06``)."""
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == int(v) and abs(v) < 1e18:
        return str(int(v))
    if abs(v) >= 0.001:
        return f"{v:.3f}".rstrip("0").rstrip(".")
    return f"{v:.1g}"


def human_bytes(value: float) -> str:
    """``1 MiB``, ``32 KiB``, ``1.5 KiB``, ``900 B``."""
    v = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(v) < 1024 or unit == "GiB":
            return f"{human_number(round(v, 1))} {unit}"
        v /= 1024
    raise AssertionError("unreachable")


class RedisbusError(Exception):
    """Root of every error redisbus raises. ``code`` is a stable, bounded reason string."""

    code = "error"


class InvalidInput(RedisbusError, ValueError):
    """A bad argument: a malformed name, filter, time or number, an unknown option. Raised
    before anything is written (also a ``ValueError``)."""

    code = "invalid_input"


class ChannelMismatch(InvalidInput):
    """The limits or routing given to ``bus.channel(name, ...)`` differ from those stored for
    that channel; ``configure()`` changes them."""

    code = "channel_mismatch"


class LimitExceeded(RedisbusError):
    """A limit refused the call. ``limit`` is the configured bound, ``current`` the value met."""

    code = "limit"

    def __init__(
        self,
        message: str,
        *,
        limit: float | None = None,
        current: float | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.current = current
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        """The reason with the numbers a caller acts on: ``body is too large (bytes): limit
        32768 (32 KiB), current 40000 (39.1 KiB)``; ``...: limit 3, current 0, retry after
        0.5 s``."""
        text = super().__str__()
        in_bytes = "bytes" in text
        details = []
        for what, v in (("limit", self.limit), ("current", self.current)):
            if v is not None:
                size = f" ({human_bytes(v)})" if in_bytes and v >= 1024 else ""
                details.append(f"{what} {human_number(v)}{size}")
        if self.retry_after_s is not None:
            details.append(f"retry after {human_number(self.retry_after_s)} s")
        return f"{text}: {', '.join(details)}" if details else text


class InboxFull(LimitExceeded):
    """The recipient holds ``inbox_cap`` messages it has not marked done."""

    code = "inbox_full"


class RateLimited(LimitExceeded):
    """A token bucket is empty (per pair, or the sender's own); ``retry_after_s`` says when
    the next token comes."""

    code = "rate_limited"


class TooLarge(LimitExceeded):
    """A body, name, subject or batch is over its size limit."""

    code = "too_large"


class ChainTooDeep(LimitExceeded):
    """A reply of a reply ... past ``max_chain_depth``."""

    code = "chain_too_deep"


class LoopRefused(LimitExceeded):
    """Loop protection: an auto-reply to an auto-reply, a recipient on ``auto_reply_deny``,
    or the ping-pong dampener between two agents."""

    code = "loop"


class CircuitOpen(LimitExceeded):
    """The recipient dead-letters messages repeatedly: sends to it pause until ``retry_after_s``."""

    code = "circuit_open"


class BudgetExceeded(LimitExceeded):
    """A team budget is spent: family depth, members, or messages."""

    code = "budget"


class ServerFull(LimitExceeded):
    """Redis is at its ``maxmemory`` with ``noeviction``: it refuses every write that may
    grow memory, so nothing was written. Consumers still drain (wait, read, mark_done) and the
    janitor still trims; retry once they have made room."""

    code = "server_full"


class RoutingRefused(RedisbusError):
    """The recipient is outside the sender's reach (family routing: not its parent, child,
    or an opted-in sibling)."""

    code = "routing_refused"


class NotPermitted(RedisbusError):
    """The caller may not do this, e.g. cancel an agent that is not its child, or sign with a
    key the trust list revokes or omits."""

    code = "not_permitted"


class ClockSkew(RedisbusError):
    """This host's clock is ``skew_s`` seconds from the Redis clock (positive: ahead), past
    ``limit_s``: receivers would reject its signed messages as stale, so it refuses to sign.
    Synchronise the host's clock (NTP); the bus measures again at every heartbeat."""

    code = "clock_skew"

    def __init__(self, message: str, *, skew_s: float = 0.0, limit_s: float = 0.0) -> None:
        super().__init__(message)
        self.skew_s = skew_s
        self.limit_s = limit_s


class UnknownAgent(RedisbusError):
    """No member of the channel by that name."""

    code = "unknown_agent"


class UnknownChannel(UnknownAgent):
    """No such channel (an ``UnknownAgent`` too, so ``except UnknownAgent`` still catches it)."""

    code = "unknown_channel"


class AgentClosed(RedisbusError):
    """This agent completed, failed, was cancelled or was declared lost: it sends no more."""

    code = "agent_closed"


class RecipientClosed(AgentClosed):
    """The recipient failed, was cancelled or was declared lost, so it cannot receive."""

    code = "recipient_closed"


class ChannelPaused(RedisbusError):
    """The channel is paused (``pause()``): it refuses sends until ``resume()``."""

    code = "channel_paused"


class MessageRejected(RedisbusError):
    """A receiver refused the entry: ``reason`` is one of ``_signing.REASONS`` (bad or
    missing signature, untrusted, revoked or disallowed key, misaddressed, stale, replay)."""

    code = "message_rejected"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class DeadLettered(RedisbusError):
    """A message moved to the dead-letter stream; ``reason`` says why (``max_deliveries``:
    fetched that many times and never marked done). Found on a ``failed`` receipt's ``error``."""

    code = "dead_lettered"

    def __init__(self, message: str, *, reason: str = "max_deliveries") -> None:
        super().__init__(message)
        self.reason = reason


class BusClosed(RedisbusError):
    """The bus (``Bus.close()`` / ``AsyncBus.aclose()``) was closed; make a new one."""

    code = "bus_closed"


class AskTimeout(RedisbusError, TimeoutError):
    """``ask()`` got no reply before its timeout. The request was sent (``request_id``); a
    late reply is an ordinary message for a later ``wait()`` or ``read()``."""

    code = "ask_timeout"

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class BusConnectionError(RedisbusError, ConnectionError):
    """Redis is unreachable after the retries (``BusSettings.retry_attempts``); the call may
    or may not have run. A send with an idempotency key is safe to retry."""

    code = "connection"


_BY_CODE: dict[str, type[RedisbusError]] = {
    cls.code: cls
    for cls in (
        InvalidInput,
        ChannelMismatch,
        InboxFull,
        RateLimited,
        TooLarge,
        ChainTooDeep,
        LoopRefused,
        CircuitOpen,
        BudgetExceeded,
        ServerFull,
        RoutingRefused,
        NotPermitted,
        UnknownAgent,
        UnknownChannel,
        AgentClosed,
        RecipientClosed,
        ChannelPaused,
    )
}


def error_from_code(
    code: str,
    message: str,
    limit: float | None = None,
    current: float | None = None,
    retry_after_s: float | None = None,
) -> RedisbusError:
    """Build the typed error a Lua reply code stands for."""
    cls = _BY_CODE.get(code, RedisbusError)
    if issubclass(cls, LimitExceeded):
        return cls(message, limit=limit, current=current, retry_after_s=retry_after_s)
    return cls(message)


def refusal(code: str, message: str, limit: str, current: str, retry_ms: str) -> RedisbusError:
    """The typed error of a script's refusal reply (its fields as the script returns them)."""
    return error_from_code(
        code,
        message,
        limit=float(limit) if limit else None,
        current=float(current) if current else None,
        retry_after_s=float(retry_ms) / 1000 if retry_ms else None,
    )


def raise_if_refused(reply: Sequence[Any]) -> None:
    """join.lua / status.lua style replies: {0, code, message} is a refusal."""
    if int(reply[0]) == 0:
        raise error_from_code(str(reply[1]), str(reply[2]))
