"""The installed ``redisbus`` command, run as a user runs it, against a real redis-server.

Every test drives the console script in a subprocess (as a shell or another program would),
and checks both what it prints and its exit status. Failures must be one line on stderr.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from redisbus import Bus, BusSettings
from tests.support.servers import Server

# the console script pip installed next to this interpreter (what `make` and users run)
BIN = shutil.which("redisbus", path=str(Path(sys.executable).parent)) or "redisbus"
CH = "anime-project-1"


def clean_env(url: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    env["COLUMNS"] = "200"  # no wrapping in what the tests read
    if url:
        env["REDISBUS_URL"] = url
    env.update(extra)
    return env


Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(autouse=True)
def installed() -> None:
    if shutil.which(BIN) is None:
        pytest.fail("the redisbus command is not installed: make .venv/.installed")


@pytest.fixture
def cli(redis_url: str) -> Run:
    """cli(*args, stdin=None, env=None) -> the finished ``redisbus`` process."""

    def run(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(redis_url, **env),
        )

    return run


@pytest.fixture
def team(cli: Run, redis_url: str) -> Run:
    """A channel with director (root), writer and designer (its children), set up in-process."""
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        ch = bus.channel(CH)
        ch.join("director")
        for child in ("writer", "designer"):
            ch.join(child, parent="director")
    return cli


def test_join_creates_the_channel_and_the_agent(cli: Run) -> None:
    ok(cli("join", CH, "--as", "director", "--routing", "family"))

    me = as_json(cli("join", CH, "--as", "writer", "--parent", "director", "--json"))

    assert (me["name"], me["parent"], me["depth"]) == ("writer", "director", 1)
    assert "routing=family" in ok(cli("agents", CH)).stdout


def ok(p: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert p.returncode == 0, p.stderr
    return p


def one_line_failure(p: subprocess.CompletedProcess[str], status: int | None = None) -> str:
    assert p.returncode != 0, p.stdout
    if status is not None:
        assert p.returncode == status, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("tailing ")]  # tail's status line
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert lines[0].startswith("redisbus: ")
    return lines[0]


def as_json(p: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(p).stdout)


# -- talking ----------------------------------------------------------------------------------


def test_send_then_read_json_round_trip(team: Run) -> None:
    sent = as_json(
        team(
            "send",
            CH,
            "designer",
            "Script draft v1 ready",
            "--as",
            "writer",
            "--subject",
            "draft",
            "--type",
            "request",
            "--json",
        )
    )
    assert sent["to"] == "designer" and sent["status"] == "queued" and sent["id"]

    msgs = as_json(team("read", CH, "--as", "designer", "--json"))

    assert [(m["id"], m["from"], m["to"], m["subject"], m["body"], m["type"]) for m in msgs] == [
        (sent["id"], "writer", ["designer"], "draft", "Script draft v1 ready", "request")
    ]
    assert as_json(team("read", CH, "--as", "designer", "--json")) == []  # read now


def test_list_shows_headers_and_read_flags_without_changing_them(team: Run) -> None:
    ok(team("send", CH, "designer", "x" * 500, "--as", "writer", "--subject", "long"))

    before = as_json(
        team("list", CH, "--as", "designer", "--filter", "to:me", "--json", "--preview", "20")
    )
    again = as_json(team("list", CH, "--as", "designer", "--filter", "unread", "--json"))

    assert [(m["subject"], m["read"], m["truncated"], len(m["body"])) for m in before] == [
        ("long", False, True, 20)
    ]
    assert [m["subject"] for m in again] == ["long"]  # list changed nothing


def test_send_joins_a_new_agent_and_broadcasts(team: Run) -> None:
    out = as_json(
        team(
            "send",
            CH,
            "all",
            "Let's go with neo-80s",
            "--as",
            "storyboard",
            "--parent",
            "director",
            "--json",
        )
    )

    assert sorted(r["to"] for r in out) == ["designer", "director", "writer"]
    tree = as_json(team("agents", CH, "--json"))
    assert {m["name"]: m["parent"] for m in tree}["storyboard"] == "director"


def test_agents_prints_the_family_tree_with_statuses(team: Run) -> None:
    p = ok(team("agents", CH))

    lines = p.stdout.splitlines()
    assert CH in lines[0]
    director = next(i for i, line in enumerate(lines) if "director" in line)
    children = [line for line in lines[director + 1 :] if "writer" in line or "designer" in line]
    assert len(children) == 2
    assert all("running" in line for line in children)
    # children are drawn one level deeper than their parent
    assert all(
        line.index(n) > lines[director].index("director")
        for line, n in zip(children, ("designer", "writer"), strict=True)
    )


def test_receipt_follows_the_lifecycle(team: Run) -> None:
    sent = as_json(team("send", CH, "designer", "outfit?", "--as", "writer", "--json"))

    def status() -> str:
        (r,) = as_json(team("receipt", CH, sent["id"], "--as", "writer", "--json"))
        return str(r["status"])

    assert status() == "queued"
    ok(team("read", CH, "--as", "designer"))
    assert status() == "read"
    ok(team("done", CH, sent["id"], "--as", "designer"))
    assert status() == "done"
    table = ok(team("receipt", CH, sent["id"], "--as", "writer")).stdout
    assert "designer" in table and "done" in table


def test_wait_returns_a_waiting_message_and_options_come_from_the_environment(
    team: Run,
) -> None:
    ok(team("send", CH, "designer", "wake up", "--as", "writer"))

    got = as_json(team("wait", CH, "--timeout", "5", "--json", REDISBUS_AS="designer"))

    assert got["kind"] == "message" and [m["body"] for m in got["messages"]] == ["wake up"]


def test_stats_counts_messages_and_undone_per_agent(team: Run) -> None:
    ok(team("send", CH, "designer,writer", "hello", "--as", "director"))

    (row,) = as_json(team("stats", "--json"))

    assert row["channel"] == CH and row["length"] == 1 and row["members"] == 3
    assert row["inbox"] == {"director": 0, "writer": 1, "designer": 1} and row["undone"] == 2
    assert CH in ok(team("stats")).stdout


def test_pause_refuses_sends_until_resume(team: Run) -> None:
    ok(team("pause", CH))

    refused = team("send", CH, "designer", "hi", "--as", "writer")

    assert "paused" in one_line_failure(refused, 1)
    assert "PAUSED" in ok(team("agents", CH)).stdout
    ok(team("resume", CH))
    ok(team("send", CH, "designer", "hi", "--as", "writer"))


def test_round_trip_on_redis_6_2_the_bundled_server(redis62: Server) -> None:
    redis62.client().flushall()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN, *args], capture_output=True, text=True, timeout=60, env=clean_env(redis62.url)
        )

    ok(run("join", CH, "--as", "designer"))
    sent = as_json(run("send", CH, "designer", "on 6.2", "--as", "writer", "--json"))
    (got,) = as_json(run("read", CH, "--as", "designer", "--json"))
    tailed = ok(run("tail", CH, "--from-start", "--count", "1", "--timeout", "5", "--json"))

    assert got["id"] == sent["id"] == json.loads(tailed.stdout)["id"]


def test_discover_ranks_members_by_their_cards(cli: Run) -> None:
    ok(cli("join", CH, "--as", "director"))
    ok(
        cli(
            "join",
            CH,
            "--as",
            "designer",
            "--parent",
            "director",
            "--skill",
            "character-design",
            "--description",
            "draws the cast",
        )
    )
    ok(cli("join", CH, "--as", "writer", "--parent", "director", "--skill", "screenplay"))

    found = as_json(cli("discover", CH, "character-design", "--as", "director", "--json"))

    assert [m["name"] for m in found][:1] == ["designer"]
    assert found[0]["skills"] == ["character-design"]
    assert ok(cli("discover", CH, "screenplay", "--as", "director")).stdout.startswith("writer")


# -- tail -------------------------------------------------------------------------------------


def test_tail_prints_messages_sent_after_it_started(team: Run, redis_url: str) -> None:
    ok(team("send", CH, "designer", "before the tail", "--as", "writer"))
    tail = subprocess.Popen(
        [BIN, "tail", CH, "--json", "--count", "2", "--timeout", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(redis_url),
    )
    try:
        assert tail.stderr is not None
        assert "tailing" in tail.stderr.readline()  # it is following the stream from here on

        ok(team("send", CH, "designer", "first after", "--as", "writer"))
        ok(team("send", CH, "all", "second after", "--as", "director"))
        out, errors = tail.communicate(timeout=20)
    finally:
        tail.kill()

    assert tail.returncode == 0, errors
    msgs = [json.loads(line) for line in out.splitlines()]
    assert [(m["from"], m["body"]) for m in msgs] == [
        ("writer", "first after"),
        ("director", "second after"),
    ]


@pytest.mark.parametrize(
    ("sig", "inherited"),
    [
        (signal.SIGINT, signal.SIG_DFL),
        # a background job of a script (`redisbus tail c &` without job control) starts with
        # SIGINT ignored; the old tail relied on KeyboardInterrupt and never stopped
        (signal.SIGINT, signal.SIG_IGN),
        (signal.SIGTERM, signal.SIG_DFL),
    ],
    ids=["ctrl-c", "ctrl-c-as-background-job", "sigterm"],
)
def test_tail_stops_cleanly_on_ctrl_c(
    team: Run, redis_url: str, sig: signal.Signals, inherited: Any
) -> None:
    tail = subprocess.Popen(
        [BIN, "tail", CH],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(redis_url),
        preexec_fn=lambda: signal.signal(signal.SIGINT, inherited),
    )
    try:
        assert tail.stderr is not None and "tailing" in tail.stderr.readline()
        tail.send_signal(sig)
        _, errors = tail.communicate(timeout=20)
    finally:
        tail.kill()

    assert tail.returncode == 0 and "Traceback" not in errors


def test_send_can_wait_for_the_recipient_to_fetch(team: Run, redis_url: str) -> None:
    waiter = subprocess.Popen(
        [BIN, "wait", CH, "--as", "designer", "--timeout", "30", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(redis_url),
    )
    try:
        sent = as_json(
            team(
                "send",
                CH,
                "designer",
                "are you there?",
                "--as",
                "writer",
                "--await-delivery",
                "25",
                "--json",
            )
        )
        out, _ = waiter.communicate(timeout=30)
    finally:
        waiter.kill()

    assert sent["status"] in ("delivered", "read") and sent["delivered_at"]
    assert [m["id"] for m in json.loads(out)["messages"]] == [sent["id"]]


def test_tail_from_start_replays_history_in_rich_text(team: Run) -> None:
    ok(team("send", CH, "designer", "Script draft v1 ready", "--as", "writer", "-s", "draft"))

    p = ok(team("tail", CH, "--from-start", "--count", "1", "--timeout", "5"))

    assert "writer → designer" in p.stdout and "Script draft v1 ready" in p.stdout


def test_tail_that_misses_its_count_exits_non_zero(team: Run) -> None:
    p = team("tail", CH, "--count", "1", "--timeout", "0.3")

    assert "0 of 1" in one_line_failure(p, 1)


def test_message_text_is_shown_not_obeyed_by_the_terminal(team: Run) -> None:
    ok(team("send", CH, "designer", "\x1b[2Jcleared?", "--as", "writer"))

    p = ok(team("read", CH, "--as", "designer"))

    assert "\x1b" not in p.stdout and "\\x1b[2Jcleared?" in p.stdout


def test_dlq_lists_and_replays_a_dead_letter(cli: Run, redis_url: str) -> None:
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        ch = bus.channel(CH, lease_s=0.05, max_deliveries=1)
        writer = ch.join("writer")
        crashed = ch.join("designer", replica="host-a/1")
        writer.send("designer", "a turn that crashed")
        assert crashed.wait(timeout=2).messages  # fetched, never done: its replica "dies"
        time.sleep(0.2)  # the lease runs out
        ch.join("designer", replica="host-b/1").wait(timeout=0.2)  # reclaims: dead-lettered

    (dead,) = as_json(cli("dlq", "list", CH, "--json"))
    assert (dead["recipient"], dead["message"]["body"]) == ("designer", "a turn that crashed")
    assert "a turn that crashed" in ok(cli("dlq", "list", CH)).stdout

    replayed = ok(cli("dlq", "replay", CH, dead["id"])).stdout.split()
    assert replayed[:2] == [dead["id"], "->"]
    (again,) = as_json(cli("read", CH, "--as", "designer", "--json"))
    assert (again["id"], again["body"]) == (replayed[2], "a turn that crashed")
    assert "no dead letter" in one_line_failure(cli("dlq", "replay", CH, "1-0"), 2)


# -- failures: one line, a non-zero status, never a traceback ---------------------------------


@pytest.mark.parametrize(
    ("args", "stdin", "status", "words"),
    [
        (["read", CH, "--as", "designer", "--filter", "bogus:x"], None, 2, "unknown filter term"),
        (["read", CH, "--as", "designer", "--since", "yesterday"], None, 2, "ISO-8601"),
        (["send", CH, "nobody", "hi", "--as", "writer"], None, 1, "unknown_agent"),
        (["send", CH, "director", "-", "--as", "writer"], "x" * 40_000, 1, "too_large"),
        (["wait", CH, "--as", "designer", "--timeout", "301"], None, 2, "and 300 seconds"),
        (["wait", CH, "--as", "designer", "--timeout", "0.1"], None, 1, "timeout"),
        (["receipt", CH, "not-an-id", "--as", "writer"], None, 2, "message id"),
        (["read", "no-such-channel", "--as", "designer"], None, 1, "no such channel"),
        (["receipt", CH, "1-0", "--as", "stranger"], None, 1, "no such member"),
        (["send", CH, "designer", "hi", "--as", "writer", "--type", "shout"], None, 2, "type"),
        (["send", CH, "designer", "--as", "writer"], None, 2, "Missing argument"),
        (["read", CH, "--as", "designer", "--bogus"], None, 2, "No such option"),
    ],
)
def test_bad_input_fails_with_one_line(
    team: Run, args: list[str], stdin: str | None, status: int, words: str
) -> None:
    p = team(*args, stdin=stdin)

    assert words in one_line_failure(p, status)


def test_refused_broadcast_reports_per_recipient_and_fails(cli: Run, redis_url: str) -> None:
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        ch = bus.channel(CH, pair_rate_burst=1, pair_rate_per_s=0.01)  # one send per pair
        for name in ("director", "writer", "designer"):
            ch.join(name)
    ok(cli("send", CH, "designer", "panel 1", "--as", "writer"))

    p = cli("send", CH, "designer,director", "one more", "--as", "writer", "--json")

    receipts = {r["to"]: r for r in json.loads(p.stdout)}
    assert receipts["director"]["status"] == "queued"
    assert receipts["designer"]["status"] == "rejected"
    assert receipts["designer"]["error"].startswith("rate_limited")
    assert "refused for 1 of 2" in one_line_failure(p, 1)


def test_without_a_url_a_command_runs_on_a_private_redis(tmp_path: Path) -> None:
    # given: no REDISBUS_URL and no data directory
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN, *args], capture_output=True, text=True, timeout=60, env=clean_env(None)
        )

    # when: commands run one after the other
    joined = run("join", CH, "--as", "director")
    stats = run("stats", "--json")

    # then: each ran on a private Redis of its own, and said so on stderr
    assert joined.returncode == 0, joined.stderr
    assert "private Redis for this command only" in joined.stderr
    assert "REDISBUS_URL" in joined.stderr and "REDISBUS_DATA_DIR" in joined.stderr
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout) == []  # no channels: the first command's data went with it


def test_a_data_dir_keeps_the_board_between_commands(tmp_path: Path) -> None:
    board = tmp_path / "board"
    env = clean_env(None, REDISBUS_DATA_DIR=str(board))

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60, env=env)

    # given: a board kept in a directory, by commands that each start and stop its server
    for who in ("director", "designer"):
        assert run("join", CH, "--as", who).returncode == 0
    assert run("send", CH, "designer", "keep me", "--as", "director").returncode == 0

    # when: a later command reads it
    got = run("read", CH, "--as", "designer", "--json")

    # then: the message was kept (AOF in the directory); no server was left running
    assert got.returncode == 0, got.stderr
    assert [m["body"] for m in json.loads(got.stdout)] == ["keep me"]
    assert not (board / "redisbus-server.json").exists()


def test_commands_share_the_server_that_keeps_a_board(tmp_path: Path) -> None:
    # given: `redisbus redis --data DIR` serving a board
    board = tmp_path / "board"
    proc = subprocess.Popen(
        [BIN, "redis", "--data", str(board)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(None),
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip().removeprefix("REDISBUS_URL=")
        env = clean_env(None, REDISBUS_DATA_DIR=str(board))

        # when: commands with only REDISBUS_DATA_DIR run, and a second server is asked for
        p = subprocess.run(
            [BIN, "join", CH, "--as", "director"], capture_output=True, text=True, env=env
        )
        second = subprocess.run(
            [BIN, "redis", "--data", str(board)], capture_output=True, text=True, env=env
        )

        # then: the command used the running server, and no second server was started on
        # the same append-only file
        assert p.returncode == 0, p.stderr
        assert Bus.from_url(url).channels() == [CH]
        assert second.returncode == 1 and url in second.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(15)


def test_unreachable_redis_is_one_line() -> None:
    with socket.socket() as held:  # bound, never listening: connections to it are refused
        held.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{held.getsockname()[1]}/0"
        p = subprocess.run(
            [BIN, "stats"],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(url, REDISBUS_RETRY_ATTEMPTS="0"),
        )

    assert "connection" in one_line_failure(p, 3)


def test_plugin_commands_are_listed(cli: Run) -> None:
    p = ok(cli("--help"))

    for name in (
        "send",
        "read",
        "list",
        "tail",
        "agents",
        "receipt",
        "pause",
        "resume",
        "stats",
        "redis",
        "demo",
        "dlq",
        "exporter",
        "mcp",
    ):
        assert f" {name} " in p.stdout, name


@pytest.mark.parametrize(("command", "option"), [("mcp", "--channel")])
def test_module_commands_get_their_arguments(cli: Run, command: str, option: str) -> None:
    p = ok(cli(command, "--help"))  # --help belongs to the module, not to the wrapper

    assert "usage:" in p.stdout.lower() and option in p.stdout


# -- running a server -------------------------------------------------------------------------


def test_redis_runs_a_server_in_the_foreground_until_interrupted(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [BIN, "redis", "--data", str(tmp_path / "board")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(None),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        found = re.fullmatch(r"REDISBUS_URL=(redis://127\.0\.0\.1:(\d+)/0)", line)
        assert found, line
        assert redis.Redis.from_url(found[1]).ping()

        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    assert (tmp_path / "board").is_dir()  # --data keeps the data (AOF) for the next start
