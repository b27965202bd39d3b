"""``Outage``: how a loop that runs every period says that its work fails, and that it works
again, in two lines, whatever the outage's length.

A traceback per period says nothing the first line did not, and buries everything else a
process logs (every process of a fleet logs during the same outage). No I/O; both faces'
heartbeats and the janitor share it."""

from __future__ import annotations

import logging
import time

__all__ = ["Outage"]

#: While a loop's work fails, it tries again this often (at most every period): a heartbeat
#: must beat soon after Redis is back, or a live replica's lease could run out meanwhile
RETRY_S = 0.5

log = logging.getLogger("redisbus")


class Outage:
    """The failing state of one periodic loop: ``failed(e)`` after each failure (one warning,
    without a traceback, at the first), ``succeeded()`` after each success (one info line,
    with how long and how many tries failed, at the first after a failure)."""

    def __init__(self, what: str, period_s: float, logger: logging.Logger = log) -> None:
        self.what = what
        self.period_s = period_s
        self.log = logger
        self.since: float | None = None  # monotonic time of the first failure, while failing
        self.failures = 0

    def failed(self, error: BaseException) -> None:
        self.failures += 1
        if self.since is not None:
            return
        self.since = time.monotonic()
        self.log.warning(
            "redisbus: %s failing (%s: %s); retrying every %g s, quietly until it works again",
            self.what, type(error).__name__, error, self.period_s,
        )  # fmt: skip

    def pause(self, period_s: float) -> float:
        """How long to wait before the next try: the period, or less while failing."""
        return min(period_s, RETRY_S) if self.since is not None else period_s

    def succeeded(self) -> None:
        if self.since is None:
            return
        took = time.monotonic() - self.since
        self.log.info(
            "redisbus: %s works again, after failing for %.1f s (%d beats)",
            self.what, took, self.failures,
        )  # fmt: skip
        self.since, self.failures = None, 0
