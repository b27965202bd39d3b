"""Every key a script touches is one its call passed in KEYS: no script builds a key name.

Checked from outside, on a real server: MONITOR records each script call (with its KEYS) and
then every command the script ran; ``COMMAND GETKEYS`` says which arguments of each are keys.
The workload walks every script and every way a message is addressed (a name, a list, an agent
id, "parent", a broadcast, a batch), an outcome's cascade, a dead letter given back, and the
doorbells they ring."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redisbus import Bus, BusSettings, Receipt
from redisbus import _bindings as bind
from tests.support.servers import Server

_TOKEN = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|.)")
_SIMPLE = {b"n": b"\n", b"r": b"\r", b"t": b"\t", b"a": b"\a", b"b": b"\b"}


def _unquote(raw: bytes) -> bytes:
    """MONITOR's quoted argument back to its bytes (sdscatrepr's escapes)."""

    def one(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        if e[:1] == b"x" and len(e) == 3:
            return bytes([int(e[1:], 16)])
        return _SIMPLE.get(e, e)

    return _ESCAPE.sub(one, raw)


class Monitor:
    """MONITOR on its own connection, every line kept (the source, the arguments)."""

    def __init__(self, url: str) -> None:
        self.lines: list[tuple[str, list[bytes]]] = []
        self._client = redis.Redis.from_url(url)  # (its pool holds the connection open)
        self._monitor = self._client.monitor()
        self._monitor.__enter__()  # MONITOR sent, its OK read
        self._conn: Any = self._monitor.connection
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while True:
            try:
                line = self._conn.read_response()
            except Exception:  # closed
                return
            line = line if isinstance(line, bytes) else str(line).encode()
            head, _, rest = line.partition(b"] ")
            source = head.rpartition(b" ")[2].decode()
            self.lines.append((source, [_unquote(t) for t in _TOKEN.findall(rest)]))

    def caught_up(self, client: redis.Redis) -> int:
        """How many lines there are once every command sent before this call is among them
        (MONITOR lines arrive on their own thread, behind the commands)."""
        marker = f"caught-up-{len(self.lines)}-{time.monotonic_ns()}".encode()
        client.echo(marker)
        deadline = time.monotonic() + 10
        while not any(marker in args for _, args in self.lines[-50:]):
            assert time.monotonic() < deadline, "MONITOR fell 10 s behind"
            time.sleep(0.005)
        return len(self.lines)

    def close(self) -> None:
        self._conn.disconnect()
        self._client.close()


@pytest.fixture
def monitored(redis7: Server) -> Iterator[tuple[Bus, Monitor, redis.Redis]]:
    plain = redis.Redis.from_url(redis7.url)
    mon = Monitor(redis7.url)
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    try:
        yield bus, mon, plain
    finally:
        bus.close()
        mon.close()


def _workload(bus: Bus, url: str) -> None:
    """Every script, every way of addressing a message, and the rings of each."""
    ch = bus.channel("dk", routing="family", lease_s=0.1, max_deliveries=2)
    boss = ch.join("boss")
    worker = ch.join("worker", parent="boss")
    helper = ch.join("helper", parent="worker")
    ch.join("deep", parent="helper")
    peer = ch.join("peer", parent="boss")
    worker.send("boss", "a name")
    boss.send(["worker", "peer"], "a list")
    boss.send(worker.id, "an agent id")
    helper.send("parent", "parent")
    boss.send("all", "a broadcast")
    boss.send_many([("worker", "one of a batch"), ("all", "a broadcast in a batch")])
    for agent in (boss, worker, helper, peer):
        got = agent.wait(timeout=1)
        agent.read()
        agent.list()
        for m in got.messages:
            agent.mark_done(m.id)
    sent = boss.send("peer", "receipt")
    assert isinstance(sent, Receipt)
    boss.receipt(sent)
    # a cancellation cascades: worker, helper, deep cancelled, one control message wakes them
    boss.cancel("worker", "stop")
    peer.complete("done")
    # a dead letter, given back: two replicas that take a message and never finish it
    late = ch.join("late", parent="boss")
    r = boss.send("late", "poison")
    other = Bus.from_url(url, settings=BusSettings(metrics=False, replica="b"))
    try:
        w_a = ch.join("late", replica="a")
        w_b = other.channel("dk").join("late", replica="b")
        assert w_a.wait(timeout=1).messages[0].id == r.id
        time.sleep(0.15)
        assert w_b.wait(timeout=1).messages
        time.sleep(0.15)
        w_a._last_claim = float("-inf")
        w_a.wait(timeout=0.3)
        (dead,) = ch.dead_letters()
        ch.replay(dead.id)
        assert late.wait(timeout=1).messages
    finally:
        other.close()
    ch.sweep()
    ch.leave(late)
    ch.remove("deep", force=True)
    ch.delete(force=True)


def _scripts(lines: list[tuple[str, list[bytes]]]) -> Iterator[tuple[str, list[bytes], Any]]:
    """(script, KEYS, the commands it ran) for every FCALL/EVALSHA in ``lines``: a script's
    commands follow its call in MONITOR, from the source "lua"."""
    call: tuple[str, list[bytes], list[list[bytes]]] | None = None
    for source, args in lines:
        if source == "lua":
            if call is not None:
                call[2].append(args)
            continue
        if call is not None:
            yield call
            call = None
        verb = args[0].upper() if args else b""
        if verb in (b"FCALL", b"FCALL_RO", b"EVALSHA", b"EVAL"):
            n = int(args[2])
            call = (args[1].decode(), args[3 : 3 + n], [])
    if call is not None:
        yield call


def test_every_key_a_script_touches_was_passed_in_keys(
    monitored: tuple[Bus, Monitor, redis.Redis], redis7: Server
) -> None:
    bus, mon, plain = monitored
    _workload(bus, redis7.url)
    time.sleep(0.3)  # the last lines reach the monitor
    seen: dict[str, int] = {}
    undeclared: list[str] = []
    # a call names its script by its function ("rb_<digest>_send") or, by EVALSHA, its SHA
    by_sha = {sha: name for name, sha in bus._io.sha.items()}
    for script, keys, commands in _scripts(list(mon.lines)):
        name = by_sha.get(script, script.rpartition("_")[2])
        seen[name] = seen.get(name, 0) + 1
        declared = set(keys)
        for cmd in commands:
            try:
                touched = plain.command_getkeys(*cmd)
            except redis.ResponseError:  # no key arguments (TIME, ...)
                continue
            for key in touched:
                key = key.encode() if isinstance(key, str) else key
                if key not in declared:
                    undeclared.append(f"{name}: {cmd[0].decode()} {key!r}")
    # every script that reads or writes channel data ran, and none touched an undeclared key
    assert {"send", "wake", "settle", "done", "outcome", "replay", "claim", "join"} <= set(seen), (
        seen
    )
    assert not undeclared, "\n".join(sorted(set(undeclared)))


def _send_keys(bus: Bus, mon: Monitor, since: int) -> list[list[bytes]]:
    """The KEYS of every send.lua call (by FCALL, or by EVALSHA) MONITOR saw after its first
    ``since`` lines."""
    time.sleep(0.3)  # the last lines reach the monitor
    by_sha = {sha: name for name, sha in bus._io.sha.items()}
    return [
        keys
        for script, keys, _ in _scripts(mon.lines[since:])
        if by_sha.get(script, script.rpartition("_")[2]) == "send"
    ]


def test_a_broadcast_is_given_the_doorbells_of_the_members_it_reaches_not_every_members(
    monitored: tuple[Bus, Monitor, redis.Redis],
) -> None:
    # given: a family of 1 + 10 + 100 (no siblings: a grandchild reaches its parent only), and
    # an open channel of four where one member has left
    bus, mon, plain = monitored
    fam = bus.channel("dk-reach", routing="family", sender_rate_burst=0, pair_rate_burst=0)
    fam.join("root")
    agents = {}
    for i in range(10):
        agents[f"c{i}"] = fam.join(f"c{i}", parent="root")
        for j in range(10):
            agents[f"g{i}.{j}"] = fam.join(f"g{i}.{j}", parent=f"c{i}")
    leaf, mid = agents["g3.4"], agents["c3"]
    # when: a grandchild broadcasts twice, and a child twice
    since = mon.caught_up(plain)
    assert [r.to for r in leaf.send("all", "one")] == ["c3"]
    assert [r.to for r in leaf.send("all", "two")] == ["c3"]
    assert len(mid.send("all", "one")) == 11
    assert len(mid.send("all", "two")) == 11
    # then: the second of each is given the doorbells of those it reaches (a pair each)
    mon.caught_up(plain)
    calls = _send_keys(bus, mon, since)
    fixed = bind.SEND_FIXED
    assert len(calls) == 4, [len(k) for k in calls]
    assert len(calls[1]) == fixed + 2 and calls[1][fixed] == fam.keys.bell("c3").encode()
    assert len(calls[3]) == fixed + 2 * 11
    # and the first ones, given every member this bus met, asked for nothing (a superset)
    assert len(calls[0]) == len(calls[2]) == fixed + 2 * 111

    # given: an open channel where a member leaves after a broadcast
    ch = bus.channel("dk-left", routing="open", sender_rate_burst=0, pair_rate_burst=0)
    a, _, c = (ch.join(n) for n in ("a", "b", "c"))
    a.send("all", "first")
    ch.remove("c", force=True)
    since = mon.caught_up(plain)
    # when: the sender broadcasts twice more
    assert [r.to for r in a.send("all", "second")] == ["b"]
    assert [r.to for r in a.send("all", "third")] == ["b"]
    # then: the second still gave the member that left (its last broadcast reached it), the
    # third no longer does
    mon.caught_up(plain)
    calls = _send_keys(bus, mon, since)
    assert [len(k) for k in calls] == [fixed + 4, fixed + 2], calls
