"""``redisbus demo``: the demo team across OS processes, run as ``make demo`` runs it."""

from __future__ import annotations

import re
import subprocess

from redisbus import Bus, BusSettings
from redisbus.demo import percentile
from tests.cli.test_cli import BIN, clean_env
from tests.support.servers import Server


def run_demo(url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BIN, "demo", "--fast", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(url),
    )


def test_demo_with_no_redis_configured_runs_the_whole_production() -> None:
    p = run_demo(None)

    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    out = p.stdout
    assert "embedded redis-server" in out
    assert "4 OS processes" in out
    for host in ("host-b", "host-c", "host-d"):
        assert f"joined from {host}" in out
    # the rounds of the seed, in causal order (the writer's revision and the designs race)
    chains = [
        [
            "[kickoff]",
            "[script v1]",
            "Need descriptions of main character's outfit",
            "Added wardrobe notes in v2",
            "Let's go with neo-80s aesthetic",
            "[script final]",
            "[panel 1]",
            "[panel 4]",
            "[final review]",
            "[wrap]",
        ],
        ["Let's go with neo-80s aesthetic", "[designs]", "[panel 1]"],
    ]
    for chain in chains:
        positions = [out.index(step) for step in chain]
        assert positions == sorted(positions), chain
    # one refusal, shown as a typed refusal with its retry time, then the panel resent
    assert re.search(
        r"REFUSED storyboard → director \[panel 4\]: rate_limited .*limit 3, .*retry after "
        r"0\.\d+ s\)",
        out,
    )
    # the summary: every receipt done, and the latency percentiles
    assert re.search(r"16 messages, 30 receipts: 0 queued, 0 delivered, 0 read, 30 done", out)
    assert re.search(
        r"send → delivery latency over 30 deliveries: p50 (<1|\d+) ms, "
        r"p99 (<1|\d+) ms",
        out,
    )
    assert "Traceback" not in out + p.stderr
    # the transcript reads in time order: messages and the workers' reports alike
    stamps = [float(t) for t in re.findall(r"^\s*(\d+\.\d+)s ", out, re.MULTILINE)]
    assert len(stamps) >= 20 and stamps == sorted(stamps)


def test_demo_uses_the_configured_redis_with_two_processes(redis_url: str) -> None:
    p = run_demo(redis_url, "--agents-procs", "1")

    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert "embedded" not in p.stdout and "2 OS processes" in p.stdout
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        assert [c for c in bus.channels() if c.startswith("neon-dreams-")]


def test_demo_runs_on_redis_6_2_the_bundled_server(redis62: Server) -> None:
    redis62.client().flushall()

    p = run_demo(redis62.url, "--agents-procs", "2")

    assert p.returncode == 0, p.stdout[-2000:] + p.stderr
    assert "30 done" in p.stdout and "REFUSED" in p.stdout


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]

    assert (percentile(values, 50), percentile(values, 99), percentile([7.0], 99)) == (
        50.0,
        99.0,
        7.0,
    )


def test_demo_bad_options_fail_with_one_line() -> None:
    p = subprocess.run(
        [BIN, "demo", "--agents-procs", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(None),
    )

    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
