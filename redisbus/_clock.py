"""This host's clock against the Redis clock: signing needs them close.

A signature carries its signing time, read on the sender's clock; a receiver compares it with
the entry id's time, which Redis stamps with its own clock, and rejects the entry (``stale``)
when they are more than ``signing_window_s`` apart. A sender whose clock is off by that much
has every signed message dropped by every receiver, so it must learn it first: the bus reads
Redis ``TIME`` at join and at every heartbeat, records the skew on the :class:`Signer
<redisbus._signing.Signer>` (:meth:`~redisbus._signing.Signer.observe_time`), and the signer
refuses to sign (:class:`~redisbus.ClockSkew`) while the skew is past the limit.

The limit is half the window by default (``clock_skew_max_s`` overrides it). Half, not all of
it, because the window must also absorb what happens between a measurement and an entry: the
clock drifting (or being stepped) until the next heartbeat, the error of the measurement
itself (up to half a round trip), the time between signing and the ``XADD`` (a send that waits
out a failover), and a new primary whose clock differs from the old one's. A host refused at
half the window still has the other half for all of that.

Everything here but :func:`skew_check` is I/O-free: the caller makes the ``TIME`` call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from ._errors import ClockSkew, human_number

#: The fix a skewed host is told.
FIX = "synchronise this host's clock (NTP: chronyd or systemd-timesyncd)"


def wall_ms() -> int:
    """This host's wall clock, in ms since the epoch (what a signature's time is read on)."""
    return time.time_ns() // 1_000_000


def measure_skew(redis_time_reply: Sequence[Any], sent_at: float, received_at: float) -> float:
    """This host's clock minus the Redis clock, in seconds, from one ``TIME`` call:
    ``redis_time_reply`` is its reply (``(seconds, microseconds)``, as ints, strings or bytes),
    ``sent_at`` and ``received_at`` the host clock (ms, the signer's ``clock_ms``) read just
    before the call and just after its reply. Redis read its clock about half the round trip
    before the reply arrived, so that half is subtracted; the error is at most half the round
    trip."""
    seconds, micros = int(redis_time_reply[0]), int(redis_time_reply[1])
    server_ms = seconds * 1000 + micros / 1000
    return (received_at - (received_at - sent_at) / 2 - server_ms) / 1000


def skew_limit_s(settings: Any) -> float:
    """The largest skew a signing host may have: ``clock_skew_max_s``, else half of
    ``signing_window_s`` (see the module docstring for why half)."""
    limit = getattr(settings, "clock_skew_max_s", None)
    return float(limit) if limit else float(settings.signing_window_s) / 2


def skew_error(skew_s: float, limit_s: float) -> ClockSkew:
    """The error a skewed host's signed send raises."""
    way = "ahead of" if skew_s > 0 else "behind"
    return ClockSkew(
        f"this host's clock is {human_number(round(abs(skew_s), 1))} s {way} the Redis "
        f"clock (the limit is {human_number(limit_s)} s): receivers would reject its signed "
        f"messages as stale; {FIX}",
        skew_s=skew_s,
        limit_s=limit_s,
    )


def too_skewed(skew_s: float | None, limit_s: float) -> bool:
    """The rule: refuse when the last measured skew is past the limit (unmeasured: allow)."""
    return skew_s is not None and abs(skew_s) > limit_s


def skew_check(
    redis_client: Any, settings: Any, clock_ms: Callable[[], float] = wall_ms
) -> tuple[bool, str]:
    """``redisbus doctor``'s clock check on a sync redis client: (ok, one line saying the
    skew, and the fix when it is past the limit). Takes the best of three ``TIME`` calls (the
    shortest round trip has the smallest error). With signing off a skew is harmless: ok,
    said so."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        sent = clock_ms()
        reply = redis_client.time()
        received = clock_ms()
        sample = (received - sent, measure_skew(reply, sent, received))
        if best is None or sample[0] < best[0]:
            best = sample
    assert best is not None
    skew, limit = best[1], skew_limit_s(settings)
    signing = bool(settings.trust_file or settings.signing_keys)
    said = (
        f"this host's clock is {human_number(round(skew, 3))} s from Redis TIME "
        f"(limit {human_number(limit)} s"
    )
    if not signing:
        return True, f"{said}; signing is off, so it does not matter)"
    if too_skewed(skew, limit):
        return False, f"{said}): signed sends are refused (ClockSkew); {FIX}"
    return True, f"{said})"
