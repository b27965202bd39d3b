"""The janitor: reclaim nothing it cannot handle, dead-letter the undeliverable, trim memory.

One pass over every channel of the bus (``sweep.lua`` per channel: atomic, so several janitors
on several hosts can run at once). It runs inside ``redisbus exporter`` or on its own with
``redisbus janitor`` (as the agent hosts' Redis user: it writes). Live replicas reclaim
expired leases themselves (they must handle the messages); the janitor only dead-letters
messages past ``max_deliveries`` whose agent has no live replica to do it, trims, and removes
idle consumers that have nothing pending.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from ._core import SweepReport
from ._errors import RedisbusError
from .bus import Bus

log = logging.getLogger("redisbus.janitor")


@dataclass
class JanitorReport:
    channels: int = 0
    trimmed: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0
    expired_undone: int = 0
    rate_pruned: int = 0
    errors: list[str] = field(default_factory=list)

    def add(self, r: SweepReport) -> None:
        self.channels += 1
        self.trimmed += r.trimmed
        self.dead_lettered += r.dead_lettered
        self.consumers_removed += r.consumers_removed
        self.expired_undone += r.expired_undone
        self.rate_pruned += r.rate_pruned


def sweep_all(bus: Bus, *, batch: int = 1000, consumer_idle_s: float = 24 * 3600) -> JanitorReport:
    """One pass over every channel; each channel is swept until nothing is left to trim and
    its rate fields have all been looked at once."""
    report = JanitorReport()
    for name in bus.channels():
        try:
            ch = bus.channel(name)
            while True:
                r = ch.sweep(batch=batch, consumer_idle_s=consumer_idle_s)
                report.add(r)
                report.channels -= 1
                if r.trimmed < batch and not r.rate_scanning:
                    break
            report.channels += 1
        except RedisbusError as e:
            report.errors.append(f"{name}: {e}")
            log.warning("janitor: channel %s: %s", name, e)
    if report.dead_lettered:
        bus.metrics.dead_lettered(report.dead_lettered)
    return report


def run(
    bus: Bus, interval_s: float = 10.0, stop: threading.Event | None = None, *, batch: int = 1000
) -> None:
    """Sweep every ``interval_s`` until ``stop`` is set. A failed pass (Redis restarting,
    unreachable) is logged and the next one tried: a daemon outlives a Redis outage."""
    stop = stop or threading.Event()
    failing = False
    while not stop.is_set():
        try:
            r = sweep_all(bus, batch=batch)
        except RedisbusError as e:
            if not failing:
                log.warning("janitor: pass failed, retrying every %g s: %s", interval_s, e)
            failing = True
        else:
            if failing:
                log.info("janitor: passes succeed again")
            failing = False
            log.info(
                "janitor: %d channels, %d trimmed, %d dead-lettered, %d consumers removed",
                r.channels, r.trimmed, r.dead_lettered, r.consumers_removed,
            )  # fmt: skip
        stop.wait(interval_s)


if __name__ == "__main__":
    # `python -m redisbus.janitor`, the same as `redisbus janitor`: this file runs as __main__,
    # not as redisbus.janitor, so importing the CLI here closes no import cycle.
    from ._cli_run import run_command

    raise SystemExit(run_command("janitor"))
