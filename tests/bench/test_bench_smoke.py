"""Smoke test of the benchmark suite: it runs, exits 0 and writes the documented JSON.

Timing numbers are not asserted: benchmarks are not timed tests (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.prometheus_fixture import require_tool
from tests.support.servers import Server

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_quick_send_writes_results(tmp_path: Path) -> None:
    out_json = tmp_path / "results.json"
    out_md = tmp_path / "RESULTS.md"
    env = {k: v for k, v in os.environ.items() if k != "REDISBUS_BENCH_URL"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--rounds",
            "1",
            "--only",
            "send",
            "--json",
            str(out_json),
            "--md",
            str(out_md),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]

    doc = json.loads(out_json.read_text())
    assert {"schema", "generated_at", "config", "machine", "figures"} <= doc.keys()
    assert {"cpu", "cores", "python", "redis_server", "redis_py", "hiredis"} <= doc[
        "machine"
    ].keys()
    assert doc["config"]["mode"] == "quick"
    assert [f["name"] for f in doc["figures"]] == ["send"]

    fig = doc["figures"][0]
    assert {"title", "status", "baseline", "subject", "ratios", "targets", "notes"} <= fig.keys()
    assert fig["status"] in {"met", "not met", "unavailable", "info"}
    baseline = fig["baseline"]
    assert baseline["error"] is None
    assert len(baseline["runs"]) == 1
    assert {"msgs_per_s", "p50_us", "p99_us"} <= baseline["median"].keys()
    if fig["status"] != "unavailable":
        assert fig["subject"]["error"] is None
        assert {"msgs_per_s", "p50_us", "p99_us"} <= fig["subject"]["median"].keys()
        assert [t["metric"] for t in fig["targets"]] == ["msgs_per_s"]
        assert fig["targets"][0]["met"] in (True, False)

    md = out_md.read_text()
    assert md.startswith("# Benchmark results")
    assert "| figure |" in md
    assert str(tmp_path) not in md  # no machine paths in the pasteable table


@pytest.mark.timeout(300)
def test_bench_costs_runs() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REDISBUS_BENCH_URL"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.costs", "--fanout", "5"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for op in ("send() to one", "wait(), one message ready", "mark_done(one)", "read()"):
        assert op in proc.stdout


@pytest.mark.timeout(120)
def test_the_receive_side_wake_up_case_gets_every_bare_xadd(redis7: Server) -> None:
    # given: the recv-wakeup case (wait() fed by a bare XADD of send()'s entry), quick size
    from bench.cases import bus_wait_wakeup_xadd
    from bench.common import Ctx

    ctx = Ctx(redis7.url, "quick", uuid.uuid4().hex[:6], own_server=False, memory_messages=0)
    # when: it runs at 2k msg/s
    got = bus_wait_wakeup_xadd(ctx, rate=2_000.0)
    # then: the receiver woke for every copy, each a whole message (its body's stamp parsed)
    assert got["missed"] == 0
    assert 0 < got["p50_us"] <= got["p99_us"]


def _instructions(*args: str) -> dict[str, int]:
    """``python -m bench.instructions *args``'s table: each row's name and count."""
    # (valgrind: make test installs it in CI; without it this fails there, skips elsewhere)
    require_tool("valgrind")
    require_tool("callgrind_control")
    proc = subprocess.run(
        [sys.executable, "-m", "bench.instructions", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ")][1:]
    return {row.split("|")[1].strip(): int(row.split("|")[2].replace(",", "")) for row in rows}


@pytest.mark.timeout(300)
def test_bench_instructions_counts_each_call() -> None:
    # the instruction counts (bench/instructions.py) run and print one positive count per call
    n = _instructions()
    assert set(n) == {
        "send",
        "batch, per message",
        "broadcast to 100",
        "wake, empty bell",
        "wake, one message",
        "mark_done, one message",
        "heartbeat, channel of 10",
        "sweep, per entry trimmed",
        "message life, 400 marks held",
    }
    assert all(v > 10_000 for v in n.values()), n
    # a heartbeat renews ten replicas: more than one call's fixed cost (a quiet wake-up)
    assert n["heartbeat, channel of 10"] > 2 * n["wake, empty bell"]
    # a wake that hands over a message claims it, reads its fields and marks it: more than a
    # wake that finds its bell empty (so the pairs' send was taken off, not the wake counted
    # twice or not at all)
    assert n["wake, empty bell"] < n["wake, one message"] < n["send"] + n["wake, empty bell"] * 3
    # a whole life is its three calls (and no scan of the 400 marks: the old list cost 1.4x)
    life = n["send"] + n["wake, one message"] + n["mark_done, one message"]
    assert 0.7 * life < n["message life, 400 marks held"] < 1.25 * life, n


@pytest.mark.timeout(300)
def test_bench_instructions_counts_the_bare_floor() -> None:
    # --floor counts bare commands beside the scripts (docs/benchmarks.md quotes them): each
    # stream command with its XADD taken off, and an FCALL costs more with send's arguments
    n = _instructions("--floor")
    assert len(n) == 6, n
    assert all(v > 1_000 for v in n.values()), n
    claim = n["XCLAIM FORCE LASTID of the newest entry (wake.lua's)"]
    assert n["the same with JUSTID"] < claim
    assert (
        n["FCALL of a function that returns at once"] < n["the same with send.lua's KEYS and ARGV"]
    )


@pytest.mark.timeout(300)
def test_bench_instructions_counts_the_fleet_on_each_topology() -> None:
    # the fleet's instructions per message (bench.instructions.fleet, the scale figure's
    # noise-free cost) on one server and on a 3-shard Cluster, a small fleet
    require_tool("valgrind")
    require_tool("callgrind_control")
    from bench.instructions import fleet

    got = fleet(channels=3, cycles=30, clusters=(3,))
    assert set(got) == {"one server", "raw Streams, one server", "3-shard Cluster"}
    # the raw Streams life (XADD, XREADGROUP, XACK), counted the same way, costs less
    assert 0 < got["raw Streams, one server"]["per_msg"] < got["one server"]["per_msg"]
    one = got["one server"]["per_msg"]
    assert one > 100_000
    # every message's work is on the server holding its channel: the three shards do what one
    # server does, give or take Cluster mode's slot checks
    assert 0.95 < got["3-shard Cluster"]["per_msg"] / one < 1.15, got
    assert sum(v for k, v in got["3-shard Cluster"].items() if k.startswith("server")) == (
        pytest.approx(got["3-shard Cluster"]["per_msg"])
    )


@pytest.mark.timeout(300)
def test_bench_instructions_counts_the_life_of_the_smallest_design_beside_redisbus() -> None:
    # --design (docs/benchmarks.md quotes it): a message's life on raw Streams, in the
    # smallest design that keeps the bus's features (bench/design_floor.lua), and in redisbus,
    # each life run whole (the harness checks that each message was handed over and done)
    require_tool("valgrind")
    require_tool("callgrind_control")
    from bench.instructions import design

    got = design(lives=40)
    deep, shallow, floor, bus = got.values()
    assert list(got) == [
        "raw Streams, one stream",
        "raw Streams, 300 streams of a few entries",
        "smallest design keeping the features",
        "redisbus",
    ]
    # commands per life, those the functions run included: XADD, XREADGROUP, XACK; the
    # design's three functions and 16 commands; redisbus's 23 (bench/SCALE.md's count)
    assert deep["commands"] == shallow["commands"] == 3
    assert floor["commands"] == 19
    assert bus["commands"] >= floor["commands"]
    # the raw lives cost less than the yardstick, which costs less than redisbus. (Forty lives
    # leave the one stream as shallow as the 300: which of the two raw lives is cheaper shows
    # at --design's thousand, where the one stream is as deep as a channel's, not here.)
    assert max(shallow["instructions"], deep["instructions"]) < floor["instructions"]
    assert floor["instructions"] < bus["instructions"]


def test_a_run_of_some_figures_leaves_the_committed_table_alone() -> None:
    # `python -m bench --only X` wrote its partial table over bench/RESULTS.md, the full run's
    from bench.__main__ import HERE, parse_args

    assert parse_args([]).md == HERE / "RESULTS.md"
    assert parse_args(["--only", "send"]).md == HERE / "RESULTS-partial.md"
    assert parse_args(["--only", "send", "--md", "x.md"]).md == Path("x.md")
    # and its wake-up plot over the one the full table links
    from bench.scale_report import wakeup_png

    assert wakeup_png(HERE / "RESULTS.md") == "wakeup-latency.png"
    assert wakeup_png(parse_args(["--only", "wakeup"]).md) == "wakeup-latency-results-partial.png"


def test_a_near_miss_reads_as_one() -> None:
    # a figure 0.4% over its bound said "1.05: 0% over" (rounded to the bound it missed)
    from bench.report import Target, _gap

    bound = Target("ir_ratio", "max", 1.05, "same as one server (≤ 1.05x)")
    assert _gap(bound, 1.0537, False) == "1.054: 0.4% over same as one server (≤ 1.05x)"
    ratio = Target("p50_us", "ratio_max", 1.3, "≤ 1.3x raw")
    assert _gap(ratio, 1.34, False) == "1.34x: 3% over ≤ 1.3x raw"
    assert _gap(ratio, 1.302, False) == "1.302x: 0.2% over ≤ 1.3x raw"
    assert _gap(Target("x", "ratio_min", 1.0, "≥ 1.0x raw"), 0.86, False) == (
        "0.86x: 14% short of ≥ 1.0x raw"
    )
