"""``redisbus demo``: an anime production team ("Neon Dreams") talking over the bus, live.

Not a Python API: the command is the interface (docs/getting-started.md#from-a-shell); its
Python names may change in any release.

This process runs the director (the parent, on "host-a") and the live transcript; the writer,
the character designer and the storyboard artist run in other OS processes ("host-b", …),
started as ``python -m redisbus.demo worker ...``, standing in for other hosts. All that the
processes share is the Redis URL. With no ``REDISBUS_URL``, a private Redis is started first.

The transcript tails the channel's stream with ``XREAD BLOCK`` (read-only: the observer is not
a member, so it changes no read marks and receives no broadcasts). Workers report what the
stream cannot show (refusals, notes, the end of their script) as JSON lines on stdout, each
stamped with Redis ``TIME``; the transcript prints both in the order of the Redis clock.

Ctrl-C stops the director within a wait slice, kills the workers and the private Redis.

Latency in the summary is send -> delivery from the receipts: ``delivered_at - queued_at``,
both read off the Redis clock (the entry id's millisecond, and Redis ``TIME`` when the
recipient's process fetched it), so no two hosts' clocks are compared. Resolution: 1 ms.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import logging
import os
import queue
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import IO, Any

import redis
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ._core import message_from_fields
from ._demo_script import CHILDREN, ROLES, STOP_CHECK_S, Actor, DemoError, director
from ._errors import human_number
from ._model import Message, Receipt
from ._settings import BusSettings
from ._show import member_tree, safe
from .bus import Bus, Channel
from .embedded import EmbeddedRedis

__all__ = ["percentile", "run_demo", "worker_main"]

# The per-pair bucket, spelled out so a REDISBUS_* override in the shell cannot hide the
# refusal the demo shows (4 panels in a row against a burst of 3; 2/s so the wait is short).
PAIR_BURST, PAIR_PER_S = 3, 2.0
HOSTS = ("host-b", "host-c", "host-d")
RUN_TIMEOUT_S = 60.0
# How long the transcript holds a line back: an event written before a message may reach this
# process after it, through its worker's pipe.
HOLD_MS = 400


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def settings(url: str, host: str) -> BusSettings:
    return BusSettings(url=url, host=host, replica=f"{host}/demo", metrics=False)


def redis_ms(bus: Bus) -> int | None:
    """Now on the Redis clock, the one that stamps the stream's entries (None: unreachable)."""
    try:
        seconds, micros = bus.redis.time()
    except (redis.RedisError, OSError):
        return None
    return int(seconds) * 1000 + int(micros) // 1000


def moment(bus: Bus, stream: str) -> dict[str, Any]:
    """When an event happens: the Redis clock, and the last entry on the stream by then.

    The clock is read first, so every entry after ``after`` is stamped at or past ``ms``. A
    millisecond holds several sends on a fast machine: the entry, not the clock, places an
    event among the messages (a refusal after the panels sent in the same millisecond).
    """
    at: dict[str, Any] = {"ms": redis_ms(bus)}
    try:
        last = bus.redis.xrevrange(stream, count=1)
    except (redis.RedisError, OSError):
        return at
    at["after"] = last[0][0] if last else "0-0"
    return at


def entry_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


# -- worker processes ---------------------------------------------------------------------------


def worker_main(argv: Sequence[str] | None = None) -> int:
    """``python -m redisbus.demo worker --channel C --agents writer,designer --host host-b``."""
    p = argparse.ArgumentParser(prog="python -m redisbus.demo worker")
    p.add_argument("--channel", required=True)
    p.add_argument("--agents", required=True, help="comma-separated roles")
    p.add_argument("--host", required=True)
    p.add_argument("--pace", type=float, default=1.0)
    a = p.parse_args(argv)
    url = os.environ.get("REDISBUS_URL")  # from the environment, never argv (credentials)
    if not url:
        print("REDISBUS_URL is not set", file=sys.stderr)
        return 2
    # a stand-in for another host: Ctrl-C in the demo's terminal ends it at once, as a host
    # that goes away; the demo reports nothing about it then
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    lock = threading.Lock()
    bus = Bus.from_url(url, settings=settings(url, a.host))
    stream = bus.channel(a.channel).keys.stream

    def emit(event: str, **fields: Any) -> None:
        at = {"event": event, "host": a.host, **moment(bus, stream)}
        line = json.dumps({**at, **fields}, default=str)
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    failures: list[str] = []

    def run(role: str) -> None:
        try:
            ch = bus.channel(a.channel)
            agent = ch.join(role, parent="director", description=f"the {role} of the team")
            emit("joined", agent=role)
            ROLES[role](Actor(agent, a.pace, emit))
        except Exception as e:  # reported as one event line; the run then fails
            failures.append(role)
            emit("error", agent=role, error=f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run, args=(r,), name=r) for r in a.agents.split(",")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bus.close()
    return 1 if failures else 0


class Worker:
    """A child process and the threads that read its event lines and its stderr."""

    def __init__(
        self,
        roles: list[str],
        host: str,
        channel: str,
        url: str,
        pace: float,
        events: queue.Queue[dict[str, Any]],
    ) -> None:
        self.roles = roles
        self.host = host
        env = dict(os.environ, REDISBUS_URL=url, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "redisbus.demo",
                "worker",
                "--channel",
                channel,
                "--agents",
                ",".join(roles),
                "--host",
                host,
                "--pace",
                str(pace),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._events, args=(self.proc.stdout, events), daemon=True),
            threading.Thread(target=self._errors, args=(self.proc.stderr,), daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _events(self, stream: IO[str], events: queue.Queue[dict[str, Any]]) -> None:
        for line in stream:
            try:
                events.put(json.loads(line))
            except ValueError:
                events.put({"event": "output", "host": self.host, "text": line.rstrip()})

    def _errors(self, stream: IO[str]) -> None:
        for line in stream:
            self.stderr.append(line.rstrip())

    def done(self) -> bool:
        return self.proc.poll() is not None and not any(t.is_alive() for t in self._threads)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


# -- the main process ---------------------------------------------------------------------------


class Transcript:
    """Prints the messages on the stream and the workers' events in the order they happened
    on the Redis clock, each stamped with its moment.

    ``message()`` and ``event()`` queue a line; ``flush(upto_ms)`` prints those up to that
    moment (all of them without one). An event that names the last entry on the stream when
    it happened (``after``) prints right after that entry, so a refusal follows the panels
    sent in its millisecond and a join precedes what its agent sends next; events after the
    same entry go in clock order. One without ``after`` goes first in its millisecond.
    """

    def __init__(self, console: Console, t0_ms: int, offset_ms: int = 0) -> None:
        self.console = console
        self.t0_ms = t0_ms
        self.offset_ms = offset_ms  # Redis clock minus this host's
        self.messages: list[Message] = []
        self.refusals: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._queue: list[tuple[int, int, int, int, int, Message | dict[str, Any]]] = []
        self._order = itertools.count()

    def now_ms(self) -> int:
        """Now on the Redis clock, as this host's clock tells it."""
        return int(time.time() * 1000) + self.offset_ms

    def stamp(self, ms: int) -> str:
        return f"{max(0, ms - self.t0_ms) / 1000:6.2f}s"

    def message(self, m: Message) -> None:
        self.messages.append(m)
        ms, seq = entry_id(m.id)
        heapq.heappush(self._queue, (ms, seq, 1, ms, next(self._order), m))

    def event(self, e: dict[str, Any]) -> None:
        if e.get("event") == "refused":
            self.refusals.append(e)
        elif e.get("event") == "error":
            self.errors.append(f"{e['agent']}: {e['error']}")
        ms = e.get("ms")
        at = int(ms) if isinstance(ms, int | float) else self.now_ms()
        after = e.get("after")
        if isinstance(after, str):  # right after that entry
            place_ms, seq, rank = *entry_id(after), 2
        else:  # first in its millisecond
            place_ms, seq, rank = at, -1, 0
        heapq.heappush(self._queue, (place_ms, seq, rank, at, next(self._order), e))

    def flush(self, upto_ms: int | None = None) -> None:
        while self._queue and (upto_ms is None or self._queue[0][0] <= upto_ms):
            *_, ms, _, item = heapq.heappop(self._queue)
            if isinstance(item, Message):
                self._print_message(ms, item)
            else:
                self._print_event(ms, item)

    def _print_message(self, ms: int, m: Message) -> None:
        t = Text(self.stamp(ms) + "  ", style="dim")
        t.append(safe(m.sender), style="bold cyan")
        t.append(" → ")
        everyone = set(CHILDREN) | {"director"}
        t.append(
            "all" if set(m.to) | {m.sender} == everyone else ", ".join(m.to), style="bold magenta"
        )
        t.append(f"  [{m.subject}]", style="bold")
        if m.type != "message":
            t.append(f" {m.type}", style="yellow")
        first, *rest = safe(m.body).splitlines() or [""]
        t.append(f"  {first}{' …' if rest else ''}")
        self.console.print(t, no_wrap=True, overflow="ellipsis")

    def _print_event(self, ms: int, e: dict[str, Any]) -> None:
        at = self.stamp(ms)
        kind = e.get("event")
        if kind == "refused":
            self.console.print(
                Text.assemble(
                    (at + "  ", "dim"),
                    ("REFUSED ", "bold red"),
                    f"{e['agent']} → {e['to']} [{e['subject']}]: {e['code']} ({e['error']}); "
                    "waiting, then resending",
                )
            )
        elif kind == "note":
            self.console.print(Text(f"{at}  {e['agent']} {e['text']}", style="dim italic"))
        elif kind == "joined":
            self.console.print(Text(f"{at}  {e['agent']} joined from {e['host']}", style="dim"))
        elif kind == "error":
            self.console.print(Text(f"{at}  {e['agent']} failed: {e['error']}", style="red"))
        elif kind == "output":
            self.console.print(Text(f"{at}  {e['host']}: {e['text']}", style="dim"))


def run_demo(
    procs: int = 3,
    data_dir: str | None = None,
    fast: bool = False,
    url: str | None = None,
    console: Console | None = None,
) -> None:
    """Run the whole production; raises ``DemoError`` when a step did not happen, and lets
    ``KeyboardInterrupt`` through once everything it started is stopped."""
    con = console or Console(highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        con.width = 110  # logs and pipes: wide enough for the summary table
    server = None
    url = url or BusSettings().url
    if not url:
        server = EmbeddedRedis.start(data_dir)
        url = server.url
        where = data_dir or "temporary"
        con.print(Text(f"embedded redis-server on {url} (data: {where})", style="dim"))
    interrupted = False
    try:
        bus = Bus.from_url(url, settings=settings(url, "host-a"))
        try:
            _produce(con, bus, url, max(1, min(procs, len(CHILDREN))), 0.05 if fast else 1.0)
        except KeyboardInterrupt:
            interrupted = True
            raise
        finally:
            _close(bus, quiet=interrupted and server is not None)
    finally:
        if server is not None:
            server.stop()


def _close(bus: Bus, quiet: bool) -> None:
    """Close the bus; ``quiet``: without a warning that its heartbeat leases could not be
    released. A terminal's Ctrl-C reaches the private redis-server too (the same process
    group), and the leases go with the server."""
    log = logging.getLogger("redisbus")
    was = log.disabled
    log.disabled = was or quiet
    try:
        bus.close()
    finally:
        log.disabled = was


def _produce(con: Console, bus: Bus, url: str, procs: int, pace: float) -> None:
    name = f"neon-dreams-{secrets.token_hex(3)}"
    ch = bus.channel(name, routing="open", pair_rate_burst=PAIR_BURST, pair_rate_per_s=PAIR_PER_S)
    boss = ch.join("director", description="the parent: briefs, notes, final review")
    con.rule(f"Neon Dreams: channel {name}, {procs + 1} OS processes")
    con.print(Text("director joined from host-a (this process)", style="dim"))
    t0 = ch.config.created_ms  # Redis clock
    here = redis_ms(bus)
    view = Transcript(con, t0, 0 if here is None else here - int(time.time() * 1000))
    events: queue.Queue[dict[str, Any]] = queue.Queue()
    stop = threading.Event()
    groups = [list(CHILDREN[i::procs]) for i in range(procs)]
    workers: list[Worker] = []
    failure: list[str] = []

    def everyone_joined() -> bool:
        for w in workers:
            if w.proc.poll() is not None:  # fail fast: it can no longer join
                why = w.stderr[-1] if w.stderr else f"exit status {w.proc.returncode}"
                raise DemoError(f"{w.host} stopped before its agents joined: {why}")
        return len(ch.members()) == 1 + len(CHILDREN)

    def report(event: str, **fields: Any) -> None:
        events.put({"event": event, **moment(bus, ch.keys.stream), **fields})

    def run_director() -> None:
        try:
            director(Actor(boss, pace, report, stop=stop), everyone_joined)
        except Exception as e:  # reported as one event line; the run then fails
            failure.append(f"director: {type(e).__name__}: {e}")

    lead = threading.Thread(target=run_director, name="director", daemon=True)
    try:
        for host, roles in zip(HOSTS, groups, strict=False):
            workers.append(Worker(roles, host, name, url, pace, events))
        lead.start()
        _follow(ch, view, events, workers, lead)
    finally:
        # the director leaves its wait within a slice, so closing the bus does not wait for
        # it; the workers are other processes, stopped at once
        stop.set()
        for w in workers:
            w.stop()
        if lead.is_alive():
            lead.join(2 * STOP_CHECK_S)
    for w in workers:
        if w.proc.returncode and not view.errors:
            detail = w.stderr[-1] if w.stderr else f"exit status {w.proc.returncode}"
            failure.append(f"{w.host} ({', '.join(w.roles)}): {detail}")
    failure += view.errors
    _summary(con, ch, boss, view)
    if failure:
        raise DemoError(failure[0])


def _follow(
    ch: Channel,
    view: Transcript,
    events: queue.Queue[dict[str, Any]],
    workers: list[Worker],
    lead: threading.Thread,
) -> None:
    """Print the stream and the events until every agent has finished (or the run times out)."""
    r = ch.bus.redis
    last = "0-0"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        finished = not lead.is_alive() and all(w.done() for w in workers)
        batch = r.xread({ch.keys.stream: last}, count=100, block=None if finished else 50)
        last = _show(ch, view, batch, last)
        while not events.empty():
            view.event(events.get_nowait())
        if finished and not batch:
            view.flush()
            return
        view.flush(view.now_ms() - HOLD_MS)
        if time.monotonic() > deadline:
            view.flush()
            view.errors.append(f"the production did not finish within {RUN_TIMEOUT_S:g} s")
            return


def _show(ch: Channel, view: Transcript, batch: Any, last: str) -> str:
    for entry_id, fields in batch[0][1] if batch else []:
        last = entry_id
        view.message(message_from_fields(ch.name, entry_id, fields, read=False))
    return last


def _to(m: Message, receipts: list[Receipt]) -> str:
    if set(m.to) | {m.sender} == set(CHILDREN) | {"director"} and len(m.to) > 1:
        return "all"
    return ",".join(r.to for r in receipts)


def ms(value: float) -> str:
    return "<1 ms" if value < 1 else f"{value:.0f} ms"


def _summary(con: Console, ch: Channel, boss: Any, view: Transcript) -> None:
    con.rule("Summary")
    con.print(member_tree(ch, ch.tree(), ch.counts()))
    table = Table(title="receipts per message", show_edge=False, pad_edge=False)
    for col in ("#", "from", "to", "subject", "queued", "delivered", "read", "done", "latency max"):
        table.add_column(col, justify="right" if col in ("#", "latency max") else "left")
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    for i, m in enumerate(view.messages, 1):
        receipts: list[Receipt] = boss.receipt(m.id)
        counts = Counter(r.status for r in receipts)
        statuses.update(counts)
        lat = [
            (r.delivered_at - r.queued_at).total_seconds() * 1000
            for r in receipts
            if r.delivered_at is not None and r.queued_at is not None
        ]
        latencies += lat
        table.add_row(
            str(i),
            m.sender,
            _to(m, receipts),
            m.subject,
            *(str(counts.get(s, 0) or "") for s in ("queued", "delivered", "read", "done")),
            ms(max(lat)) if lat else "-",
        )
    con.print(table)
    total = sum(statuses.values())
    con.print(
        f"{len(view.messages)} messages, {total} receipts: "
        + ", ".join(f"{statuses.get(s, 0)} {s}" for s in ("queued", "delivered", "read", "done"))
    )
    for e in view.refusals:
        con.print(
            Text.assemble(
                ("refusal shown: ", "bold"),
                f"{e['agent']} → {e['to']} [{e['subject']}] {e['code']}, "
                f"limit {human_number(e['limit'])} per pair, "
                f"retry_after_s {human_number(e['retry_after_s'])}; resent after waiting",
            )
        )
    if latencies:
        con.print(
            Text.assemble(
                ("send → delivery latency ", "bold"),
                f"over {len(latencies)} deliveries: p50 {ms(percentile(latencies, 50))}, "
                f"p99 {ms(percentile(latencies, 99))}, max {ms(max(latencies))}  "
                "(receipts: delivered_at - queued_at, both on the Redis clock, 1 ms resolution)",
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m redisbus.demo worker ...``: the entry of the demo's worker processes (the
    demo itself is ``redisbus demo``, which imports this module, never the reverse)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["worker"]:
        return worker_main(args[1:])
    print("run the demo with `redisbus demo` (this module's entry is its worker)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
