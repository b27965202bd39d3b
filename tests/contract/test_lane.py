"""The sync client's script lane: one held connection for the hot path, which must behave
exactly like the pool it bypasses when connections die, threads compete, or processes fork."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from typing import Any

import pytest
import redis

from redisbus import AsyncBus, Bus, BusConnectionError, BusSettings, InvalidInput
from redisbus.testing import memory_bus
from tests.support.servers import Server, start_server, wait_for

OPEN: dict[str, Any] = {
    "routing": "open",
    "pair_rate_burst": 0,
    "sender_rate_burst": 0,
    "inbox_cap": 100_000,
}


TABLE = "\n#table"  # keep_table's field (_prelude.lua): marks and idem stay hash tables


def lane_of(bus: Bus) -> Any:
    lane = bus._io.transport.lane
    assert lane is not None, "a plain redis:// Bus has a lane"
    return lane


def test_sends_use_one_held_connection(redis7: Server) -> None:
    # given: a Bus and its agents
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-held", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        r = redis.Redis(port=redis7.port)
        # when: many sends go out one after the other
        a.send("b", "warm up")
        conn = lane_of(bus).conn
        before = r.info("stats")["total_connections_received"]
        for i in range(200):
            a.send("b", f"m{i}")
        # then: they all went through the same connection, and arrived
        assert lane_of(bus).conn is conn
        assert r.info("stats")["total_connections_received"] == before
        assert len(b.read(limit=500)) == 201


def test_a_killed_connection_is_replaced_before_the_next_send(redis7: Server) -> None:
    # given: a Bus whose lane connection the server has closed
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-killed", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "first")
        killer = redis.Redis(port=redis7.port)
        before = killer.info("stats")["total_connections_received"]
        for _ in range(3):
            killer.client_kill_filter(_type="normal", skipme=True)
            # when: the next send (not retried: no idempotency key) goes out
            a.send("b", "after the kill")
        # then: it found the dead socket each time, connected afresh, and nothing failed
        assert killer.info("stats")["total_connections_received"] - before >= 3
        assert [m.body for m in b.read(limit=10)] == ["first"] + ["after the kill"] * 3


def test_a_stalled_server_times_out_on_the_lane_and_the_next_send_reconnects(
    redis7: Server,
) -> None:
    # given: a Bus with a short socket timeout, whose lane is open
    settings = BusSettings(socket_timeout_s=0.3, retry_attempts=0)
    with Bus.from_url(redis7.url, settings=settings) as bus:
        ch = bus.channel("lane-stalled", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "first")
        # when: the server stops answering for longer than the timeout
        redis.Redis(port=redis7.port).execute_command("CLIENT", "PAUSE", 1500, "ALL")
        started = time.monotonic()
        with pytest.raises(BusConnectionError):
            a.send("b", "stalled")
        # then: the send gave up after about the timeout, not after the pause
        assert time.monotonic() - started < 1.2
        # and once the server answers again, the next send goes out on a fresh connection
        time.sleep(1.5)
        a.send("b", "after")
        bodies = [m.body for m in b.read(limit=10)]
        assert bodies[0] == "first" and bodies[-1] == "after"


def test_error_replies_on_the_lane_keep_its_connection(redis7: Server) -> None:
    # given: a Bus whose lane is open, and a server that forgot every script
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-noscript", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "first")
        conn = lane_of(bus).conn
        redis.Redis(port=redis7.port).script_flush()
        # when: the next send meets NOSCRIPT on the lane
        a.send("b", "second")
        # then: it was told apart (reloaded and sent once), on the same connection
        assert lane_of(bus).conn is conn
        assert [m.body for m in b.read(limit=10)] == ["first", "second"]


def test_threads_share_the_lane_and_the_pool(redis7: Server) -> None:
    # given: one Bus used by eight threads at once
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-threads", **OPEN)
        b = ch.join("b")
        senders = [ch.join(f"s{i}") for i in range(8)]
        errors: list[BaseException] = []

        def run(agent: Any) -> None:
            try:
                for i in range(150):
                    agent.send("b", f"{agent.name}-{i}")
            except BaseException as e:  # recorded and asserted empty
                errors.append(e)

        threads = [threading.Thread(target=run, args=(s,)) for s in senders]
        # when: they all send as fast as they can
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        # then: every message arrived exactly once
        assert not errors, errors[:3]
        got = [m.body for m in b.read(limit=2000)]
        assert sorted(got) == sorted(f"s{i}-{j}" for i in range(8) for j in range(150))


def test_wait_has_a_lane_of_its_own_and_survives_a_kill(redis7: Server) -> None:
    # given: an agent waiting in another thread on the same Bus
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-wait", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "warm up")
        assert [m.body for m in b.wait(timeout=1).messages] == ["warm up"]
        got: list[Any] = []
        waiter = threading.Thread(target=lambda: got.append(b.wait(timeout=5)))
        waiter.start()
        time.sleep(0.2)  # blocked in XREADGROUP on the fetch lane
        # when: this thread sends meanwhile
        send_conn = lane_of(bus).conn
        r = a.send("b", "while you wait")
        waiter.join(5)
        # then: the send went through the scripts' lane, not blocked behind the wait
        assert lane_of(bus).conn is send_conn
        assert [m.body for m in got[0].messages] == ["while you wait"]
        assert got[0].messages[0].id == r.id
        # and when the server drops every connection, the next wait reconnects by itself
        redis.Redis(port=redis7.port).client_kill_filter(_type="normal", skipme=True)
        a.send("b", "after the kill")
        assert [m.body for m in b.wait(timeout=2).messages] == ["after the kill"]


def test_a_forked_child_opens_its_own_connection(redis7: Server) -> None:
    # given: a Bus whose lane holds a connection in the parent
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel("lane-fork", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "parent before")
        parent_conn = lane_of(bus).conn
        # when: a forked child sends through the same Bus object
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            code = 1
            try:
                a.send("b", "child")
                code = 0 if lane_of(bus).conn is not parent_conn else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        a.send("b", "parent after")
        # then: the child used a connection of its own; the parent's still works
        assert os.waitstatus_to_exitcode(status) == 0
        assert lane_of(bus).conn is parent_conn
        assert [m.body for m in b.read(limit=10)] == ["parent before", "child", "parent after"]


def test_a_test_double_has_no_lane() -> None:
    with memory_bus() as bus:
        assert bus._io.transport.lane is None
        ch = bus.channel("lane-memory", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        a.send("b", "through the pool")
        assert [m.body for m in b.read()] == ["through the pool"]


# -- the async face -----------------------------------------------------------------------------


async def test_async_sends_share_one_held_connection(redis7: Server) -> None:
    # given: an AsyncBus; when: many sequential and concurrent sends go out
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-held", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        senders = [await ch.join(f"s{i}") for i in range(20)]
        await a.send("b", "warm up")
        r = redis.Redis(port=redis7.port)
        before = r.info("stats")["total_connections_received"]
        for i in range(100):
            await a.send("b", f"seq{i}")
        await asyncio.gather(*(s.send("b", f"{s.name}") for s in senders))
        # then: no new connection was needed, and every message arrived once
        assert r.info("stats")["total_connections_received"] == before
        got = [m.body for m in await b.read(limit=500)]
        assert sorted(got) == sorted(
            ["warm up"] + [f"seq{i}" for i in range(100)] + [f"s{i}" for i in range(20)]
        )


async def test_async_killed_connection_is_replaced_before_the_next_batch(redis7: Server) -> None:
    # given: an AsyncBus whose lane connection the server has closed
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-killed", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        await a.send("b", "first")
        killer = redis.Redis(port=redis7.port)
        for _ in range(3):
            killer.client_kill_filter(_type="normal", skipme=True)
            await asyncio.sleep(0.05)  # the loop sees the EOF, as it would between sends
            # when: the next send (not retried: no idempotency key) goes out
            await a.send("b", "after the kill")
        # then: nothing failed and nothing was lost
        assert [m.body for m in await b.read(limit=10)] == ["first"] + ["after the kill"] * 3


async def test_async_cancelled_send_leaves_the_lane_in_step(redis7: Server) -> None:
    # given: a send in flight while the server is paused
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-cancel", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        await a.send("b", "first")
        redis.Redis(port=redis7.port).execute_command("CLIENT", "PAUSE", "300", "ALL")
        task = asyncio.ensure_future(a.send("b", "cancelled mid-flight"))
        await asyncio.sleep(0.1)
        # when: the sender gives up on it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # then: the next send gets its own reply, not the cancelled one's (which may or may
        # not have been appended: its connection was dropped with the reply unread)
        r = await a.send("b", "after")
        assert r.status == "queued"
        entries = await b.read(limit=10)
        bodies = [m.body for m in entries]
        assert bodies[0] == "first" and bodies[-1] == "after", bodies
        assert set(bodies[1:-1]) <= {"cancelled mid-flight"}
        assert entries[-1].id == r.id


async def test_async_lane_cancelled_mid_batch_drops_its_connection(redis7: Server) -> None:
    # given: the lane itself waiting for replies while the server is paused
    async with AsyncBus.from_url(redis7.url) as bus:
        lane = bus._io.transport.lane
        assert lane is not None
        assert await lane.run([("SET", "alane-k", "1")]) == ["OK"]
        redis.Redis(port=redis7.port).execute_command("CLIENT", "PAUSE", "300", "ALL")
        task = asyncio.ensure_future(lane.run([("INCR", "alane-k")]))
        await asyncio.sleep(0.1)
        # when: the batch is cancelled before its reply came
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # then: the connection is gone (its late reply would answer the next batch), and
        # the next batch reads its own replies (the INCR ran, or died with its connection)
        assert lane.conn is None
        got, pong = await lane.run([("GET", "alane-k"), ("PING",)])
        assert got in ("1", "2") and pong == "PONG"


async def test_async_cancelled_lone_send_does_not_take_queued_sends_with_it(
    redis7: Server,
) -> None:
    # given: a lone send in flight while the server is paused, and three sends queued behind it
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-lone", **OPEN)
        b = await ch.join("b")
        a, c = await ch.join("a"), await ch.join("c")
        await a.send("b", "first")
        redis.Redis(port=redis7.port).execute_command("CLIENT", "PAUSE", "300", "ALL")
        lone = asyncio.ensure_future(a.send("b", "lone"))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(c.send("b", f"queued-{i}")) for i in range(3)]
        await asyncio.sleep(0.05)
        # when: the lone send is cancelled
        lone.cancel()
        # then: the queued sends still go out, each with its own receipt
        receipts = await asyncio.wait_for(asyncio.gather(*queued), 5)
        assert [r.status for r in receipts] == ["queued"] * 3
        with pytest.raises(asyncio.CancelledError):
            await lone
        bodies = [m.body for m in await b.read(limit=10)]
        assert bodies[0] == "first" and bodies[-3:] == ["queued-0", "queued-1", "queued-2"]
        assert {m.id for m in await b.read(filter_by="all", limit=10)} >= {r.id for r in receipts}


def _script_calls(r: redis.Redis) -> list[list[str]]:
    """The script calls (FCALL, EVALSHA) the server logged since the last SLOWLOG RESET,
    oldest first, each as its words."""
    out = []
    for entry in reversed(r.slowlog_get(10_000)):
        cmd = [c.decode() if isinstance(c, bytes) else str(c) for c in entry["command"].split()]
        if cmd[0].upper() in ("EVALSHA", "FCALL"):
            out.append(cmd)
    return out


def _scripts_run(r: redis.Redis, sha: dict[str, str]) -> list[str]:
    """The script calls the server logged since the last SLOWLOG RESET (oldest first), by
    name, with the settle op each settle call starts with."""
    names = {v: k for k, v in sha.items()}
    out = []
    for cmd in _script_calls(r):
        name = names.get(cmd[1], cmd[1])
        out.append(f"settle {cmd[3 + int(cmd[2]) + 1]}" if name == "settle" else name)
    return out


@pytest.fixture
def logged(tmp_path: Any) -> Any:
    """A private Redis that logs every command in its slow log (Redis's: it names a script's
    own commands by the client "?:0", which Valkey does not, so these counts are read on
    Redis whatever REDISBUS_TEST_SERVER says)."""
    from tests.support.servers import start_server

    srv = start_server("redis-path", tmp_path, ["--slowlog-log-slower-than", "0"])
    yield srv
    srv.stop()


WAKE_UP = ["settle s", "wake", "done"]  # "waiting" before the pop, the hand-out after, done
#: what a wait that blocks sends, in one trip: the "waiting" status, the blocking pop of the
#: agent's wakeup list, wake.lua (whose reply carries the entries and the Redis clock: no TIME
#: of its own)
WAIT_TRIP = ["SCRIPT", "BLPOP", "SCRIPT"]  # SCRIPT: a script call, FCALL or EVALSHA
#: what a wait that finds its message rung already runs: wake.lua alone, then the done
RUNG_UP = ["wake", "done"]


def _calls(names: list[str]) -> list[str]:
    """``names`` with each script call (FCALL, EVALSHA) written SCRIPT."""
    return ["SCRIPT" if n in ("FCALL", "EVALSHA") else n for n in names]


def _past_one_cycle(ch: Any) -> tuple[Any, Any]:
    """Members a and b of ``ch``, b through two wait() / mark_done() cycles (past the first
    wait's look at its group and its own pending entries, and a first wake-up, which loads
    the scripts), so its next wait is a plain wake-up."""
    a, b = ch.join("a"), ch.join("b")
    for _ in range(2):
        a.send("b", "warm up")
        b.mark_done(b.wait(timeout=1).messages)
    for name in WAIT_SCRIPTS:  # (by EVALSHA: a wait that blocks loads settle.lua first)
        ch.bus._io.load(name)
    return a, b


#: the scripts a wait and its mark_done may call, loaded before anything is counted
WAIT_SCRIPTS = ("settle", "wake", "claim", "done")


def _blocked(r: redis.Redis, wait: Any) -> tuple[threading.Thread, list[Any]]:
    """``wait()`` run in a thread, returned once its blocking pop is in the server (its
    first, non-blocking look found nothing): the thread and where its messages go."""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.extend(wait().messages))
    t.start()
    _until_blocked(r)
    return t, got


def _until_blocked(r: redis.Redis) -> None:
    deadline = time.monotonic() + 5
    while not [c for c in r.client_list() if c["cmd"] == "blpop"]:
        assert time.monotonic() < deadline, "the wait never blocked"
        time.sleep(0.005)


def _sent(r: redis.Redis) -> list[str]:
    """The commands clients sent since the last SLOWLOG RESET (oldest first), by name: not
    those scripts ran (logged with no client address)."""
    out = []
    for entry in reversed(r.slowlog_get(1000)):
        name = entry["command"].split()[0].decode().upper()
        if entry.get("client_address") not in (b"?:0", "?:0") and name not in (
            "SLOWLOG",
            "CLIENT",
        ):
            out.append(name)
    return out


def test_a_wake_up_and_its_mark_done_run_three_scripts(logged: Server) -> None:
    # given: a receiver that has been through one wait() / mark_done() cycle, blocked in the
    # next wait
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-cycle", **OPEN))
        r.slowlog_reset()
        t, got = _blocked(r, lambda: b.wait(timeout=2))
        # when: a message comes, and it marks it done
        a.send("b", "hello")
        t.join(5)
        # (b's look that found nothing, its "waiting" status and pop in one trip, the send,
        # then wake.lua, logged once the pop returned)
        assert _calls(_sent(r)) == ["SCRIPT", "SCRIPT", "SCRIPT", "BLPOP", "SCRIPT"]
        b.mark_done(got)
        # then: the fetch's own ops marked it read and set the agent running, so nothing was
        # left for mark_done to write first (no second settle call re-marking the same entry)
        assert [m.body for m in got] == ["hello"]
        assert _scripts_run(r, bus._io.sha) == ["wake", *WAKE_UP[:1], "send", *WAKE_UP[1:]]
        assert b.receipt(got[0])[0].status == "done"


def test_a_wait_that_finds_its_message_rung_runs_one_script_then_the_done(logged: Server) -> None:
    # given: a receiver through its first cycles, and a message rung for it while it was busy
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-rung", **OPEN))
        a.send("b", "hello")
        r.slowlog_reset()
        # when: it waits, and marks the message done
        got = b.wait(timeout=1).messages
        assert _calls(_sent(r)) == ["SCRIPT"]  # one trip, one script: no status, no pop
        b.mark_done(got)
        # then: it was handed over, read, and done
        assert [m.body for m in got] == ["hello"]
        assert _scripts_run(r, bus._io.sha) == RUNG_UP
        assert b.receipt(got[0])[0].status == "done"
        assert r.hget(b._keys.status, "b") == "running"


#: what wake.lua runs on the server for one message addressed to the agent: the clock, the pop
#: of its bell's ids, the read mark of the one id, written if it had none (had it one, it was
#: handed out before: the look and the write are one command), the claim of the entry into
#: the replica's pending list (which returns it and moves the group's cursor past it), and
#: the status "waiting" -> "running". It is in the wake-up's path (the read's reply leaves the
#: server after it), so growing it slows every wake-up.
WAKE_OP = ["TIME", "LPOP", "HSETNX", "XCLAIM", "HGET", "HSET"]
#: the same for a message found rung without blocking: the wakeup the bell's ids rang goes
#: (no pop took it), and the agent, running, stays so (no status written)
RUNG_OP = ["TIME", "LPOP", "DEL", "HSETNX", "XCLAIM", "HGET"]
#: what done.lua runs for one message the agent read: the clock, its read mark, the
#: acknowledgement (whose reply says it was pending: no XPENDING), the inbox count, the mark
DONE_OP = ["TIME", "HGET", "XACK", "HINCRBY", "HSET"]


def _ran(r: redis.Redis) -> list[str]:
    """Every command logged since the last SLOWLOG RESET (oldest first), by name, those a
    script ran prefixed "lua:"."""
    out = []
    for entry in reversed(r.slowlog_get(1000)):
        name = entry["command"].split()[0].decode().upper()
        inner = entry.get("client_address") in (b"?:0", "?:0")
        if name not in ("SLOWLOG", "CLIENT"):
            out.append(f"lua:{name}" if inner else name)
    return out


def test_a_wake_up_runs_six_server_commands_and_its_done_five(logged: Server) -> None:
    # given: a receiver through its first cycles, blocked in wait()
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-wake", **OPEN))
        t, got = _blocked(r, lambda: b.wait(timeout=2))
        r.slowlog_reset()
        # when: a message comes
        a.send("b", "hello")
        t.join(5)
        ran = _ran(r)
        # then: after the send, wake.lua ran exactly these commands, and the message was read
        # on the server before wait() returned
        assert [m.body for m in got] == ["hello"]
        read = ran.index("BLPOP")  # (logged once it returned: after the send)
        assert _calls(ran[read + 1 :]) == [f"lua:{c}" for c in WAKE_OP] + ["SCRIPT"]
        receipt = b.receipt(got[0])[0]
        assert receipt.status == "read"
        # and with signing off it was not handed the replay check's two keys (wake.lua reads
        # them only with signing on): stream, inbox, marks, status, bell, wakeup
        sha = bus._io.sha["wake"]
        wake = [
            e["command"].split()
            for e in r.slowlog_get(1000)
            if e["command"].split()[1:2] == [sha.encode()]
        ]
        assert wake and all(cmd[2] == b"6" for cmd in wake)
        # and its mark_done runs these, and says it was delivered when it was read
        r.slowlog_reset()
        assert b.mark_done(got)
        assert _calls(_ran(r)) == [f"lua:{c}" for c in DONE_OP] + ["SCRIPT"]
        done = b.receipt(got[0])[0]
        assert done.status == "done"
        assert done.read_at == receipt.read_at and done.delivered_at == done.read_at
        assert done.read_at <= done.done_at


@pytest.mark.parametrize("others", [1, 30])
@pytest.mark.parametrize("waited", [False, True], ids=["busy", "waited"])
def test_a_wake_up_never_sees_others_entries(logged: Server, others: int, waited: bool) -> None:
    # given: a channel where `others` messages between two other members came in ahead of
    # the one for b, while b was busy (its next wait looks first) or waited in vain (its
    # look found nothing, so its next waits block on the wakeup at once)
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel(f"lane-others-{others}-{waited}", **OPEN)
        a, b = _past_one_cycle(ch)
        c = ch.join("c")
        if waited:  # (b waits on its own wakeup: others' sends never wake it)
            assert b.wait(timeout=0.2).kind == "timeout"
        for i in range(others):
            a.send("c", f"not for b {i}")
        a.send("b", "hello")
        r.slowlog_reset()
        # when: b waits
        got = b.wait(timeout=1).messages
        ran = _ran(r)
        # then: it ran the commands of one message whatever the others' number: its group
        # never read, held or acknowledged an entry of theirs
        assert [m.body for m in got] == ["hello"]
        if waited:  # the pop took the wakeup at once; wake.lua ran after it
            assert _calls(ran[ran.index("BLPOP") + 1 :]) == [f"lua:{c}" for c in WAKE_OP] + [
                "SCRIPT"
            ]
        else:  # one script, no pop
            assert _calls(ran) == [f"lua:{c}" for c in RUNG_OP] + ["SCRIPT"]  # (logged once run)
        assert r.xpending(b._keys.stream, "b")["pending"] == 1
        assert b.receipt(got[0])[0].status == "read"
        # and c still has all of its messages
        assert len(c.read()) == others


def _looks(r: redis.Redis, sha: dict[str, str]) -> list[bool]:
    """For each wake.lua call logged since the last SLOWLOG RESET (oldest first): whether it
    was a look (its last argument "0": no pop of the wakeup list went before it)."""
    return [cmd[-1] == "0" for cmd in _script_calls(r) if cmd[1] == sha["wake"]]


def test_an_agent_quicker_than_its_senders_looks_once_in_four_waits(logged: Server) -> None:
    # given: b through its first cycles (its waits look first: what was rung while it was
    # busy comes in one script)
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-backoff", **OPEN))
        r.config_set("slowlog-max-len", 10_000)
        r.slowlog_reset()
        # when: eight waits in a row find nothing
        for _ in range(8):
            assert b.wait(timeout=0.05).kind == "timeout"
        # then: the first looked in vain, the next three blocked at once, the fifth looked
        # again, and so on: one empty look in four waits, each wait one pop and the wake.lua
        # after it (a pop that times out is not in the slow log)
        looks = _looks(r, bus._io.sha)
        assert looks.count(True) == 2 and looks.count(False) == 8, looks
        # and when messages come while it is busy again, the wait that looks finds them, and
        # it looks first again from then on: each wait is one script, no pop
        a.send("b", "one")
        assert [m.body for m in b.wait(timeout=1).messages] == ["one"]
        r.slowlog_reset()
        for body in ("two", "three"):
            a.send("b", body)
            assert [m.body for m in b.wait(timeout=1).messages] == [body]
        assert _looks(r, bus._io.sha) == [True, True]
        assert "BLPOP" not in _ran(r)


def test_a_bell_naming_anothers_entry_hands_nothing_over(logged: Server) -> None:
    # given: b's bell rung by a raw write with an entry for c, a duplicate and no id at all
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("lane-wrong-bell", **OPEN)
        a, b = _past_one_cycle(ch)
        c = ch.join("c")
        for_c = a.send("c", "for c").id
        bell = b._keys.bell("b")
        r.rpush(bell, for_c, for_c, "99999999999999999999-1", "zz")
        r.rpush(b._keys.wakeup("b"), "")
        # when: b waits
        res = b.wait(timeout=0.5)
        # then: nothing is handed to b, its bell is empty, and c's message is still c's
        assert res.kind == "timeout"
        assert r.llen(bell) == 0
        assert r.xpending(b._keys.stream, "b")["pending"] == 0
        # and b has no mark for it (the read mark written before the claim was taken back)
        assert r.hget(b._keys.marks, f"{for_c}\nb") is None
        assert [m.body for m in c.wait(timeout=1).messages] == ["for c"]


def test_a_bell_naming_a_deleted_entry_leaves_no_read_mark(logged: Server) -> None:
    # given: a message rung for b, then deleted from the stream by a raw write
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-deleted", **OPEN))
        gone = a.send("b", "gone").id
        assert r.xdel(b._keys.stream, gone) == 1
        # when: b waits
        res = b.wait(timeout=0.3)
        # then: nothing is handed over, nothing is pending, and no mark says b read it
        assert res.kind == "timeout"
        assert r.xpending(b._keys.stream, "b")["pending"] == 0
        assert r.hget(b._keys.marks, f"{gone}\nb") is None
        # and b's next message comes through
        a.send("b", "next")
        assert [m.body for m in b.wait(timeout=1).messages] == ["next"]


async def test_async_wake_up_and_its_mark_done_run_three_scripts(logged: Server) -> None:
    r = logged.client()
    async with AsyncBus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = await bus.channel("alane-cycle", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        for _ in range(2):  # (the first wait looks at its group; the first wake-up loads)
            await a.send("b", "warm up")
            await b.mark_done((await b.wait(timeout=1)).messages)
        for name in WAIT_SCRIPTS:  # (by EVALSHA: a wait that blocks loads settle.lua first)
            await bus._io.load(name)
        # a message rung while b was busy: one script
        await a.send("b", "hello")
        r.slowlog_reset()
        got = (await b.wait(timeout=1)).messages
        assert _calls(_sent(r)) == ["SCRIPT"]
        await b.mark_done(got)
        assert [m.body for m in got] == ["hello"]
        assert _scripts_run(r, bus._io.sha) == RUNG_UP
        assert (await b.receipt(got[0]))[0].status == "done"
        # a message that comes while b is blocked: the "waiting" status, the pop, wake.lua
        r.slowlog_reset()
        waiting = asyncio.create_task(b.wait(timeout=2))
        await asyncio.to_thread(_until_blocked, r)
        await a.send("b", "again")
        got = (await waiting).messages
        await b.mark_done(got)
        assert [m.body for m in got] == ["again"]
        ran = _scripts_run(r, bus._io.sha)
        assert ran[:2] == ["wake", "settle s"] and ran[2:] == ["send", "wake", "done"], ran
        assert (await b.receipt(got[0]))[0].status == "done"


# -- the async face's fetch lanes ---------------------------------------------------------------


async def test_async_wait_fetches_on_lanes_of_its_own(redis7: Server) -> None:
    # given: an AsyncBus whose pool counts the connections it hands out
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-wait", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        for _ in range(2):  # (the first wait looks at its group; the first wake-up loads)
            await a.send("b", "warm up")
            await b.mark_done((await b.wait(timeout=1)).messages)
        for name in WAIT_SCRIPTS:  # (by EVALSHA: a wait that blocks loads settle.lua first)
            await bus._io.load(name)
        pool = bus._io.r.connection_pool
        checkouts = 0
        real = pool.get_connection

        async def counted(*args: Any, **kw: Any) -> Any:
            nonlocal checkouts
            checkouts += 1
            return await real(*args, **kw)

        pool.get_connection = counted
        lane, idle = bus._io.transport.lane, bus._io.transport.idle
        assert lane is not None and idle is not None
        send_conn = lane.conn
        # when: it waits again and again, the message sent while it blocks, and marks each done
        got = []
        for i in range(20):
            waiting = asyncio.ensure_future(b.wait(timeout=2))
            await asyncio.sleep(0.01)
            await a.send("b", f"m{i}")
            msgs = (await waiting).messages
            assert await b.mark_done(msgs)
            got += [m.body for m in msgs]
        # then: every wake-up and mark_done came on the fetch lane it held (no connection from
        # the pool), beside the sends' lane, and returned each message once
        assert got == [f"m{i}" for i in range(20)]
        assert checkouts == 0
        assert lane.conn is send_conn
        assert len(idle) == 1
        assert (await b.receipt(msgs[0]))[0].status == "done"


async def test_async_concurrent_waits_keep_a_few_idle_lanes(redis7: Server) -> None:
    from redisbus._transport_async import FETCH_LANES

    # given: more agents waiting at once than the bus keeps idle fetch lanes
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-many", **OPEN)
        a = await ch.join("a")
        agents = [await ch.join(f"w{i}") for i in range(FETCH_LANES * 3)]
        waits = [asyncio.ensure_future(w.wait(timeout=5)) for w in agents]
        await asyncio.sleep(0.2)
        # when: each gets a message
        for w in agents:
            await a.send(w.name, f"to {w.name}")
        results = await asyncio.gather(*waits)
        # then: each woke with its own, and only FETCH_LANES lanes (connections) stay held
        assert [[m.body for m in r.messages] for r in results] == [[f"to {w.name}"] for w in agents]
        assert bus._io.transport.idle is not None
        assert len(bus._io.transport.idle) == FETCH_LANES
        # and the connections of the others went back to the pool, open, for the next waits
        r = redis.Redis(port=redis7.port)
        before = r.info("stats")["total_connections_received"]
        waits = [asyncio.ensure_future(w.wait(timeout=5)) for w in agents]
        await asyncio.sleep(0.2)
        for w in agents:
            await a.send(w.name, "again")
        results = await asyncio.gather(*waits)
        assert [[m.body for m in r.messages] for r in results] == [["again"]] * len(agents)
        assert r.info("stats")["total_connections_received"] == before


async def test_async_cancelled_and_killed_waits_leave_the_next_in_step(redis7: Server) -> None:
    # given: an agent blocked in wait() on its fetch lane
    async with AsyncBus.from_url(redis7.url) as bus:
        ch = await bus.channel("alane-wait-cancel", **OPEN)
        a, b = await ch.join("a"), await ch.join("b")
        await a.send("b", "warm up")  # past the first wait's look at its pending entries
        await b.mark_done((await b.wait(timeout=1)).messages)
        waiting = asyncio.ensure_future(b.wait(timeout=5))
        await asyncio.sleep(0.2)
        # when: the wait is cancelled mid-read, then a message comes
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await a.send("b", "after the cancel")
        # then: the next wait gets it (the cancelled read's connection was dropped, not reused
        # with its reply still due)
        assert [m.body for m in (await b.wait(timeout=2)).messages] == ["after the cancel"]
        # and when the server drops every connection, the next wait reconnects by itself
        redis.Redis(port=redis7.port).client_kill_filter(_type="normal", skipme=True)
        await asyncio.sleep(0.05)
        await a.send("b", "after the kill")
        assert [m.body for m in (await b.wait(timeout=2)).messages] == ["after the kill"]


def test_mark_done_of_a_read_entry_no_longer_pending_changes_nothing(logged: Server) -> None:
    # given: b read a message, then a raw write acknowledged it behind the bus's back, and
    # another's read mark lost its time
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        a, b = _past_one_cycle(bus.channel("lane-done-acked", **OPEN))
        first = a.send("b", "one").id
        second = a.send("b", "two").id
        got = b.wait(timeout=1).messages
        assert [m.id for m in got] == [first, second]
        assert r.xack(b._keys.stream, "b", first) == 1
        r.hset(b._keys.marks, f"{second}\nb", "R")
        before = (r.hgetall(b._keys.inbox), r.hgetall(b._keys.marks))
        # when: b marks the first done
        with pytest.raises(InvalidInput):
            b.mark_done(first)
        # then: refused, and nothing changed (the acknowledgement was the check)
        assert (r.hgetall(b._keys.inbox), r.hgetall(b._keys.marks)) == before
        # and the second, whose mark has no time, is done at the clock's time
        assert b.mark_done(second)
        done = str(r.hget(b._keys.marks, f"{second}\nb"))
        at = done[1:].split(":")[0]
        assert done == f"D{at}:{at}:{at}:ok"


#: what view.lua runs for a read() of one new message while the agent holds two it read and
#: has not marked done: the clock, the fetch of the new entry into the group and its mark
#: (a rewound group's finished entry is skipped), its id off the bell (the bell, read whole,
#: is empty after: its wakeup goes without a look), the group's pending entries, all their
#: marks in one command (not one each), the unread one's fields, its claim (its pending entry
#: and hand-out count come from the page, not looked up again; never handed out, it needs no
#: max_deliveries) and its read mark
READ_OP = ["TIME", "XREADGROUP", "HGET", "LRANGE", "LTRIM", "DEL", "XPENDING", "HMGET"]
READ_OP += ["XRANGE", "XCLAIM", "HSET"]


@pytest.mark.parametrize("held", [0, 2, 30])
def test_a_read_of_one_new_message_runs_the_same_commands_whatever_the_agent_holds(
    logged: Server, held: int
) -> None:
    # given: b holds `held` messages it read and has not marked done, and one more comes
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel(f"lane-read-{held}", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        for i in range(held):
            a.send("b", f"held {i}")
        assert len(b.read()) == held
        bus._io.load("view")
        new = a.send("b", "new").id
        assert new is not None
        r.slowlog_reset()
        # when: b reads its unread messages
        got = b.read()
        # then: the new one, read, with these commands
        assert [m.id for m in got] == [new]
        assert _calls(_ran(r)) == [f"lua:{c}" for c in READ_OP] + ["SCRIPT"]
        assert b.receipt(new)[0].status == "read"
        assert r.llen(b._keys.bell("b")) == 0 and not r.exists(b._keys.wakeup("b"))


def _script_commands(r: redis.Redis) -> list[list[str]]:
    """The commands scripts ran since the last SLOWLOG RESET (oldest first), each split."""
    return [
        [str(x.decode() if isinstance(x, bytes) else x) for x in e["command"].split()]
        for e in reversed(r.slowlog_get(1000))
        if e.get("client_address") in (b"?:0", "?:0")
    ]


def test_a_list_of_the_newest_reads_about_as_many_entries_and_their_marks_at_once(
    logged: Server,
) -> None:
    # given: a board of 300 messages, every other one to b, some of them read
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("lane-list", **{**OPEN, "inbox_cap": 10_000})
        a, b = ch.join("a"), ch.join("b")
        ch.join("c")
        for i in range(300):
            a.send("b" if i % 2 else "c", f"m{i}")
        assert len(b.read(limit=140)) == 140
        bus._io.load("view")
        r.slowlog_reset()
        # when: b lists the newest 20
        got = b.list(limit=20)
        ran = _script_commands(r)
        # then: the newest 20, oldest first, b's own with their read flags
        assert [m.body for m in got] == [f"m{i}" for i in range(280, 300)]
        assert [m.read for m in got if "b" in m.to] == [False] * 10
        # read with one batch of 20 entries (not 200) and one look at b's ten marks
        assert [cmd[0].upper() for cmd in ran] == ["TIME", "XREVRANGE", "HMGET"]
        assert ran[1][-2:] == ["COUNT", "20"]
        assert len(ran[2]) == 2 + 2 * 10  # (the key, then each field "ID\nb", split in two)
        # and a list that filters most entries out walks on in growing batches
        r.slowlog_reset()
        to_c = b.list(filter_by="to:c", limit=100)
        sizes = [int(cmd[-1]) for cmd in _script_commands(r) if cmd[0].upper() == "XREVRANGE"]
        assert [m.body for m in to_c] == [f"m{i}" for i in range(100, 300, 2)]
        assert sizes == [100, 200]


def _encodings(r: redis.Redis, ch: Any, *names: str) -> tuple[str, ...]:
    """How Redis keeps the channel's hashes ``names`` (the marks and idempotency keys)."""
    return tuple(r.object("encoding", getattr(ch.keys, n)) for n in names or ("marks", "idem"))


def test_receipt_marks_and_idempotency_keys_are_hash_tables_and_stay_so_over_a_restart(
    tmp_path: Any,
) -> None:
    # given: a server with persistence, a channel of two, five messages sent with
    # idempotency keys, read and marked done (five marks, five keys: Redis keeps hashes that
    # small as lists, where every field a command names is a scan of them all)
    srv = start_server("redis7", tmp_path, persistent=True)
    try:
        r = srv.client()
        with Bus.from_url(srv.url) as bus:
            ch = bus.channel("lane-tables", **OPEN)
            a, b = ch.join("a"), ch.join("b")
            for i in range(18):  # (past 16 members: join makes inbox and status tables)
                ch.join(f"c{i}")
            for i in range(5):
                a.send("b", f"m{i}", idempotency_key=f"k{i}")
            got = b.read(limit=10)
            b.mark_done(got)
            # then: both are hash tables, holding the messages' fields and keep_table's
            assert _encodings(r, ch) == ("hashtable", "hashtable")
            assert sorted(r.hkeys(ch.keys.marks)) == sorted([TABLE, *(f"{m.id}\nb" for m in got)])
            assert sorted(r.hkeys(ch.keys.idem)) == sorted([TABLE, *(f"a\nk{i}" for i in range(5))])
            # and what reads them is not misled: the receipts say done, the inbox is empty
            assert {str(x.status) for m in got for x in a.receipt(m.id)} == {"done"}
            assert set(ch.counts().values()) == {0} and not ch.repair()
            assert _encodings(r, ch, "inbox", "status") == ("hashtable", "hashtable")
        # when: the server rewrites its AOF (an RDB base) and restarts from it
        r.bgrewriteaof()
        assert wait_for(lambda: r.info("persistence")["aof_rewrite_in_progress"] == 0, 30)
        r.close()
        srv.restart()
        r = srv.client()
        # then: the reloaded hashes are tables still (a list-sized hash without the long
        # value would come back a list)
        assert _encodings(r, ch) == ("hashtable", "hashtable")
        assert r.hlen(ch.keys.marks) == 6
        # while join's tables of the inbox depths and statuses come back lists, until the
        # janitor's next pass makes them tables again, their fields as they were
        assert _encodings(r, ch, "inbox", "status") == ("listpack", "listpack")
        before = (r.hgetall(ch.keys.inbox), r.hgetall(ch.keys.status))
        with Bus.from_url(srv.url) as bus:
            bus.channel("lane-tables").sweep()
        assert _encodings(r, ch, "inbox", "status") == ("hashtable", "hashtable")
        assert (r.hgetall(ch.keys.inbox), r.hgetall(ch.keys.status)) == before
    finally:
        srv.stop()


@pytest.mark.parametrize("by", ["join", "sweep"])
def test_a_join_or_a_sweep_makes_an_older_channels_receipt_marks_a_hash_table(
    redis7: Server, by: str
) -> None:
    # given: a channel whose marks and keys an older version wrote (lists: no long field)
    r = redis7.client()
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel(f"lane-tables-old-{by}", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        m = a.send("b", "x", idempotency_key="k")
        assert [x.id for x in b.read(limit=10)] == [m.id]  # read, not done: the sweep keeps it
        r.delete(ch.keys.marks, ch.keys.idem)
        r.hset(ch.keys.marks, f"{m.id}\nb", "R1")
        r.hset(ch.keys.idem, "a\nk", f"{m.id}\tb")
        assert _encodings(r, ch) == ("listpack", "listpack")
        # when: an agent joins again (one more replica, as every process start does), or
        # the janitor passes (with nothing to trim: the message is b's latest)
        if by == "join":
            ch.join("b")
        else:
            assert ch.sweep().trimmed == 0
        # then: both are tables, their fields kept
        assert _encodings(r, ch) == ("hashtable", "hashtable")
        assert r.hget(ch.keys.marks, f"{m.id}\nb") == "R1"
        assert a.send("b", "x", idempotency_key="k").id == m.id  # the key still replays


def _script_argc(r: redis.Redis) -> list[tuple[str, str, int]]:
    """The commands scripts ran since the last SLOWLOG RESET (oldest first) as (name, first
    key, how many arguments it had: the slow log keeps 32, the last saying how many more)."""
    out = []
    for e in reversed(r.execute_command("SLOWLOG", "GET", 1000)):
        argv, client = e[3], e[4]
        if client not in (b"?:0", "?:0"):
            continue
        argv = [a.decode() if isinstance(a, bytes) else str(a) for a in argv]
        more = re.fullmatch(r"\.\.\. \((\d+) more arguments\)", argv[-1])
        n = len(argv) - 1 + int(more.group(1)) if more else len(argv)
        out.append((argv[0].upper(), argv[1] if len(argv) > 1 else "", n))
    return out


def test_a_sweep_reads_and_deletes_a_batch_of_receipt_marks_at_once(logged: Server) -> None:
    # given: 100 messages b marked done, each with an idempotency key, then one b holds
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("lane-sweep", **OPEN)
        a, b = ch.join("a"), ch.join("b")
        for i in range(100):
            a.send("b", f"m{i}", idempotency_key=f"k{i}")
        b.mark_done(b.read(limit=100))
        held = a.send("b", "held").id
        assert [m.id for m in b.read()] == [held]
        bus._io.load("sweep")
        r.slowlog_reset()
        # when: the janitor sweeps the channel
        report = ch.sweep()
        ran = _script_argc(r)
        # then: the 100 are trimmed, their marks and keys gone, the held one kept
        assert (report.trimmed, report.expired_undone) == (100, 0)
        assert [e[0] for e in r.xrange(ch.keys.stream) or ()] == [held]
        assert sorted(r.hkeys(ch.keys.marks)) == [TABLE, f"{held}\nb"]
        assert r.hkeys(ch.keys.idem) == [TABLE]
        assert not r.exists(ch.keys.nonces)  # (no signing: no replay record, not even the field)
        # walked in batches of 16, 32 and 64 (stopping at the held one), each batch's marks
        # read in one command, whether b is a member looked up once, the marks and the keys
        # of the 100 deleted in one command each; the idempotency keys, emptied (keep_table's
        # field alone left), made anew (renew_table), the marks, holding one, left as they are
        keys = (ch.keys.marks, ch.keys.idem, ch.keys.inbox)
        trim = [c for c in ran if c[0] == "XRANGE" or (c[0] != "XTRIM" and c[1] in keys)]
        trim = [c for c in trim if not (c[0] == "XRANGE" and c[2] == 4)]  # (dead letters' look)
        assert trim == [
            ("HSETNX", ch.keys.marks, 4),  # keep_table's field: there, nothing written
            ("HSETNX", ch.keys.idem, 4),
            ("XRANGE", ch.keys.stream, 6),
            ("HMGET", ch.keys.marks, 2 + 16),
            ("XRANGE", ch.keys.stream, 6),
            ("HMGET", ch.keys.marks, 2 + 32),
            ("XRANGE", ch.keys.stream, 6),
            ("HMGET", ch.keys.marks, 2 + 53),
            ("HEXISTS", ch.keys.inbox, 3),
            ("HDEL", ch.keys.marks, 2 + 100),
            ("HDEL", ch.keys.idem, 2 + 100),
            ("HLEN", ch.keys.marks, 2),
            ("HLEN", ch.keys.idem, 2),
            ("HEXISTS", ch.keys.idem, 3),
            ("DEL", ch.keys.idem, 2),
            ("HSETNX", ch.keys.idem, 4),
            ("HLEN", ch.keys.inbox, 2),  # two members: their inbox and status hashes are lists
        ]


def test_a_heartbeat_runs_the_same_few_commands_whatever_the_channel_holds(
    logged: Server,
) -> None:
    # given: a channel of ten agents, one that went silent (lost), one long gone (its field
    # goes), and a heartbeat that renews the ten and shows one of them idle
    from redisbus import _bindings as bind

    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("lane-beat", **OPEN)
        agents = [ch.join(f"a{i}") for i in range(10)]
        ch.join("silent")
        r.hdel(ch.keys.beat, *[f for f in r.hkeys(ch.keys.beat) if str(f).startswith("silent\n")])
        lease_ms = 60_000
        now = int(r.time()[0]) * 1000
        r.hset(ch.keys.beat, mapping={"silent\nr": now - 1, "old\nr": now - 3 * lease_ms})
        r.hset(ch.keys.beat, "a3\n" + agents[3].replica, now - 1)  # (renewed now)
        triples: list[str] = []
        for a in agents:
            triples += [a.name, a.replica, "idle" if a.name == "a1" else ""]
        triples += ["a9", "second-replica", ""]
        bus._io.load("beat")
        r.slowlog_reset()
        # when: the heartbeat runs
        lost, mine = bind.beaten(bus._io.script(*bind.beat(ch.keys, lease_ms, 1000, triples)))
        ran = _script_argc(r)
        # then: the silent agent is lost, every named agent renewed (a9 with two replicas), a1
        # idle, the long-gone field dropped
        assert lost == ["silent"]
        live = {mine[i]: (mine[i + 1], mine[i + 2]) for i in range(0, len(mine), 3)}
        assert live["a1"][0] == "idle" and live["a9"][1] == 2
        assert all(live[f"a{i}"][1] == (2 if i == 9 else 1) for i in range(10))
        assert r.hget(ch.keys.status, "a1") == "idle"
        assert not r.hexists(ch.keys.beat, "old\nr")
        assert int(str(r.hget(ch.keys.beat, "a3\n" + agents[3].replica))) >= now + lease_ms
        # with these commands: one read of each hash, one write of each, the drop
        assert [(c[0], c[1]) for c in ran] == [
            ("TIME", ""),
            ("HGETALL", ch.keys.beat),
            ("HMGET", ch.keys.status),
            ("HSET", ch.keys.beat),
            ("HSET", ch.keys.status),
            ("HDEL", ch.keys.beat),
        ]
        # and a plain beat (no status to change, nothing to drop): four commands
        r.slowlog_reset()
        again = [x if i % 3 != 2 else "" for i, x in enumerate(triples)]
        bus._io.script(*bind.beat(ch.keys, lease_ms, 1000, again))
        assert [c[0] for c in _script_argc(r)] == ["TIME", "HGETALL", "HMGET", "HSET"]


def test_a_sweep_past_a_thousand_marks_reads_and_deletes_them_a_thousand_at_a_time(
    logged: Server,
) -> None:
    # given: 500 broadcasts to 7 members, every member done with every one (3,500 marks)
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("lane-sweep-all", **OPEN)
        a = ch.join("a")
        members = [ch.join(f"m{i}") for i in range(7)]
        for i in range(500):
            a.send("all", f"b{i}")
        for m in members:
            while got := m.read(limit=100):
                m.mark_done(got)
        assert r.hlen(ch.keys.marks) == 3_500 + 1  # and keep_table's field
        bus._io.load("sweep")
        r.slowlog_reset()
        # when: the janitor sweeps
        report = ch.sweep()
        ran = _script_argc(r)
        # then: all 500 go with their 3,500 marks, read and deleted 1,000 fields a command
        assert report.trimmed == 500 and r.xlen(ch.keys.stream) == 0
        assert r.hkeys(ch.keys.marks) == [TABLE]
        looks = [n - 2 for c, k, n in ran if c == "HMGET" and k == ch.keys.marks]
        drops = [n - 2 for c, k, n in ran if c == "HDEL" and k == ch.keys.marks]
        # (batches of 16 to 128 entries, then 200 in two commands, then the last 60)
        assert looks == [16 * 7, 32 * 7, 64 * 7, 128 * 7, 1000, 400, 60 * 7]
        assert drops == [1000, 1000, 1000, 500]


@pytest.mark.parametrize("waited", [False, True], ids=["busy", "waited"])
def test_a_wake_up_expires_a_rung_message_whose_ttl_passed_on_the_server(
    logged: Server, waited: bool
) -> None:
    # given: a message with a short ttl rung for b, while b was busy or blocked in wait()
    r = logged.client()
    with Bus.from_url(logged.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel(f"lane-ttl-{waited}", **OPEN)
        a, b = _past_one_cycle(ch)
        if waited:  # (its next waits block on the wakeup at once)
            assert b.wait(timeout=0.2).kind == "timeout"
        sent = a.send("b", "soon stale", ttl_s=0.05)
        time.sleep(0.15)
        r.slowlog_reset()
        # when: b waits
        got = b.wait(timeout=0.2)
        # then: the wake-up handed nothing over and marked the entry expired on the server:
        # acknowledged, counted out of b's inbox, its receipt says so (no flush, no read),
        # with no expiry left for the client to settle ("x" op)
        assert got.kind == "timeout"
        settles = [c for c in _script_calls(r) if c[1] == bus._io.sha["settle"]]
        assert not any("x" in c[3 + int(c[2]) :] for c in settles), settles
        assert str(r.hget(b._keys.marks, f"{sent.id}\nb")).startswith("X")
        assert r.xpending(b._keys.stream, "b")["pending"] == 0
        assert int(r.hget(b._keys.inbox, "b") or 0) == 0
        assert a.receipt(sent.id)[0].status == "expired"
