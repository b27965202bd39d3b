"""The janitor: reclaim nothing it cannot handle, dead-letter the undeliverable, trim memory.

One pass over every channel of the bus (``sweep.lua`` per channel: atomic, so several janitors
on several hosts can run at once). It runs inside ``redisbus exporter`` or on its own with
``redisbus janitor``. Live replicas reclaim expired leases themselves (they must handle the
messages); the janitor only dead-letters messages past ``max_deliveries`` whose agent has no
live replica to do it, trims, and removes idle consumers that have nothing pending.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from dataclasses import dataclass, field

from ._core import SweepReport
from ._errors import BusConnectionError, RedisbusError
from ._settings import BusSettings
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


def run(bus: Bus, interval_s: float = 10.0, stop: threading.Event | None = None) -> None:
    """Sweep every ``interval_s`` until ``stop`` is set."""
    stop = stop or threading.Event()
    while not stop.is_set():
        r = sweep_all(bus)
        log.info(
            "janitor: %d channels, %d trimmed, %d dead-lettered, %d consumers removed",
            r.channels,
            r.trimmed,
            r.dead_lettered,
            r.consumers_removed,
        )
        stop.wait(interval_s)


def main(argv: list[str] | None = None) -> int:
    """``redisbus janitor`` / ``python -m redisbus.janitor``: sweep every channel, repeatedly."""
    p = argparse.ArgumentParser(prog="redisbus janitor", description=__doc__)
    p.add_argument("--url", help="Redis URL (env REDISBUS_URL)")
    p.add_argument("--interval-s", type=float, default=30.0, help="seconds between passes")
    p.add_argument("--batch", type=int, default=1000, help="entries trimmed per script call")
    p.add_argument("--once", action="store_true", help="one pass, print its report, exit")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = BusSettings()
    url = args.url or settings.url
    if not url:
        print("redisbus janitor: set REDISBUS_URL (or --url): it sweeps a shared Redis")
        return 3
    if args.interval_s <= 0 or args.batch <= 0:
        print("redisbus janitor: --interval-s and --batch must be positive")
        return 2
    try:
        bus = Bus.from_url(url, settings=settings)
        if args.once:
            r = sweep_all(bus, batch=args.batch)
            print(
                f"{r.channels} channels: {r.trimmed} trimmed, {r.dead_lettered} dead-lettered, "
                f"{r.consumers_removed} consumers removed, {r.expired_undone} expired undone"
            )
            return 1 if r.errors else 0
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        run(bus, args.interval_s, stop)
        return 0
    except BusConnectionError as e:
        print(f"redisbus janitor: {e}")
        return 3


if __name__ == "__main__":
    raise SystemExit(main())
