"""What a newcomer meets first, polished (docs/getting-started.md): Ctrl-C ends ``redisbus demo`` at
once and cleanly, its transcript reads in time order, ``--help`` shows no placeholder after a flag,
and ``redisbus console`` is a command like the others (its options complete in the shell)."""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from rich.console import Console

from redisbus._model import Message
from redisbus.cli import main
from redisbus.demo import Transcript
from tests.cli.test_cli import BIN, clean_env
from tests.support.servers import binary, missing


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


# -- --help ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [(), ("demo",), ("tail",), ("read",), ("dlq",)])
def test_flags_show_no_value_placeholder_in_help(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    text = help_of(capsys, *command)

    assert "--help" in text
    assert "<bool>" not in text
    if command == ("demo",):
        assert re.search(r"--agents-procs\s+<int range>", text)  # values keep theirs


# -- redisbus console -----------------------------------------------------------------------


def test_console_help_is_the_cli_s_own_with_its_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    text = help_of(capsys, "console")

    for option, variable in [
        ("--token", "REDISBUS_CONSOLE_TOKEN"),
        ("--port", "REDISBUS_CONSOLE_PORT"),
        ("--host", "REDISBUS_CONSOLE_HOST"),
        ("--url", "REDISBUS_URL"),
    ]:
        assert option in text and f"env var: {variable}" in text
    assert "127.0.0.1" in text and "8484" in text
    assert "usage: redisbus console [-h]" not in text  # argparse's
    assert "<bool>" not in text


def test_console_options_complete_in_the_shell() -> None:
    env = clean_env(
        None,
        _REDISBUS_COMPLETE="complete_bash",
        COMP_WORDS="redisbus console --",
        COMP_CWORD="2",
    )

    got = subprocess.run([BIN], capture_output=True, text=True, timeout=60, env=env)

    offered = got.stdout.split()
    assert {"--token", "--port", "--host", "--url", "--stuck-after"} <= set(offered), got


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--token", "short"], {}, "--token"),
        ([], {"REDISBUS_CONSOLE_TOKEN": "short"}, "--token"),
        (["--messages", "0"], {}, "--messages"),
        (["--stuck-after", "-1"], {}, "--stuck-after"),
        (["--port", "70000"], {}, "--port"),
    ],
)
def test_console_refuses_bad_options_with_one_line_and_exit_2(
    args: list[str],
    env: dict[str, str],
    said: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in [v for v in os.environ if v.startswith("REDISBUS_")]:
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)

    with pytest.raises(SystemExit) as done:
        main(["console", "--url", "redis://127.0.0.1:1/0", *args])

    assert done.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    # one line, as every command says a failure
    assert len(lines) == 1 and lines[0].startswith("redisbus: ") and said in lines[0], lines
    assert "console on http" not in lines[0]


# -- the demo's transcript ------------------------------------------------------------------


def message(entry_ms: int, sender: str, subject: str, seq: int = 0) -> Message:
    return Message(
        id=f"{entry_ms}-{seq}",
        channel="neon",
        sender=sender,
        to=("director",),
        body=f"the {subject}",
        subject=subject,
        created_at=datetime.fromtimestamp(entry_ms / 1000, UTC),
    )


def stamps(text: str) -> list[float]:
    return [float(s) for s in re.findall(r"^\s*(\d+\.\d+)s ", text, re.MULTILINE)]


def test_transcript_prints_an_event_that_arrives_late_before_later_messages() -> None:
    # given: panel 1 read off the stream before the storyboard's note, written earlier (at
    # 1.590 s), has come through its process's pipe
    buf = io.StringIO()
    view = Transcript(Console(file=buf, width=200, highlight=False), t0_ms=1_000_000)
    view.message(message(1_001_610, "storyboard", "panel 1"))
    view.event({"event": "note", "agent": "storyboard", "text": "read 3 messages", "ms": 1_001_590})
    view.message(message(1_001_640, "storyboard", "panel 2"))

    # when: the transcript catches up
    view.flush()

    # then: time order, each line stamped with when it happened
    text = buf.getvalue()
    assert text.index("read 3 messages") < text.index("[panel 1]") < text.index("[panel 2]")
    assert stamps(text) == [1.59, 1.61, 1.64]


def test_transcript_places_an_event_after_the_entries_sent_in_its_millisecond() -> None:
    # given: a fast machine, where the storyboard sends panels 1 to 3 and is refused panel 4
    # inside one millisecond of the Redis clock; its join came in the millisecond of its
    # first send, which it preceded
    buf = io.StringIO()
    view = Transcript(Console(file=buf, width=200, highlight=False), t0_ms=1_000_000)
    for seq, subject in enumerate(("panel 1", "panel 2", "panel 3")):
        view.message(message(1_001_500, "storyboard", subject, seq))
    refused: dict[str, object] = {"agent": "storyboard", "to": "director", "subject": "panel 4"}
    refused |= {"code": "rate_limited", "error": "limit 3", "ms": 1_001_500}
    view.event({"event": "refused", **refused, "after": "1001500-2"})
    view.message(message(1_000_100, "writer", "script v1"))
    view.event({"event": "joined", "agent": "writer", "host": "b", "ms": 1_000_100, "after": "0-0"})

    # when: the transcript catches up
    view.flush()

    # then: each event sits where it happened among the entries, and the stamps still rise
    text = buf.getvalue()
    order = ["joined from b", "[script v1]", "[panel 1]", "[panel 2]", "[panel 3]", "[panel 4]"]
    positions = [text.index(line) for line in order]
    assert positions == sorted(positions), text
    assert stamps(text) == sorted(stamps(text))


def test_transcript_holds_back_only_what_may_still_be_overtaken() -> None:
    buf = io.StringIO()
    view = Transcript(Console(file=buf, width=200, highlight=False), t0_ms=1_000_000)
    view.message(message(1_001_000, "writer", "script v1"))
    view.message(message(1_002_000, "writer", "script v2"))

    view.flush(upto_ms=1_001_500)

    assert "[script v1]" in buf.getvalue() and "[script v2]" not in buf.getvalue()
    view.flush()
    assert "[script v2]" in buf.getvalue()


# -- Ctrl-C in the demo -----------------------------------------------------------------------


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.mark.parametrize("whom", ["the terminal's process group", "the demo's process alone"])
def test_ctrl_c_ends_the_demo_within_a_second_and_leaves_nothing_running(whom: str) -> None:
    if binary("redis7") is None:
        missing("no redis-server on PATH")
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads /proc to find the demo's processes")
    # given: the demo under way, its director blocked in a wait (the writer is drafting)
    proc = subprocess.Popen(
        [BIN, "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(None),
        start_new_session=True,  # its own process group, as a shell gives a foreground job
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "[kickoff]" in line:
                break
        port = int(re.findall(r"redis://127\.0\.0\.1:(\d+)", "".join(lines))[0])
        spawned = children(proc.pid)
        assert len(spawned) >= 4, spawned  # three workers and the redis-server

        # when: Ctrl-C
        started = time.monotonic()
        if whom == "the demo's process alone":
            proc.send_signal(signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - started

        # then: gone within about a second, with 130 and one line, and so is all it started
        assert proc.returncode == 130, err
        assert took < 1.5, f"{took:.1f} s"
        assert "Traceback" not in out + err
        assert [x for x in err.splitlines() if x.strip()] == ["redisbus: interrupted"]
        deadline = time.monotonic() + 5
        while any(running(p) for p in spawned) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in spawned if running(p)] == []
        assert not answers(port)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# -- install instructions and metadata --------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_the_hermes_readme_installs_from_a_checkout_or_a_wheel_not_from_pypi() -> None:
    readme = (ROOT / "redisbus/integrations/hermes/README.md").read_text()

    commands = re.findall(r"^pip install .*$", readme, re.MULTILINE)
    assert commands
    assert not [c for c in commands if re.match(r"pip install '?redisbus\b", c)], commands
    assert "pip install . hermes-agent" in readme and "dist/redisbus-" in readme


def test_the_package_names_its_documentation_where_mkdocs_publishes_it() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    site = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)

    assert site is not None
    assert site.group(1).startswith(project["urls"]["Documentation"].rstrip("/") + "/")
