"""What a newcomer meets first (docs/reference/cli.md): every failure is the documented exit status
and a RedisbusError, and a private Redis never outlives the process that started it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from redisbus import AsyncBus, Bus, InvalidInput, RedisbusError
from redisbus.embedded import free_port
from tests.support.servers import binary, missing

BIN = shutil.which("redisbus", path=str(Path(sys.executable).parent)) or "redisbus"


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    env["COLUMNS"] = "200"
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout, env=env)


def closed_port() -> int:
    return free_port()  # nothing listens on it once the probe socket is closed


def test_doctor_against_an_unreachable_redis_exits_3_like_every_command() -> None:
    url = f"redis://127.0.0.1:{closed_port()}/0"
    doctor = run("doctor", "--url", url)
    stats = run("stats", "--url", url)
    assert stats.returncode == 3
    assert doctor.returncode == 3, doctor.stderr
    assert "unreachable" in doctor.stderr
    assert "unexpected error" not in doctor.stderr
    assert len(doctor.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["redis://::::", "redis://host:99999/0", "rediss://[::1"])
def test_a_malformed_url_is_a_redisbus_error_on_both_faces(url: str) -> None:
    for face in (Bus.from_url, AsyncBus.from_url):
        with pytest.raises(RedisbusError) as got:
            face(url)
        assert isinstance(got.value, InvalidInput)


def test_send_with_a_malformed_url_is_bad_input_exit_2() -> None:
    got = run("send", "--url", "redis://::::", "ch", "--as", "a", "b", "hi")
    assert got.returncode == 2, got.stderr
    assert "unexpected error" not in got.stderr
    assert "malformed Redis URL" in got.stderr


def test_console_with_a_port_out_of_range_is_bad_input_before_any_banner() -> None:
    got = run("console", "--url", "redis://127.0.0.1:1/0", "--port", "-1")
    assert got.returncode == 2, got.stderr
    assert "--port" in got.stderr
    assert "console on http" not in got.stderr


def test_console_on_a_port_in_use_says_so_and_exits_1_before_any_banner() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        got = run("console", "--url", "redis://127.0.0.1:1/0", "--port", str(port))
    assert got.returncode == 1, got.stderr
    assert "in use" in got.stderr
    assert "console on http" not in got.stderr


LEAK = """
import os, threading
from redisbus import Bus
box = {}
# asked for from a thread that then ends: the server must outlive the thread, not the process
t = threading.Thread(target=lambda: box.update(bus=Bus.embedded()))
t.start(); t.join()
bus = box["bus"]
assert bus.ping()
print(bus._owned.process.pid, bus._owned.port, flush=True)
os.kill(os.getpid(), 9)
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has died; only its reaper is missing


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def test_a_sigkilled_owner_takes_its_embedded_redis_with_it() -> None:
    if binary("redis7") is None:
        missing("no redis-server on PATH")
    if not Path("/proc/self/stat").exists():
        pytest.skip("reads /proc to see the server's state")
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    got = subprocess.run(
        [sys.executable, "-c", LEAK], capture_output=True, text=True, timeout=60, env=env
    )
    assert got.returncode == -9, got.stderr
    pid, port = (int(x) for x in got.stdout.split())
    try:
        deadline = time.monotonic() + 10
        while (_running(pid) or _answers(port)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _answers(port), "the embedded redis-server outlived its owner"
        assert not _running(pid)
    finally:
        if _running(pid):
            os.kill(pid, 9)


def test_a_lone_surrogate_is_said_to_be_invalid_utf8() -> None:
    from redisbus._validate import body

    with pytest.raises(InvalidInput, match="not valid UTF-8"):
        body("half a pair: \ud800")
