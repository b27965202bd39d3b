"""deploy/redis/users.acl on real Redis servers (7.x and 6.2): the agent user runs the bus
and nothing else, the exporter user only reads, the default user is off."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy_support import REDIS_DIR, redis_binaries, run_redis
from tests.support.prometheus_fixture import require_tool


@pytest.fixture(params=redis_binaries() or ["missing"], ids=lambda b: Path(b).parent.name)
def acl_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A real Redis started with the rendered users.acl; yields ports and passwords."""
    binary = request.param
    if binary == "missing":
        require_tool("redis-server")
    passwords = {"agent": secrets.token_hex(8), "exporter": secrets.token_hex(8)}
    acl = tmp_path / "users.acl"
    env = {
        **os.environ,
        "REDISBUS_AGENT_PASSWORD": passwords["agent"],
        "REDISBUS_EXPORTER_PASSWORD": passwords["exporter"],
    }
    subprocess.run(
        ["sh", str(REDIS_DIR / "render-acl.sh"), str(REDIS_DIR / "users.acl"), str(acl)],
        env=env,
        check=True,
        timeout=30,
    )
    with run_redis(binary, tmp_path, "--aclfile", str(acl)) as port:
        yield {"port": port, "passwords": passwords}


def connect(server: dict[str, Any], user: str | None) -> Any:
    import redis

    password = server["passwords"].get(user) if user else None
    return redis.Redis(port=server["port"], username=user, password=password, decode_responses=True)


def test_render_acl_refuses_without_passwords(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    result = subprocess.run(
        ["sh", str(REDIS_DIR / "render-acl.sh"), str(REDIS_DIR / "users.acl"), str(tmp_path / "a")],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0
    assert not (tmp_path / "a").exists()


def test_agent_user_runs_the_bus_commands_on_bus_keys_only(acl_redis: dict[str, Any]) -> None:
    import redis

    agent = connect(acl_redis, "agent")
    stream = "rb:{team}:s"
    entry = agent.xadd(stream, {"body": "hi"})
    agent.xgroup_create(stream, "writer", id="0")
    assert agent.xreadgroup("writer", "host-a/1", {stream: ">"}, count=1)
    assert agent.xack(stream, "writer", entry) == 1
    agent.hset("rb:{team}:meta", "routing", "open")
    agent.sadd("rb:channels", "team")
    script = "return redis.call('HINCRBY', KEYS[1], ARGV[1], 1)"
    assert agent.eval(script, 1, "rb:{team}:inbox", "writer") == 1
    assert agent.time() and agent.info("memory")["maxmemory_policy"]

    denied: Callable[[], object]
    for denied in (
        lambda: agent.get("other:key"),
        lambda: agent.config_get("maxmemory-policy"),
        lambda: agent.flushall(),
        lambda: agent.keys("*"),
        lambda: agent.eval("return redis.call('SET', KEYS[1], 'x')", 1, "elsewhere"),
    ):
        with pytest.raises(redis.exceptions.ResponseError):
            denied()


def test_exporter_user_reads_but_cannot_write(acl_redis: dict[str, Any]) -> None:
    import redis

    connect(acl_redis, "agent").xadd("rb:{team}:s", {"body": "hi"})
    exporter = connect(acl_redis, "exporter")
    assert exporter.xlen("rb:{team}:s") == 1
    assert exporter.xinfo_stream("rb:{team}:s")["length"] == 1
    assert exporter.smembers("rb:channels") == set()
    # scripts run with the caller's permissions: reading works, writing from Lua does not
    count = exporter.register_script("return redis.call('XLEN', KEYS[1])")
    assert count(keys=["rb:{team}:s"]) == 1
    forge = exporter.register_script("return redis.call('XADD', KEYS[1], '*', 'body', 'x')")
    denied: Callable[[], object]
    for denied in (
        lambda: exporter.xadd("rb:{team}:s", {"body": "forged"}),
        lambda: exporter.hset("rb:{team}:st", "writer", "failed"),
        lambda: forge(keys=["rb:{team}:s"]),
    ):
        with pytest.raises(redis.exceptions.ResponseError):
            denied()


def test_the_bus_runs_under_the_agent_user(acl_redis: dict[str, Any]) -> None:
    from redisbus import Bus

    password = acl_redis["passwords"]["agent"]
    bus = Bus.from_url(f"redis://agent:{password}@127.0.0.1:{acl_redis['port']}/0")
    try:
        ch = bus.channel("team", routing="open")
        director = ch.join("director")
        writer = ch.join("writer", parent="director")
        receipt = director.send("writer", "Script draft v1 ready", subject="draft")
        got = writer.wait(timeout=5)
        assert got.kind == "message"
        assert [m.body for m in got.messages] == ["Script draft v1 ready"]
        writer.mark_done(got.messages[0].id)
        assert receipt.id is not None
        after = director.receipt(receipt.id)  # Receipt(s): one per recipient
        assert [r.status for r in (after if isinstance(after, list) else [after])] == ["done"]
        assert {m.name for m in ch.tree()} == {"director", "writer"}
    finally:
        bus.close()


def test_the_janitor_keeps_the_hashes_tables_under_the_agent_user(
    acl_redis: dict[str, Any],
) -> None:
    # given: a channel of 20 under the agent user whose inbox depths were written back as a
    # list (what a restart's reload makes of join's table: a hash that fits a list)
    from redisbus import Bus

    agent = connect(acl_redis, "agent")
    password = acl_redis["passwords"]["agent"]
    bus = Bus.from_url(f"redis://agent:{password}@127.0.0.1:{acl_redis['port']}/0")
    try:
        ch = bus.channel("big", routing="open")
        for i in range(20):
            ch.join(f"a{i}")
        depths = agent.hgetall(ch.keys.inbox)
        agent.delete(ch.keys.inbox)
        agent.hset(ch.keys.inbox, mapping=depths)
        assert agent.object("encoding", ch.keys.inbox) in ("listpack", "ziplist")
        # when: the janitor passes, as the agent user (OBJECT ENCODING is the agent's too)
        ch.sweep()
        # then: a table again, the same depths
        assert agent.object("encoding", ch.keys.inbox) == "hashtable"
        assert agent.hgetall(ch.keys.inbox) == depths
    finally:
        bus.close()


def test_default_user_is_off(acl_redis: dict[str, Any]) -> None:
    # A raw socket: redis-py would retry the refused handshake with backoff.
    with socket.create_connection(("127.0.0.1", acl_redis["port"]), timeout=5) as s:
        s.sendall(b"PING\r\n")
        reply = s.recv(200)
    assert reply.startswith(b"-NOAUTH"), reply
