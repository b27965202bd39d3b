"""``python -m bench.costs``: what one call of each redisbus operation costs.

For every operation: wall time per call (median), round trips per call, the top-level
commands it sends, the commands the server executes for it (including those inside Lua
scripts) and the server time of its top-level commands (``INFO commandstats``; a script's time
includes the commands it calls). Public API only; a private server like ``python -m bench``.
Use it to see where a figure's time goes before optimising.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench import report
from bench.cases import LIMITS, check, opened
from bench.common import Ctx, RoundTrips, body
from bench.server import bench_server

Stats = dict[str, tuple[int, int]]


@dataclass
class Cost:
    op: str
    wall_us: float
    round_trips: float
    sent: str
    server_commands: float
    server_us: float


def command_stats(client: redis.Redis) -> Stats:
    """``INFO commandstats`` as {COMMAND: (calls, usec)}."""
    raw: dict[str, Any] = client.info("commandstats")
    out: Stats = {}
    for key, v in raw.items():
        if isinstance(v, dict):
            name = key.removeprefix("cmdstat_").upper()
            out[name] = (int(v["calls"]), int(v["usec"]))
    return out


def measure(
    client: redis.Redis,
    op: str,
    call: Callable[[], object],
    setup: Callable[[], object] | None = None,
    n: int = 300,
) -> Cost:
    """Run ``call`` ``n`` times (``setup`` before each, outside the measurement)."""
    for _ in range(20):
        if setup:
            setup()
        call()
    walls: list[int] = []
    trips = RoundTrips(names=True)
    server_calls = server_us = 0
    for _ in range(n):
        if setup:
            setup()
        before = command_stats(client)
        with trips.counting():
            t0 = time.perf_counter_ns()
            call()
            walls.append(time.perf_counter_ns() - t0)
        after = command_stats(client)
        mine = set(trips.commands)
        for name, (calls, usec) in after.items():
            c0, u0 = before.get(name, (0, 0))
            if name == "INFO":
                calls -= 1  # the INFO that took the `before` snapshot
            server_calls += calls - c0
            if name in mine:
                server_us += usec - u0
    sent = ", ".join(f"{k}x{v / n:g}" for k, v in trips.commands.most_common())
    return Cost(
        op=op,
        wall_us=statistics.median(walls) / 1000,
        round_trips=trips.count / n,
        sent=sent,
        server_commands=server_calls / n,
        server_us=server_us / n,
    )


def run(ctx: Ctx, fanout: int) -> list[Cost]:
    client = ctx.client()
    costs: list[Cost] = []
    with opened(ctx) as bus:
        # a quiet channel of two: the per-call floor of each operation
        quiet = bus.channel(ctx.name("quiet"), **LIMITS)
        x, y = quiet.join("x"), quiet.join("y")
        held: list[Any] = []

        def send_one() -> None:
            check(x.send("y", body()))

        def take() -> None:
            held[:] = y.wait(timeout=1).messages

        def settle() -> None:
            if held:
                y.mark_done(held)
            held.clear()

        def ready() -> None:
            settle()
            send_one()

        def fetched() -> None:
            settle()
            send_one()
            take()

        def drain() -> None:
            while msgs := y.read(limit=1_000):
                y.mark_done(msgs)

        costs.append(measure(client, "send() to one", send_one))
        drain()
        costs.append(measure(client, "wait(), one message ready", take, ready))
        costs.append(measure(client, "mark_done(one)", settle, fetched))

        def read() -> None:
            held[:] = y.read()

        settle()
        drain()
        costs.append(measure(client, "read(), one unread", read, ready))
        settle()
        costs.append(measure(client, "list(limit=20)", lambda: y.list(limit=20)))
        # one message read but never marked done, then 1,000 more handled: an unread read
        # starts at the oldest pending entry, so it now scans all that came after
        send_one()
        y.read()
        for _ in range(10):
            x.send_many([("y", body())] * 100)
            y.mark_done(y.read(limit=100))
        costs.append(measure(client, "read(), one unread, 1 undone 1,000 back", read, ready, n=100))
        settle()
        rid = x.send("y", body()).id
        costs.append(measure(client, "receipt(id)", lambda: x.receipt(rid)))

        # a wide channel: broadcast, batches, roster, joins, and reads behind a long history
        wide = bus.channel(ctx.name("wide"), **LIMITS)
        alice = wide.join("alice")
        for i in range(fanout):
            wide.join(f"agent-{i}")

        def broadcast() -> None:
            check(alice.send("all", body()))

        costs.append(measure(client, f"send('all') to {fanout}", broadcast, n=50))
        send_many = getattr(alice, "send_many", None)
        if send_many is not None:

            def batch() -> None:
                check(send_many([("agent-0", body())] * 100))

            costs.append(measure(client, "send_many() of 100", batch, n=50))
        costs.append(measure(client, f"agents(), {fanout + 1} members", alice.agents, n=50))
        carol = wide.join("carol")
        history = wide.length()

        carol_held: list[Any] = []

        def to_carol() -> None:
            if carol_held:
                carol.mark_done(carol_held)
            check(alice.send("carol", body()))

        def carol_reads() -> None:
            carol_held[:] = carol.read()

        costs.append(
            measure(client, f"read(), one unread, {history:,} before", carol_reads, to_carol)
        )
        joined = iter(range(1_000_000))

        def join() -> None:
            wide.join(f"n-{next(joined)}")

        costs.append(measure(client, f"join(), channel of {fanout + 2}+", join))
    client.close()
    return costs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.costs", description=__doc__)
    p.add_argument("--fanout", type=int, default=100, help="members a broadcast reaches")
    p.add_argument("--md", type=Path, help="also write the table as markdown to this file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    console = Console(width=max(Console().width, 140))
    with bench_server() as server:
        ctx = Ctx(
            url=server.url,
            mode="default",
            run_id=uuid.uuid4().hex[:8],
            own_server=server.own,
            memory_messages=0,
        )
        costs = run(ctx, args.fanout)
    table = Table(title="redisbus: cost of one call")
    for col in ("operation", "wall p50 µs", "round trips", "sent", "server cmds", "server µs"):
        table.add_column(col, overflow="fold")
    for c in costs:
        table.add_row(
            c.op,
            f"{c.wall_us:,.0f}",
            f"{c.round_trips:g}",
            c.sent,
            f"{c.server_commands:.1f}",
            f"{c.server_us:,.1f}",
        )
    console.print(table)
    console.print(f"redis-server {server.version}; server µs: top-level commands only")
    if args.md:
        args.md.write_text(markdown(costs, server.version))
    return 0


def markdown(costs: list[Cost], version: str) -> str:
    machine = report.machine_line(report.describe_machine(version, "private, loopback"))
    lines = [
        "# Cost of one call",
        "",
        f"`python -m bench.costs` — {report.now_iso()}. Machine: {machine}.",
        "",
        "Server µs counts the top-level commands only (a script's time includes what it calls);",
        "server commands include those a script runs.",
        "",
        "| operation | wall p50 µs | round trips | sent | server commands | server µs |",
        "|---|---|---|---|---|---|",
    ]
    for c in costs:
        lines.append(
            f"| {c.op} | {c.wall_us:,.0f} | {c.round_trips:g} | {c.sent} | "
            f"{c.server_commands:.1f} | {c.server_us:,.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
