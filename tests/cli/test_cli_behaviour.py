"""What the ``redisbus`` command does a user meets on a fresh machine (docs/reference/cli.md),
against a real redis-server: read-only commands create nothing, a refused send leaves nothing,
``wait`` moves on, and failures say what happened with the documented exit status.

Most tests run the command in this process (``redisbus.cli.main``, exactly what the console
script calls), which is several times faster than a subprocess on a loaded machine; those that
need a process of their own (a hanging connection, a server in the foreground) start one.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from redisbus import Bus, BusSettings
from redisbus.cli import main
from tests.cli.test_cli import clean_env
from tests.support.tls_servers import TLSServer, tls_redis  # noqa: F401 - the fixture

BIN = shutil.which("redisbus", path=str(Path(sys.executable).parent)) or "redisbus"
CH = "anime-project-1"


@dataclass
class Done:
    status: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)

    def failure(self) -> str:
        """The one stderr line of a failure."""
        lines = [x for x in self.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("redisbus: "), self.stderr
        return lines[0]


Run = Callable[..., Done]


def run_cli(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    url: str,
    *args: str,
    **env: str,
) -> Done:
    """``redisbus ARGS`` run in this process with REDISBUS_URL=url and only ``env`` besides."""
    with monkeypatch.context() as m:
        for k in [k for k in os.environ if k.startswith("REDISBUS_")]:
            m.delenv(k)
        for k, v in {"COLUMNS": "200", "REDISBUS_URL": url, **env}.items():
            m.setenv(k, v)
        capsys.readouterr()
        try:
            main(list(args))
            status = 0
        except SystemExit as e:
            status = int(e.code or 0)
        got = capsys.readouterr()
    return Done(status, got.out, got.err)


@pytest.fixture
def cli(redis_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Run:
    """cli(*args, **env) -> Done: ``redisbus ARGS`` run in this process."""

    def run(*args: str, **env: str) -> Done:
        return run_cli(monkeypatch, capsys, redis_url, *args, **env)

    return run


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as b:
        yield b


@pytest.fixture
def team(cli: Run, bus: Bus) -> Run:
    """director (root) with writer and designer (its children), joined in-process."""
    ch = bus.channel(CH)
    ch.join("director")
    for child in ("writer", "designer"):
        ch.join(child, parent="director")
    return cli


def members(bus: Bus) -> set[str]:
    return set(bus.channel(CH).members())


def groups(bus: Bus) -> set[str]:
    stream = bus.channel(CH).keys.stream
    return {g["name"] for g in bus.redis.xinfo_groups(stream)}


# -- nothing is created by commands that only look -------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["read", CH],
        ["list", CH],
        ["wait", CH, "--timeout", "0.1"],
        ["done", CH, "1-0"],
        ["receipt", CH, "1-0"],
        ["discover", CH],
    ],
    ids=lambda a: a[0],
)
def test_a_command_as_a_non_member_joins_nobody(team: Run, bus: Bus, args: list[str]) -> None:
    before = (members(bus), groups(bus))

    p = team(*args, "--as", "nobody-yet")

    assert p.status == 1
    assert "unknown_agent: no such member 'nobody-yet'" in p.failure()
    assert (members(bus), groups(bus)) == before


def test_list_and_receipt_leave_a_completed_member_completed(team: Run, bus: Bus) -> None:
    ch = bus.channel(CH)
    sent = ch.join("director").send("writer", "draft?")
    ch.join("writer", parent="director").complete("all written")

    assert team("list", CH, "--as", "writer").status == 0
    assert team("receipt", CH, sent.id, "--as", "writer").status == 0
    assert team("discover", CH, "--as", "writer").status == 0

    assert ch.members()["writer"].status == "completed"


@pytest.mark.parametrize(
    "args",
    [
        ["read", "no-such-channel", "--as", "designer"],
        ["list", "no-such-channel", "--as", "designer"],
        ["agents", "no-such-channel"],
        ["send", "no-such-channel", "designer", "hi", "--as", "writer"],
    ],
    ids=lambda a: a[0],
)
def test_an_unknown_channel_is_reported_as_such_and_not_created(
    team: Run, bus: Bus, args: list[str]
) -> None:
    bus.channel("secret-other-team")

    p = team(*args)

    line = p.failure()
    assert p.status == 1
    assert "unknown_channel: no such channel 'no-such-channel'" in line
    assert "secret-other-team" not in line and CH not in line  # no list of every channel
    assert "no-such-channel" not in bus.channels()


# -- a refused send leaves nothing behind ------------------------------------------------------


def test_a_refused_send_by_a_new_name_leaves_no_member(team: Run, bus: Bus) -> None:
    before = (members(bus), groups(bus))

    p = team("send", CH, "nobody", "hi", "--as", "ghost", "--json")

    assert p.status == 1
    receipt = p.json()  # JSON for a single refused recipient too
    assert (receipt["to"], receipt["status"], receipt["id"]) == ("nobody", "rejected", None)
    assert receipt["error"].startswith("unknown_agent")
    assert "refused: unknown_agent" in p.failure()
    assert (members(bus), groups(bus)) == before


def test_a_send_refused_by_routing_leaves_no_member(cli: Run, bus: Bus) -> None:
    ch = bus.channel("family-team", routing="family")
    ch.join("director")
    ch.join("writer", parent="director")
    ch.join("designer", parent="writer")  # a grandchild of director

    p = cli("send", "family-team", "designer", "hi", "--as", "intern", "--parent", "director")

    assert p.status == 1 and "routing_refused" in p.failure()
    assert set(ch.members()) == {"director", "writer", "designer"}


def test_a_send_with_bad_input_joins_nobody(team: Run, bus: Bus) -> None:
    before = members(bus)

    p = team("send", CH, "designer", "hi", "--as", "ghost", "--type", "shout")

    assert p.status == 2 and "invalid_input" in p.failure()
    assert members(bus) == before


def test_a_new_name_that_sends_is_a_member(team: Run, bus: Bus) -> None:
    p = team("send", CH, "designer", "hi", "--as", "storyboard", "--parent", "director")

    assert p.status == 0, p.stderr
    assert "storyboard" in members(bus)


# -- names and recipient lists -------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["join", CH, "--as", "a,b"],
        ["send", CH, "designer", "hi", "--as", "a,b"],
        ["join", CH, "--as", "intern", "--parent", "writer,designer"],
        ["send", CH, "designer,,writer", "hi", "--as", "director"],
        ["send", CH, "designer,", "hi", "--as", "director"],
    ],
)
def test_names_with_a_comma_are_refused(team: Run, bus: Bus, args: list[str]) -> None:
    before = members(bus)

    p = team(*args)

    assert p.status == 2 and "invalid_input" in p.failure()
    assert members(bus) == before


def test_a_comma_list_reaches_each_name(team: Run) -> None:
    p = team("send", CH, "designer, writer", "hello", "--as", "director", "--json")

    assert p.status == 0, p.stderr
    assert sorted(r["to"] for r in p.json()) == ["designer", "writer"]


# -- wait ---------------------------------------------------------------------------------------


def test_wait_returns_each_message_once(team: Run, bus: Bus) -> None:
    writer = bus.channel(CH).join("writer", parent="director")
    first = writer.send("designer", "first")

    got = team("wait", CH, "--as", "designer", "--timeout", "5", "--json")
    again = team("wait", CH, "--as", "designer", "--timeout", "0.3", "--json")
    second = writer.send("designer", "second")
    then = team("wait", CH, "--as", "designer", "--timeout", "5", "--json")

    assert [m["id"] for m in got.json()["messages"]] == [first.id]
    assert again.status == 1 and again.json() == {"kind": "timeout", "messages": []}
    assert [m["id"] for m in then.json()["messages"]] == [second.id]
    # returned means read, not done: it still counts as undone until `done`
    assert first.id is not None
    (r,) = writer.receipt(first.id)
    assert r.status == "read"


def test_wait_skips_what_read_returned_but_not_what_it_left(team: Run, bus: Bus) -> None:
    ch = bus.channel(CH)
    director = ch.join("director")
    writer = ch.join("writer", parent="director")
    director.send("designer", "from the director")
    wanted = writer.send("designer", "from the writer")
    assert team("read", CH, "--as", "designer", "--filter", "from:director").status == 0

    got = team("wait", CH, "--as", "designer", "--timeout", "5", "--json")

    assert [m["id"] for m in got.json()["messages"]] == [wanted.id]


def test_wait_done_marks_what_it_returned_done(team: Run, bus: Bus) -> None:
    writer = bus.channel(CH).join("writer", parent="director")
    sent = writer.send("designer", "please ack")

    got = team("wait", CH, "--as", "designer", "--timeout", "5", "--done", "--json")

    assert [m["id"] for m in got.json()["messages"]] == [sent.id]
    assert sent.id is not None
    (r,) = writer.receipt(sent.id)
    assert r.status == "done"
    assert bus.channel(CH).counts()["designer"] == 0


# -- what read and send report -------------------------------------------------------------------


def test_read_json_says_read_for_what_it_just_marked_read(team: Run, bus: Bus) -> None:
    bus.channel(CH).join("writer", parent="director").send("designer", "draft")

    (m,) = team("read", CH, "--as", "designer", "--json").json()

    assert m["body"] == "draft" and m["read"] is True


def test_await_delivery_that_runs_out_fails_with_a_hint(team: Run) -> None:
    started = time.monotonic()
    p = team(
        "send", CH, "designer", "anyone?", "--as", "writer", "--await-delivery", "0.5", "--json"
    )

    assert p.status == 1
    assert p.json()["status"] == "queued"  # the receipt, as it stands
    line = p.failure()
    assert "not delivered within 0.5 s to designer" in line
    assert "still queued" in line and "redisbus receipt" in line
    assert time.monotonic() - started < 30


def test_limit_errors_print_their_numbers_as_people_write_them(team: Run) -> None:
    body = "x" * 40_000

    p = team("send", CH, "designer", body, "--as", "writer")

    line = p.failure()
    assert p.status == 1 and "too_large" in line
    assert "limit 32768 (32 KiB)" in line and "current 40000 (39.1 KiB)" in line
    assert "e+" not in line


# -- shell completion ----------------------------------------------------------------------------


def test_shell_completion_is_on(cli: Run) -> None:
    p = cli("--help")

    assert p.status == 0
    assert "--install-completion" in p.stdout and "--show-completion" in p.stdout


def test_bash_completes_command_names(cli: Run) -> None:
    p = cli(_REDISBUS_COMPLETE="complete_bash", COMP_WORDS="redisbus se", COMP_CWORD="1")

    assert p.status == 0 and p.stdout.split() == ["send"]


# -- connections and servers (processes of their own) --------------------------------------------


def test_rediss_to_a_plain_redis_fails_fast_and_says_why(redis_url: str) -> None:
    tls_url = redis_url.replace("redis://", "rediss://")
    started = time.monotonic()

    p = subprocess.run(
        [BIN, "stats"], capture_output=True, text=True, timeout=60, env=clean_env(tls_url)
    )

    took = time.monotonic() - started
    assert p.returncode == 3, p.stderr
    assert "TLS" in p.stderr and "plain Redis" in p.stderr and "redis://" in p.stderr
    assert took < 20, took  # a 3 s handshake limit plus the start of a process on a busy box


def test_redis_on_a_busy_port_fails_before_printing_a_url(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]

        p = subprocess.run(
            [BIN, "redis", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=clean_env(None),
        )

    assert p.returncode == 1
    assert p.stdout == ""  # no REDISBUS_URL=... of someone else's server
    assert "REDISBUS_URL" not in p.stderr
    assert f"port {port}" in p.stderr and "in use" in p.stderr


def test_rediss_to_a_tls_redis_still_works(
    tls_redis: TLSServer,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given: a server that requires client certificates (the handshake check must present them)
    env = {f"REDISBUS_{k.upper()}": v for k, v in tls_redis.ssl_settings().items()}

    joined = run_cli(monkeypatch, capsys, tls_redis.url, "join", "tls-team", "--as", "director")
    stats = run_cli(monkeypatch, capsys, tls_redis.url, "stats", "--json", **env)

    assert joined.status == 3 and "certificate" in joined.failure()  # no CA, no client cert
    assert stats.status == 0, stats.stderr
    assert [row["channel"] for row in stats.json()] == []
