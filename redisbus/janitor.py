"""The janitor: reclaim nothing it cannot handle, dead-letter the undeliverable, trim memory.

Not a Python API: the command is the interface (docs/deployment.md#the-janitor); its
Python names may change in any release.

One pass over every channel of the bus (``sweep.lua`` per channel: atomic, so several janitors
on several hosts can run at once). It runs inside ``redisbus exporter`` or on its own with
``redisbus janitor`` (as the agent hosts' Redis user: it writes). Live replicas reclaim
expired leases themselves (they must handle the messages); the janitor only dead-letters
messages past ``max_deliveries`` whose agent has no live replica to do it, trims, and removes
idle consumers that have nothing pending.

Each pass adds what it dead-lettered to a counter kept in Redis (field
``janitor_dead_lettered`` of ``{prefix}:stats``), which ``redisbus exporter`` serves as
``redisbus_janitor_dead_lettered_total``: a janitor running as its own process (``redisbus
janitor``, a CronJob) has no ``/metrics`` to be scraped, and several janitors on several hosts
add up in one place. The count is written after the sweep, not with it: a janitor killed in
between leaves those dead letters uncounted (they are still in the dead-letter streams).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated

from redis.exceptions import RedisError

from ._commands import (
    BusAddress,
    Exit,
    LogLevelOpt,
    log_to_stderr,
    option,
    program,
    required_url,
    with_fleet_address,
)
from ._core import SweepReport
from ._errors import RedisbusError
from ._keys import stats_key
from .bus import Bus

log = logging.getLogger("redisbus.janitor")

#: Field of ``{prefix}:stats`` counting the messages janitors have dead-lettered.
DEAD_LETTERED_FIELD = "janitor_dead_lettered"
#: Seconds between two passes, unless told (``REDISBUS_JANITOR_INTERVAL_S``).
JANITOR_INTERVAL_S = 30.0


@dataclass
class JanitorReport:
    channels: int = 0  # swept to the end
    trimmed: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0
    expired_undone: int = 0
    rate_pruned: int = 0
    errors: list[str] = field(default_factory=list)  # "channel: error", one per failed channel

    @property
    def failed(self) -> int:
        return len(self.errors)

    def add(self, r: SweepReport) -> None:
        self.trimmed += r.trimmed
        self.dead_lettered += r.dead_lettered
        self.consumers_removed += r.consumers_removed
        self.expired_undone += r.expired_undone
        self.rate_pruned += r.rate_pruned


def sweep_all(
    bus: Bus,
    *,
    batch: int = 1000,
    consumer_idle_s: float = 24 * 3600,
    known: dict[str, str] | None = None,
) -> JanitorReport:
    """One pass over every channel; each channel is swept until nothing is left to trim and
    its rate fields have all been looked at once.

    A channel that fails (whatever the error) is logged in one line, counted in the report's
    ``errors`` and skipped: the channels after it are swept all the same. ``known``: channel
    -> error of the previous pass, kept by a caller that runs pass after pass; a channel
    failing as it did then is not logged again, one that works again is logged once."""
    report = JanitorReport()
    for name in bus.channels():
        try:
            ch = bus.channel(name)
            while True:
                r = ch.sweep(batch=batch, consumer_idle_s=consumer_idle_s)
                report.add(r)
                if r.trimmed < batch and not r.rate_scanning:
                    break
            report.channels += 1
        except Exception as e:  # one bad channel must not keep the janitor from the rest
            error = str(e) if isinstance(e, RedisbusError) else f"{type(e).__name__}: {e}"
            report.errors.append(f"{name}: {error}")
            if known is None or known.get(name) != error:
                log.warning("janitor: channel %s failed, skipped: %s", name, error)
            if known is not None:
                known[name] = error
        else:
            if known is not None and known.pop(name, None) is not None:
                log.info("janitor: channel %s is swept again", name)
    if report.dead_lettered:
        bus.metrics.dead_lettered(report.dead_lettered)
        count_dead_lettered(bus, report.dead_lettered)
    return report


def count_dead_lettered(bus: Bus, n: int) -> None:
    """Add ``n`` to the fleet's janitor dead-letter counter in Redis. A failure is logged, not
    raised: the dead letters are made and stay listed; only the count misses them."""
    try:
        bus.redis.hincrby(stats_key(bus.settings.prefix), DEAD_LETTERED_FIELD, n)
    except (RedisError, OSError) as e:
        log.warning("janitor: %d dead letters made but not counted: %s", n, e)


def run(
    bus: Bus, interval_s: float = 10.0, stop: threading.Event | None = None, *, batch: int = 1000
) -> None:
    """Sweep every ``interval_s`` until ``stop`` is set. A failed pass (Redis restarting,
    unreachable) is logged once, when passes start failing, and once when they succeed
    again: a daemon outlives a Redis outage without a line per pass."""
    stop = stop or threading.Event()
    failing_since: float | None = None
    known: dict[str, str] = {}  # channels failing, with their error: each logged once
    while not stop.is_set():
        try:
            r = sweep_all(bus, batch=batch, known=known)
        except RedisbusError as e:
            if failing_since is None:
                failing_since = time.monotonic()
                log.warning("janitor: pass failed, retrying every %g s: %s", interval_s, e)
        else:
            if failing_since is not None:
                log.info("janitor: passes succeed again, after failing for %.1f s",
                         time.monotonic() - failing_since)  # fmt: skip
            failing_since = None
            log.info(
                "janitor: %d channels, %d trimmed, %d dead-lettered, %d consumers removed",
                r.channels, r.trimmed, r.dead_lettered, r.consumers_removed,
            )  # fmt: skip
        stop.wait(interval_s)


# -- the command: `redisbus janitor`, `python -m redisbus.janitor` ----------------------------


@with_fleet_address
def janitor(
    address: BusAddress,
    interval_s: Annotated[
        float | None,
        option(
            "--interval-s", "REDISBUS_JANITOR_INTERVAL_S", "Seconds between passes [default: 30]."
        ),
    ] = None,
    batch: Annotated[
        int, option("--batch", "REDISBUS_JANITOR_BATCH", "Entries trimmed per script call.")
    ] = 1000,
    once: Annotated[
        bool,
        option(
            "--once",
            "REDISBUS_JANITOR_ONCE",
            "One pass over every channel: print its report and exit. A channel that "
            "fails is logged in one line and skipped, the rest are swept all the same; the "
            "exit status is then 1, given after the whole pass.",
        ),
    ] = False,
    log_level: LogLevelOpt = "INFO",
) -> None:
    """Reclaim nothing it cannot handle, dead-letter the undeliverable, trim: every channel.

    Writes, so it runs as the agent hosts' Redis user (the exporter's is read-only). Several
    janitors may run at once. Runs until SIGTERM or Ctrl-C unless --once. A channel that
    fails is skipped, never the channels after it; a Redis outage is logged when passes start
    failing and when they succeed again.
    """
    log_to_stderr(log_level)
    interval = JANITOR_INTERVAL_S if interval_s is None else interval_s
    if interval <= 0 or batch <= 0:
        raise Exit("--interval-s and --batch must be positive", 2)
    settings = address.settings(metrics=False)  # a janitor has nobody scraping it
    required_url(settings, ": the janitor sweeps a shared Redis")
    bus = Bus.from_settings(settings)
    try:
        if once:
            r = sweep_all(bus, batch=batch)
            sys.stdout.write(
                f"{r.channels} channels: {r.trimmed} trimmed, {r.dead_lettered} dead-lettered, "
                f"{r.consumers_removed} consumers removed, {r.expired_undone} expired undone, "
                f"{r.failed} failed\n"
            )
            if r.errors:
                more = f" (and {len(r.errors) - 1} more)" if len(r.errors) > 1 else ""
                raise Exit(f"janitor: {r.errors[0]}{more}", 1)
            return
        run(bus, interval, _stop_on_signals(), batch=batch)
    finally:
        bus.close()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    return stop


if __name__ == "__main__":
    raise SystemExit(program(janitor, "janitor"))
