"""``python -m bench.instructions``: the server's instructions per script call, counted.

On a shared machine a script's server µs move by a third between runs, more than most changes
to it. The number of instructions the server runs for it does not: this runs ``redis-server``
under valgrind's callgrind (``--hz 1``, so its timers add next to nothing), replays one real
call of each script below 1,000 times in pipelines, and prints the instructions per call
(valgrind's ``Ir``, the call's share of reading the pipeline included). The counts are
repeatable to about 0.5%; instructions are not time (a cache miss costs more than an add), but
a change that runs fewer of them on the same path is cheaper.

- ``send``: one ``send()`` to one member (the straight path of ``send.lua``), every limit on;
- ``batch``: ``send_many`` of 100 such messages, per message;
- ``broadcast``: ``send("all", ...)`` to the 100 other members (``send.lua``'s general routine);
- ``wake, empty bell``: wake.lua on a bell with nothing in it (what a quiet wait costs);
- ``wake, one message``: wake.lua handing over the one message its bell names (a send and
  that wake replayed in pairs, the send's count taken off);
- ``mark_done, one message``: done.lua of one message read (one call per message the pairs
  left pending): with ``send`` and the wake above, a message's whole life, call by call;
- ``heartbeat, channel of 10``: beat.lua renewing the ten agents of a channel (what a
  channel's heartbeat costs every ``heartbeat_s``);
- ``sweep, per entry trimmed``: one janitor pass (sweep.lua) trimming 999 entries every
  recipient is done with, per entry.
- ``message life, 400 marks held``: ``send()``, ``wait()`` and ``mark_done`` of one message,
  through the API, on a channel whose receipt marks already hold 400 fields (a hash Redis
  would keep as a list, a scan per mark, were it not kept a table: ``keep_table``).

``--fleet`` counts instead the whole message of the scale figure's fleet (send, ``wait()``,
``mark_done``, channels of 10 agents) on one server and on Clusters of 1 and 3 shards, every
primary under callgrind, summed over them: what a message costs the servers, with the idle
work of the same span taken out; and beside it, on one server counted the same way, the raw
Streams life of the same walk (``XADD`` to the recipient's stream, ``XREADGROUP`` of it,
``XACK``: one stream and one group per agent), the baseline of the ≤ 4x target.

``--design`` counts a message's life (send, read, acknowledgement, a round trip each) four
ways: raw Streams on one stream that grows as a channel's does, raw Streams on 300 streams of a
few entries (``--fleet``'s baseline's shape), the smallest design that keeps the bus's features
(``bench/design_floor.lua``, a yardstick, not redisbus) and redisbus, with the server commands
each runs per life.

``--against DIR`` counts the same calls with the ``redisbus`` package found in DIR (an older
checkout, say) in the same run, for a before/after table. Needs ``valgrind`` and
``redis-server`` on PATH (Debian: ``apt-get install valgrind redis-server``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

CALLS = 1_000
BATCH = 100
LIVES = 100
HIGH = 1_000_000_000
LIMITS: dict[str, Any] = {
    "routing": "open",
    "inbox_cap": HIGH,
    "pair_rate_burst": HIGH,
    "pair_rate_per_s": HIGH,
    "sender_rate_burst": HIGH,
    "sender_rate_per_s": HIGH,
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _server(
    out: str, port: int | None = None, extra: tuple[str, ...] = ()
) -> Iterator[tuple[int, int]]:
    """redis-server under callgrind, collecting only between -z and -d: (port, pid).

    Raises if the server does not answer within 60 s, or if what answers on ``port`` is not
    this process (another test's server took the port first)."""
    import redis

    port = port or _port()
    proc = subprocess.Popen(
        [
            *("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"),
            *("redis-server", "--port", str(port), "--save", "", "--appendonly", "no"),
            *("--hz", "1", *extra),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        r = redis.Redis(port=port, socket_timeout=60)
        try:
            for _ in range(600):
                if proc.poll() is not None:
                    raise RuntimeError(f"redis-server on port {port} exited ({proc.returncode})")
                with contextlib.suppress(redis.ConnectionError):
                    pid = int(r.info("server")["process_id"])
                    if pid != proc.pid:
                        raise RuntimeError(f"port {port} is served by another process ({pid})")
                    break
                time.sleep(0.1)
            else:
                raise RuntimeError(f"redis-server under callgrind on port {port}: no answer")
        finally:
            r.close()
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(30)


def _count_all(
    pids: list[int], out: str, dumps: dict[int, int], run: Callable[[], Any]
) -> list[float]:
    """Instructions of ``run()`` on each server of ``pids`` (zeroed together, dumped together);
    ``dumps`` numbers each server's dumps."""
    for pid in pids:
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    run()
    counts = []
    for pid in pids:
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
        dumps[pid] = dumps.get(pid, 0) + 1
        path = f"{out}.{pid}.{dumps[pid]}"
        for _ in range(300):
            if os.path.exists(path):
                m = re.search(r"^totals: (\d+)", Path(path).read_text(), re.M)
                if m:
                    counts.append(float(m.group(1)))
                    break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"callgrind wrote no dump {path}")
    return counts


def _captured(fn: Callable[[], Any]) -> tuple[Any, ...]:
    """The command ``fn()`` sent on the sync face's lane (its first, for a pipeline)."""
    return _pipelined(fn)[0]


def _pipelined(fn: Callable[[], Any]) -> list[tuple[Any, ...]]:
    """The commands of the last round trip ``fn()`` sent on a sync lane."""
    from redisbus._transport_sync import Lane

    seen: list[list[tuple[Any, ...]]] = []
    run = Lane.run

    def recorded(self: Any, commands: list[tuple[Any, ...]]) -> Any:
        seen.append(list(commands))
        return run(self, commands)

    Lane.run = recorded  # type: ignore[method-assign]
    try:
        fn()
    finally:
        Lane.run = run  # type: ignore[method-assign]
    return seen[-1]


def worker() -> dict[str, float]:
    """Count each call, in this process's ``redisbus``."""
    import redis

    from redisbus import Bus
    from redisbus import _bindings as bind

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cg = os.path.join(tmp, "cg")
        with _server(cg) as (port, pid):
            r = redis.Redis(port=port, decode_responses=True)
            bus = Bus.from_url(f"redis://127.0.0.1:{port}/0")
            ch = bus.channel("bench-ir", **LIMITS)
            alice, bob = ch.join("alice"), ch.join("bob")
            crowd = bus.channel("bench-ir-all", **LIMITS)
            caller = crowd.join("caller")
            for i in range(BATCH):
                crowd.join(f"m{i:03d}")
            for _ in range(50):
                alice.send("bob", "x" * 64, subject="s")
            send = _captured(lambda: alice.send("bob", "x" * 64, subject="s"))
            batch = _captured(lambda: alice.send_many([("bob", "x" * 64)] * BATCH))
            for _ in range(5):
                caller.send("all", "x" * 64, subject="s")
            cast = _captured(lambda: caller.send("all", "x" * 64, subject="s"))
            # bob's wake.lua on an empty bell (its fetch's last command), replayed
            for _ in range(2):
                alice.send("bob", "y", subject="s")
                bob.mark_done(bob.wait(5).messages)
            wake = _pipelined(lambda: bob.wait(0))[-1]
            keys = bob._keys
            dumps: dict[int, int] = {}
            for name, cmd, per in (
                ("send", send, 1),
                ("batch, per message", batch, BATCH),
                ("broadcast to 100", cast, 1),
                ("wake, empty bell", wake, 1),
            ):
                calls = CALLS if per == 1 else CALLS // BATCH
                if name.startswith("broadcast"):
                    calls = CALLS // 10

                def replay(cmd: tuple[Any, ...] = cmd, calls: int = calls) -> None:
                    pipe = r.pipeline(transaction=False)
                    for _ in range(calls):
                        pipe.execute_command(*cmd)
                    pipe.execute(raise_on_error=False)

                replay()  # warm
                out[name] = _count_all([pid], cg, dumps, replay)[0] / (calls * per)
                r.xtrim(keys.stream, maxlen=1_000)
                r.xtrim(caller._keys.stream, maxlen=1_000)
            # the rest of a message's life: bob's wake.lua handing him one message (a send and
            # that wake replayed in pairs, the send's own count taken off), then his mark_done
            # of one message (one call per message the pairs left pending, each with its id)
            alice.send("bob", "y", subject="s")
            wake_one = _pipelined(lambda: bob.wait(5))[-1]
            alice.send("bob", "y", subject="s")
            done = _captured(lambda: bob.mark_done(bob.wait(5).messages))
            pending_from = r.xinfo_groups(keys.stream)
            pending_from = next(g for g in pending_from if g["name"] == "bob")["pending"]

            def pairs() -> None:
                pipe = r.pipeline(transaction=False)
                for _ in range(CALLS):
                    pipe.execute_command(*send)
                    pipe.execute_command(*wake_one)
                pipe.execute(raise_on_error=False)

            pairs()  # warm
            both = _count_all([pid], cg, dumps, pairs)[0] / CALLS
            out["wake, one message"] = both - out["send"]
            held = [
                str(p["message_id"]) for p in r.xpending_range(keys.stream, "bob", "-", "+", 10**6)
            ]
            held = held[pending_from:]

            def dones(ids: list[str]) -> Callable[[], None]:
                def run() -> None:
                    pipe = r.pipeline(transaction=False)
                    for entry in ids:
                        pipe.execute_command(*done[:-1], entry)
                    pipe.execute(raise_on_error=False)

                return run

            dones(held[:CALLS])()  # warm
            out["mark_done, one message"] = (
                _count_all([pid], cg, dumps, dones(held[CALLS : 2 * CALLS]))[0] / CALLS
            )
            # the janitor's paths: a heartbeat of a channel of 10 agents (beat.lua renewing
            # the ten, replayed), and one sweep trimming 1,000 entries every recipient is done
            # with (sweep.lua, counted once, per entry trimmed)
            ten = bus.channel("bench-ir-beat", **LIMITS)
            members = [ten.join(f"b{i}") for i in range(10)]
            triples = [x for a in members for x in (a.name, a.replica, "")]
            beat = _captured(lambda: bus._io.script(*bind.beat(ten.keys, 60_000, 10_000, triples)))

            def beats() -> None:
                pipe = r.pipeline(transaction=False)
                for _ in range(CALLS):
                    pipe.execute_command(*beat)
                pipe.execute(raise_on_error=False)

            beats()  # warm
            out["heartbeat, channel of 10"] = _count_all([pid], cg, dumps, beats)[0] / CALLS
            board = bus.channel("bench-ir-sweep", **LIMITS)
            carol, dave = board.join("carol"), board.join("dave")
            for _ in range(10):
                carol.send_many([("dave", "x" * 64)] * BATCH)
                dave.mark_done(dave.read(limit=BATCH))
            sweep = list(_captured(lambda: board.sweep(batch=1)))  # (trims one: 999 are left)
            sweep[-2] = 2 * CALLS  # (ARGV: ..., budget, keep)
            trimmed = r.xlen(board.keys.stream)
            swept = _count_all([pid], cg, dumps, lambda: r.execute_command(*sweep))
            assert r.xlen(board.keys.stream) == 0, "the sweep left entries"
            out["sweep, per entry trimmed"] = swept[0] / trimmed
            # a message's whole life (send(), wait(), mark_done) on a channel whose receipt
            # marks hold 400 fields already (what a channel of modest traffic keeps between
            # janitor passes), LIVES of them: every mark looked up in a hash of 400 to 500
            lively = bus.channel("bench-ir-held", **LIMITS)
            erin, fred = lively.join("erin"), lively.join("fred")
            for _ in range(4):
                erin.send_many([("fred", "x" * 64)] * BATCH)
                fred.mark_done(fred.read(limit=BATCH))

            def lives() -> None:
                for _ in range(LIVES):
                    erin.send("fred", "x" * 64, subject="s")
                    fred.mark_done(fred.wait(5).messages)

            out["message life, 400 marks held"] = _count_all([pid], cg, dumps, lives)[0] / LIVES
            bus.close()
            r.close()
    return out


def floor() -> dict[str, float]:
    """``--floor``: bare commands, counted as the scripts are, on a stream of the entries
    ``send()`` writes: what a script's commands and its ``FCALL`` cost without the script. Each
    stream command follows an ``XADD`` of the entry it reads, whose own count is taken off."""
    import redis

    from redisbus import Bus

    out: dict[str, float] = {}
    fields = ("f", "alice", "t", "bob", "b", "x" * 64, "s", "s")
    with tempfile.TemporaryDirectory() as tmp:
        cg = os.path.join(tmp, "cg")
        with _server(cg) as (port, pid):
            r = redis.Redis(port=port, decode_responses=True)
            bus = Bus.from_url(f"redis://127.0.0.1:{port}/0")
            alice = bus.channel("bench-ir", **LIMITS).join("alice")
            bus.channel("bench-ir").join("bob")
            send = _captured(lambda: alice.send("bob", "x" * 64, subject="s"))
            bus.close()
            r.execute_command(
                "FUNCTION",
                "LOAD",
                "#!lua name=floor\nredis.register_function{function_name = 'floor_nothing', "
                "callback = function(KEYS, ARGV) return 1 end}",
            )
            for group in ("g", "h", "j"):
                r.xgroup_create("s", group, id="$", mkstream=True)
            seq = iter(range(1, 10**9))
            calls: dict[str, Callable[[str], tuple[Any, ...] | None]] = {
                "XADD of a 4-field entry": lambda e: None,
                "XREADGROUP COUNT 1 > of the newest entry": lambda e: (
                    *("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "s", ">"),
                ),
                "XCLAIM FORCE LASTID of the newest entry (wake.lua's)": lambda e: (
                    *("XCLAIM", "s", "h", "c", "0", e, "RETRYCOUNT", "1", "FORCE"),
                    *("LASTID", e),
                ),
                "the same with JUSTID": lambda e: (
                    *("XCLAIM", "s", "j", "c", "0", e, "RETRYCOUNT", "1", "FORCE", "JUSTID"),
                    *("LASTID", e),
                ),
                "FCALL of a function that returns at once": lambda e: ("FCALL", "floor_nothing", 0),
                "the same with send.lua's KEYS and ARGV": lambda e: (
                    "FCALL",
                    "floor_nothing",
                    *send[2:],
                ),
            }
            dumps: dict[int, int] = {}
            xadd = 0.0
            for name, make in calls.items():

                def replay(make: Callable[[str], tuple[Any, ...] | None] = make) -> None:
                    pipe = r.pipeline(transaction=False)
                    for _ in range(CALLS):
                        entry = f"1-{next(seq)}"
                        pipe.execute_command("XADD", "s", entry, *fields)
                        cmd = make(entry)
                        if cmd:
                            pipe.execute_command(*cmd)
                    pipe.execute(raise_on_error=False)

                replay()  # warm
                n = _count_all([pid], cg, dumps, replay)[0] / CALLS
                out[name] = n - xadd  # (the first row is the XADD alone: xadd is 0 there)
                xadd = xadd or n
            r.close()
    return out


#: What ``--design`` counts the life of: the same message each way, in a channel of two.
DESIGN_LIVES = 1_000
#: ``design()``'s rows, in order: the two raw baselines, the yardstick, redisbus.
RAW_DEEP, RAW_SHALLOW = "raw Streams, one stream", "raw Streams, 300 streams of a few entries"
YARDSTICK, BUS = "smallest design keeping the features", "redisbus"
DESIGN_HEAD = [
    "a message's life",
    "instructions",
    "commands",
    "/ raw, one stream",
    "/ raw, 300 streams",
]


def design(lives: int = DESIGN_LIVES) -> dict[str, dict[str, float]]:
    """``--design``: a message's life (its send, the read of it, its acknowledgement, each a
    round trip of its own) counted four ways on one server: raw Streams on one stream that
    grows as a channel's does; raw Streams on 300 streams of a few entries each (the shape of
    ``--fleet``'s baseline, whose reads walk almost nothing); the smallest design that keeps
    the bus's features (``bench/design_floor.lua``); and this checkout's redisbus. Instructions
    and server commands per life (those the functions run included)."""
    import redis

    from bench.scale_load import QUIET
    from redisbus import Bus, BusSettings

    fields = {"f": "alice", "t": "bob", "b": "x" * 64, "s": "s"}
    lib = (Path(__file__).resolve().parent / "design_floor.lua").read_text()
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cg = os.path.join(tmp, "cg")
        with _server(cg) as (port, pid):
            r = redis.Redis(port=port, decode_responses=True)
            dumps: dict[int, int] = {}

            def counted(name: str, life: Callable[[], None], n: int = lives) -> None:
                def run() -> None:
                    for _ in range(n):
                        life()

                run()  # warm (and the stream as deep as it will be)
                before = r.info("commandstats")
                count = _count_all([pid], cg, dumps, run)[0]
                after = r.info("commandstats")
                calls = sum(
                    v["calls"] - before.get(k, {}).get("calls", 0)
                    for k, v in after.items()
                    if k != "cmdstat_info"
                )
                out[name] = {"instructions": count / n, "commands": calls / n}

            r.xgroup_create("raw", "bob", id="$", mkstream=True)

            def raw() -> None:
                r.xadd("raw", fields)  # type: ignore[arg-type]
                got: Any = r.xreadgroup("bob", "c", {"raw": ">"}, count=1)
                assert r.xack("raw", "bob", got[0][1][0][0]) == 1

            counted(RAW_DEEP, raw)
            shallow = [f"raw-{i}" for i in range(300)]
            for s in shallow:
                r.xgroup_create(s, "bob", id="$", mkstream=True)
            turn = iter(range(10**9))

            def raw_shallow() -> None:
                s = shallow[next(turn) % len(shallow)]
                r.xadd(s, fields)  # type: ignore[arg-type]
                got: Any = r.xreadgroup("bob", "c", {s: ">"}, count=1)
                assert r.xack(s, "bob", got[0][1][0][0]) == 1

            counted(RAW_SHALLOW, raw_shallow, max(lives // 4, 1))
            r.execute_command("FUNCTION", "LOAD", lib)
            k = ("{f}:s", "{f}:state", "{f}:b:bob", "{f}:w:bob", "{f}:marks")
            r.hset(k[1], mapping={"a\nalice": "running", "a\nbob": "running"})
            r.xgroup_create(k[0], "bob", id="$", mkstream=True)

            def floor_life() -> None:
                r.fcall("floor_send", 4, k[0], k[1], k[2], k[3], *fields.values())
                got: Any = r.fcall("floor_wake", 4, k[0], k[2], k[4], k[3], "bob", "c")
                assert len(got[2]) == 1, got
                assert r.fcall("floor_done", 3, k[0], k[1], k[4], "bob", "ok", got[2][0][0]) == 1

            counted(YARDSTICK, floor_life)
            with Bus.from_url(f"redis://127.0.0.1:{port}/0", settings=BusSettings(**QUIET)) as bus:
                ch = bus.channel("design", **LIMITS)
                alice, bob = ch.join("alice"), ch.join("bob")

                def life() -> None:
                    alice.send("bob", "x" * 64, subject="s")
                    got = bob.wait(5).messages
                    assert len(got) == 1, got
                    assert bob.mark_done(got)

                counted(BUS, life)
            r.close()
    return out


#: The fleet of ``--fleet``: channels of AGENTS agents, one turn of every agent to warm up,
#: then FLEET_CYCLES counted (the cycle of ``bench.scale_load``: send, wait(), mark_done).
FLEET_CHANNELS, AGENTS, FLEET_CYCLES = 30, 10, 600
CLUSTER_ARGS = ("--cluster-enabled", "yes", "--cluster-node-timeout", "60000")


@contextlib.contextmanager
def _cluster(out: str, tmp: str, shards: int) -> Iterator[list[tuple[int, int]]]:
    """``shards`` cluster-mode primaries under callgrind, every slot served, no replicas
    (one server has none either): [(port, pid)] in slot order.

    Every node meets every other one (no discovery by gossip, which at ``--hz 1`` under
    callgrind and a busy machine took minutes), and the nodes run ``hz 10`` while they form
    the cluster, ``hz 1`` again before anything is counted."""
    from bench.cluster import SLOTS, _cluster_info, _wait, cluster_port

    with contextlib.ExitStack() as stack:
        nodes = []
        for i in range(shards):
            d = os.path.join(tmp, f"node{i}")
            os.makedirs(d)
            extra = (*CLUSTER_ARGS, "--dir", d, "--cluster-config-file", "nodes.conf")
            nodes.append(stack.enter_context(_server(out, cluster_port(), extra)))
        import redis

        clients = [redis.Redis(port=p, decode_responses=True, socket_timeout=60) for p, _ in nodes]
        for c in clients:
            stack.callback(c.close)
            c.config_set("hz", 10)
        for i, c in enumerate(clients):
            c.execute_command(
                "CLUSTER ADDSLOTS", *range(i * SLOTS // shards, (i + 1) * SLOTS // shards)
            )

        def meet() -> None:
            for i, c in enumerate(clients):
                for p, _ in nodes[i + 1 :]:
                    c.execute_command("CLUSTER MEET", "127.0.0.1", p)

        meet()
        deadline = time.monotonic() + 20

        def ok() -> bool:
            nonlocal deadline
            if time.monotonic() > deadline:  # a lost handshake: meet again, harmless if not
                meet()
                deadline = time.monotonic() + 20
            return all(str(_cluster_info(p).get("cluster_state")) == "ok" for p, _ in nodes)

        try:
            _wait(ok, 180, "cluster state ok on every node")
        except RuntimeError as e:
            seen = {
                p: c.execute_command("CLUSTER NODES")
                for (p, _), c in zip(nodes, clients, strict=True)
            }
            raise RuntimeError(f"{e}; CLUSTER NODES on each: {seen}") from None
        for c in clients:
            c.config_set("hz", 1)
        yield nodes


def _fleet_run(
    url: str,
    cluster: bool,
    pids: list[int],
    out: str,
    channels: int,
    cycles: int,
    dumps: dict[int, int],
) -> dict[str, float]:
    """The fleet's counted cycles on one topology: instructions per message, in all and on
    the busiest server, less what the servers run idle over as long (``dumps``: the servers'
    dump numbers so far, see :func:`_count_all`)."""
    from bench.scale_load import QUIET, turn
    from redisbus import Bus, BusSettings

    quiet = BusSettings(**QUIET)
    with Bus.from_url(url, cluster=cluster, settings=quiet) as bus:
        fleet = []
        for c in range(channels):
            ch = bus.channel(f"ir-fleet-c{c}", **LIMITS)
            fleet.append([ch.join(f"a{j}") for j in range(AGENTS)])

        warm = channels * AGENTS
        for step in range(warm):
            turn(fleet, step, "x" * 64, timeout=30)
        t0 = time.perf_counter()

        def load() -> None:
            for step in range(warm, warm + cycles):
                turn(fleet, step, "x" * 64, timeout=30)

        counts = _count_all(pids, out, dumps, load)
        wall = time.perf_counter() - t0
        idle = _count_all(pids, out, dumps, lambda: time.sleep(min(wall, 10.0)))
    rates = [x / min(wall, 10.0) for x in idle]
    net = [c - r * wall for c, r in zip(counts, rates, strict=True)]
    return {
        "per_msg": sum(net) / cycles,
        "busiest_share": max(net) / sum(net),
        "idle_share": sum(r * wall for r in rates) / sum(counts),
        **{f"server{i}": x / cycles for i, x in enumerate(net)},
    }


def _raw_fleet_run(
    url: str, pids: list[int], out: str, channels: int, cycles: int, dumps: dict[int, int]
) -> dict[str, float]:
    """The fleet's walk on raw Streams, counted as :func:`_fleet_run` counts it: per message
    an ``XADD`` to the recipient's stream, an ``XREADGROUP`` of it and an ``XACK``."""
    import redis

    r = redis.Redis.from_url(url)
    streams = [[f"raw-fleet-c{c}-a{j}" for j in range(AGENTS)] for c in range(channels)]
    for row in streams:
        for s in row:
            r.xgroup_create(s, "g", id="$", mkstream=True)

    def step(i: int) -> None:
        row = streams[i % channels]
        s = row[(i // channels + 1) % AGENTS]
        r.xadd(s, {"f": "a", "t": "b", "b": "x" * 64})
        got: Any = r.xreadgroup("g", "c", {s: ">"}, count=1)
        r.xack(s, "g", got[0][1][0][0])

    warm = channels * AGENTS
    for i in range(warm):
        step(i)
    t0 = time.perf_counter()

    def load() -> None:
        for i in range(warm, warm + cycles):
            step(i)

    counts = _count_all(pids, out, dumps, load)
    wall = time.perf_counter() - t0
    idle = _count_all(pids, out, dumps, lambda: time.sleep(min(wall, 10.0)))
    r.close()
    net = sum(counts) - sum(idle) / min(wall, 10.0) * wall
    return {"per_msg": net / cycles, "busiest_share": 1.0, "idle_share": 0.0}


def fleet(
    channels: int = FLEET_CHANNELS, cycles: int = FLEET_CYCLES, clusters: tuple[int, ...] = (1, 3)
) -> dict[str, dict[str, float]]:
    """Server instructions per message of the fleet's cycle on one server and on Clusters of
    each number of shards in ``clusters``, in this process's ``redisbus``."""
    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cg = os.path.join(tmp, "cg")
        with _server(cg) as (port, pid):
            url = f"redis://127.0.0.1:{port}/0"
            dumps: dict[int, int] = {}
            out["one server"] = _fleet_run(url, False, [pid], cg, channels, cycles, dumps)
            out["raw Streams, one server"] = _raw_fleet_run(url, [pid], cg, channels, cycles, dumps)
        for shards in clusters:
            with _cluster(cg, os.path.join(tmp, f"c{shards}"), shards) as nodes:
                url = f"redis://127.0.0.1:{nodes[0][0]}/0"
                pids = [pid for _, pid in nodes]
                out[f"{shards}-shard Cluster"] = _fleet_run(
                    url, True, pids, cg, channels, cycles, {}
                )
    return out


def _run(package_dir: Path, mode: str = "--worker") -> Any:
    """:func:`worker` (or, with ``--fleet-worker``, :func:`fleet`) in a fresh process that
    imports ``redisbus`` from ``package_dir``."""
    env = dict(os.environ, PYTHONPATH=str(package_dir))
    bench_dir = str(Path(__file__).resolve().parent.parent)
    code = (
        f"import runpy, sys; sys.argv = ['instructions', {mode!r}]; "
        # redisbus from DIR, first; then the bench of this checkout ahead of any in DIR
        f"import redisbus; sys.path.insert(0, {bench_dir!r}); "
        f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')"
    )
    with tempfile.TemporaryDirectory() as cwd:  # nothing of this checkout on the path but DIR
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=cwd
        )
    if done.returncode:
        raise SystemExit(f"counting with {package_dir} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _print_table(head: str, results: list[tuple[str, dict[str, float]]]) -> None:
    names = list(results[-1][1])
    print(f"| {head} | " + " | ".join(label for label, _ in results) + " |")
    print("|---|" + "---|" * len(results))
    for name in names:
        # (an older checkout's worker may not count every call this one does)
        cells = [f"{res[name]:,.0f}" if name in res else "—" for _, res in results]
        if len(results) == 2 and name in results[0][1]:
            cells[-1] += f" ({results[1][1][name] / results[0][1][name] - 1:+.1%})"
        print(f"| {name} | " + " | ".join(cells) + " |")


def design_cells(rows: dict[str, dict[str, float]]) -> list[list[str]]:
    """``design()``'s rows as the cells of a table under ``DESIGN_HEAD``."""
    deep, shallow = rows[RAW_DEEP]["instructions"], rows[RAW_SHALLOW]["instructions"]
    return [
        [name, f"{n:,.0f}", f"{v['commands']:.2f}", f"{n / deep:.2f}x", f"{n / shallow:.2f}x"]
        for name, v in rows.items()
        for n in (v["instructions"],)
    ]


def _print_design(rows: dict[str, dict[str, float]]) -> None:
    print("| " + " | ".join(DESIGN_HEAD) + " |")
    print("|" + "---|" * len(DESIGN_HEAD))
    for cells in design_cells(rows):
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    p.add_argument("--against", metavar="DIR", help="also count with the redisbus in DIR")
    p.add_argument(
        "--fleet",
        action="store_true",
        help="count the fleet's message cycle on one server and on 1- and 3-shard Clusters",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="count bare commands (XADD, XREADGROUP, XCLAIM, an FCALL that does nothing)",
    )
    p.add_argument(
        "--design",
        action="store_true",
        help="count a message's life on raw Streams, in the smallest design that keeps the bus's "
        "features (bench/design_floor.lua) and in redisbus",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fleet-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker()))
        return 0
    if args.fleet_worker:
        print(json.dumps(fleet()))
        return 0
    missing = [t for t in ("valgrind", "callgrind_control", "redis-server") if not shutil.which(t)]
    if missing:
        print(f"needs {', '.join(missing)} on PATH", file=sys.stderr)
        return 2
    if args.floor:
        _print_table("bare call", [("instructions", floor())])
        return 0
    if args.design:
        _print_design(design())
        return 0
    sides = [("this checkout", Path(__file__).resolve().parent.parent)]
    if args.against:
        sides.insert(0, (args.against, Path(args.against).resolve()))
    if not args.fleet:
        _print_table("call", [(label, _run(path)) for label, path in sides])
        return 0
    runs = [(label, _run(path, "--fleet-worker")) for label, path in sides]
    print(
        f"Server instructions per message (send, wait(), mark_done), {FLEET_CHANNELS} channels"
        f" of {AGENTS} agents, {FLEET_CYCLES} messages; busiest server's share:"
    )
    print()
    per_msg = [(label, {t: v["per_msg"] for t, v in res.items()}) for label, res in runs]
    _print_table("topology", per_msg)
    one = runs[-1][1]["one server"]["per_msg"]
    print()
    for topo, v in runs[-1][1].items():
        if topo.startswith("raw"):
            print(f"- redisbus on one server: {one / v['per_msg']:.2f}x the {topo} life")
            continue
        print(
            f"- {topo}: {v['per_msg'] / one:.3f}x one server, busiest server "
            f"{v['busiest_share']:.0%} of the instructions"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
