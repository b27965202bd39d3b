"""redisbus cases, written against the public API only (docs/reference/api.md).

Every channel is created with limits far above what a case sends, so every limit is checked on
every send and none refuses. A refused send makes the case fail: it would not be measuring the
happy path any more.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.synchronize import Event
from typing import Any, cast

from bench.baselines import (
    SUBJECT,
    WARMUP,
    memory_metrics,
    paced,
    receive_until_quiet,
    sleep_until,
    wakeup_count,
    wakeup_metrics,
)
from bench.common import (
    Ctx,
    Metrics,
    RoundTrips,
    Sink,
    body,
    body_ts,
    command_calls,
    latency_metrics,
    maybe_await,
    pubsub_phases,
    settle_heap,
    used_memory,
)

#: High enough that nothing is refused, while every limit is still evaluated.
HIGH = 1_000_000_000
LIMITS: dict[str, Any] = {
    "routing": "open",
    "inbox_cap": HIGH,
    "pair_rate_burst": HIGH,
    "pair_rate_per_s": HIGH,
    "sender_rate_burst": HIGH,
    "sender_rate_per_s": HIGH,
}


class Unavailable(Exception):
    """The core does not offer what this case needs (yet)."""


def available() -> str | None:
    """``None`` when the redisbus public API is importable, else why not."""
    try:
        import redisbus
    except Exception as exc:
        return f"redisbus not importable: {exc!r}"
    missing = [n for n in ("Bus", "AsyncBus") if not hasattr(redisbus, n)]
    if missing:
        return f"redisbus has no {', '.join(missing)} yet (core not landed)"
    return None


def _bus(ctx: Ctx, signing: dict[str, Any] | None = None) -> Any:
    from redisbus import Bus, BusSettings

    if signing is None:
        return Bus.from_url(ctx.url)
    return Bus.from_url(ctx.url, settings=BusSettings(**signing))


async def _abus(ctx: Ctx) -> Any:
    from redisbus import AsyncBus

    return await maybe_await(AsyncBus.from_url(ctx.url))


@contextmanager
def opened(ctx: Ctx, signing: dict[str, Any] | None = None) -> Iterator[Any]:
    bus = _bus(ctx, signing)
    try:
        yield bus
    finally:
        bus.close()


def check(receipt: Any) -> None:
    """Fail loudly on a refused send (a refusal is not the path being measured)."""
    receipts = receipt if isinstance(receipt, list) else [receipt]
    for r in receipts:
        if r.error is not None or r.status == "rejected":
            raise RuntimeError(f"send to {r.to} refused: {r.error!r}")


# --- send(): sequential and batched -----------------------------------------------------------


def bus_send_seq(ctx: Ctx, signing: dict[str, Any] | None = None) -> Metrics:
    """One sync agent, one ``send()`` at a time, to one recipient."""
    n = ctx.size(2_000, 10_000)
    with opened(ctx, signing) as bus:
        ch = bus.channel(ctx.name("send"), **LIMITS)
        alice = ch.join("alice")
        ch.join("bob")
        for _ in range(WARMUP):
            check(alice.send("bob", body(), subject=SUBJECT))
        lat: list[int] = []
        start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r = alice.send("bob", body(), subject=SUBJECT)
            lat.append(time.perf_counter_ns() - t0)
            check(r)
        elapsed = time.perf_counter() - start
        trips = RoundTrips()
        with trips.counting():
            check(alice.send("bob", body(), subject=SUBJECT))
    return {"msgs_per_s": n / elapsed, "round_trips": float(trips.count), **latency_metrics(lat)}


def _send_many(agent: Any) -> Any:
    fn = getattr(agent, "send_many", None)
    if fn is None:
        raise Unavailable("Agent.send_many does not exist (no batched send in the core)")
    return fn


def bus_send_many(ctx: Ctx, batch: int = 100) -> Metrics:
    """One sync agent, ``send_many`` of ``batch`` messages per call."""
    n = ctx.size(5_000, 50_000)
    with opened(ctx) as bus:
        ch = bus.channel(ctx.name("batch"), **LIMITS)
        alice = ch.join("alice")
        ch.join("bob")
        send_many = _send_many(alice)
        check(send_many([("bob", body())]))
        start = time.perf_counter()
        for _ in range(n // batch):
            check(send_many([("bob", body()) for _ in range(batch)]))
        elapsed = time.perf_counter() - start
        trips = RoundTrips()
        with trips.counting():
            check(send_many([("bob", body()) for _ in range(batch)]))
    return {"msgs_per_s": (n // batch) * batch / elapsed, "round_trips": float(trips.count)}


# --- wake-up latency: send() in another process -> wait() -----------------------------------


def _bus_sender(
    url: str,
    channel: str,
    n: int,
    rate: float,
    ready: Event,
    go: Event,
    signing: dict[str, Any] | None = None,
) -> None:
    from bench.otel import apply

    apply()  # the tracing setup of the process that spawned this one (bench/otel.py)
    from redisbus import Bus, BusSettings

    bus = Bus.from_url(url, settings=BusSettings(**(signing or {})))
    try:
        sender = bus.channel(channel, **LIMITS).join("sender")
        settle_heap()
        ready.set()
        go.wait(30)
        for deadline in paced(rate, n):
            sleep_until(deadline)
            check(sender.send("receiver", body(), subject=SUBJECT))
    finally:
        bus.close()


def bus_wait_wakeup(
    ctx: Ctx, rate: float = 1_000.0, signing: dict[str, Any] | None = None
) -> Metrics:
    """Sender process paces ``send()`` at ``rate``/s; this process loops ``wait()`` +
    ``mark_done()``. Latency = wall clock when ``wait()`` returned - stamp in the body."""
    n = wakeup_count(ctx)
    name = ctx.name("wake")
    with opened(ctx, signing) as bus:
        receiver = bus.channel(name, **LIMITS).join("receiver")
        spawn = mp.get_context("spawn")
        ready, go = spawn.Event(), spawn.Event()
        proc = spawn.Process(target=_bus_sender, args=(ctx.url, name, n, rate, ready, go, signing))
        lat = _receive_from(proc, ready, go, receiver, n)
    return wakeup_metrics(lat, n)


def _receive_from(proc: Any, ready: Any, go: Any, receiver: Any, n: int) -> list[int]:
    """Start the sender process ``proc``, then ``wait()`` and ``mark_done()`` on ``receiver``
    until it has sent ``n`` and gone quiet: each message's wake-up latency in ns."""
    proc.start()
    lat: list[int] = []
    try:
        if not ready.wait(30):
            raise RuntimeError("sender process did not start")
        settle_heap()
        go.set()
        for _ in receive_until_quiet(proc, n, lambda: len(lat)):
            w = receiver.wait(timeout=0.5)
            now = time.time_ns()
            for m in w.messages:
                lat.append(now - body_ts(m.body))
            if w.messages:
                receiver.mark_done(w.messages)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    if proc.exitcode not in (0, None):
        raise RuntimeError(f"sender process exited with {proc.exitcode}")
    return lat


def _xadd_sender(
    url: str,
    stream: str,
    bell: str,
    wakeup: str,
    fields: dict[bytes, bytes],
    body_key: bytes,
    n: int,
    rate: float,
    ready: Event,
    go: Event,
) -> None:
    import redis

    r = redis.Redis.from_url(url)
    r.ping()
    entry = dict(fields)
    settle_heap()
    ready.set()
    go.wait(30)
    for deadline in paced(rate, n):
        sleep_until(deadline)
        entry[body_key] = body().encode()
        entry_id = r.xadd(stream, entry)  # type: ignore[arg-type]
        if r.rpush(bell, entry_id) == 1:  # the recipient's doorbell, as send.lua rings it
            r.rpush(wakeup, "")
    r.close()


def bus_wait_wakeup_xadd(ctx: Ctx, rate: float = 1_000.0) -> Metrics:
    """:func:`bus_wait_wakeup` with the sender's ``send()`` replaced by a bare ``XADD`` of
    the entry ``send()`` writes (its fields copied from one real send, the body restamped),
    and the recipient's doorbell rung (its id pushed, the wakeup with it when the bell was
    empty): the receive side alone, the sender costing
    about what raw Redis's does. No limit is checked and
    the inbox count is not raised for these entries (``mark_done()`` counts it down all the
    same), which the wake-up path does not read."""
    n = wakeup_count(ctx)
    name = ctx.name("wakex")
    with opened(ctx) as bus:
        ch = bus.channel(name, **LIMITS)
        receiver, sender = ch.join("receiver"), ch.join("sender")
        check(sender.send("receiver", "template", subject=SUBJECT))
        first = receiver.wait(timeout=5).messages
        receiver.mark_done(first)
        stream = receiver._keys.stream
        r = ctx.client()
        try:
            ((_, fields),) = cast(  # a client that leaves replies as bytes
                list[tuple[bytes, dict[bytes, bytes]]], r.xrange(stream, first[0].id, first[0].id)
            )
        finally:
            r.close()
        body_key = next(k for k, v in fields.items() if v == b"template")
        spawn = mp.get_context("spawn")
        ready, go = spawn.Event(), spawn.Event()
        bell, wakeup = receiver._keys.bell("receiver"), receiver._keys.wakeup("receiver")
        args = (ctx.url, stream, bell, wakeup, fields, body_key, n, rate, ready, go)
        proc = spawn.Process(target=_xadd_sender, args=args)
        lat = _receive_from(proc, ready, go, receiver, n)
    return wakeup_metrics(lat, n)


def bus_async_wait_wakeup(ctx: Ctx, rate: float = 1_000.0) -> Metrics:
    """:func:`bus_wait_wakeup` with an ``AsyncBus`` receiver: the same sender process (a
    sync ``Bus``, so only the receiving face differs); an event loop awaits ``wait()`` then
    ``mark_done()``."""
    n = wakeup_count(ctx)
    name = ctx.name("awake")
    spawn = mp.get_context("spawn")
    ready, go = spawn.Event(), spawn.Event()
    proc = spawn.Process(target=_bus_sender, args=(ctx.url, name, n, rate, ready, go, None))
    lat: list[int] = []

    async def run() -> None:
        bus = await _abus(ctx)
        try:
            ch = await maybe_await(bus.channel(name, **LIMITS))
            receiver = await ch.join("receiver")
            proc.start()
            if not ready.wait(30):
                raise RuntimeError("sender process did not start")
            settle_heap()
            go.set()
            for _ in receive_until_quiet(proc, n, lambda: len(lat)):
                w = await receiver.wait(timeout=0.5)
                now = time.time_ns()
                for m in w.messages:
                    lat.append(now - body_ts(m.body))
                if w.messages:
                    await receiver.mark_done(w.messages)
        finally:
            await bus.aclose()

    try:
        asyncio.run(run())
    finally:
        if proc.pid is not None:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    if proc.exitcode not in (0, None):
        raise RuntimeError(f"sender process exited with {proc.exitcode}")
    return wakeup_metrics(lat, n)


# --- signing: the same send and wake-up, signed ---------------------------------------------

_KEYS: dict[str, dict[str, Any]] = {}


def signing_settings(mode: str) -> dict[str, Any]:
    """BusSettings keywords of a signing mode: "hmac" (a shared key) or "ed25519" (one host
    key, trusted for every channel and agent name), made once per process run."""
    if mode == "hmac":
        return {"signing_keys": {"bench": "bench-fleet-secret"}}
    if mode not in _KEYS:
        import json
        import tempfile
        from pathlib import Path

        from redisbus._trust import generate_key

        tmp = Path(tempfile.mkdtemp(prefix="redisbus-bench-keys-"))
        public = generate_key(str(tmp / "host.pem"))
        trust = {"keys": {"bench": {"public": public, "channels": ["*"], "agents": ["*"]}}}
        (tmp / "trust.json").write_text(json.dumps(trust))
        _KEYS[mode] = {
            "signing_key_file": str(tmp / "host.pem"),
            "trust_file": str(tmp / "trust.json"),
        }
    return _KEYS[mode]


def bus_send_seq_hmac(ctx: Ctx) -> Metrics:
    return bus_send_seq(ctx, signing_settings("hmac"))


def bus_send_seq_ed25519(ctx: Ctx) -> Metrics:
    return bus_send_seq(ctx, signing_settings("ed25519"))


def bus_wait_wakeup_hmac(ctx: Ctx) -> Metrics:
    return bus_wait_wakeup(ctx, signing=signing_settings("hmac"))


def bus_wait_wakeup_ed25519(ctx: Ctx) -> Metrics:
    return bus_wait_wakeup(ctx, signing=signing_settings("ed25519"))


# --- async -------------------------------------------------------------------------------------


def bus_async_send_seq(ctx: Ctx) -> Metrics:
    """``AsyncBus``: one agent, one awaited ``send()`` at a time."""
    n = ctx.size(1_000, 5_000)

    async def run() -> float:
        bus = await _abus(ctx)
        try:
            ch = await maybe_await(bus.channel(ctx.name("asend"), **LIMITS))
            alice = await ch.join("alice")
            await ch.join("bob")
            for _ in range(WARMUP):
                check(await alice.send("bob", body(), subject=SUBJECT))
            start = time.perf_counter()
            for _ in range(n):
                check(await alice.send("bob", body(), subject=SUBJECT))
            return n / (time.perf_counter() - start)
        finally:
            await bus.aclose()

    return {"msgs_per_s": asyncio.run(run())}


def bus_async_many_agents(ctx: Ctx, agents: int = 100) -> Metrics:
    """``AsyncBus``: ``agents`` agents in one process, each sending to the next, concurrently."""
    per_agent = ctx.size(20, 100)

    async def run() -> float:
        bus = await _abus(ctx)
        try:
            ch = await maybe_await(bus.channel(ctx.name("a100"), **LIMITS))
            members = [await ch.join(f"agent-{i}") for i in range(agents)]
            names = [f"agent-{(i + 1) % agents}" for i in range(agents)]

            async def worker(i: int) -> None:
                for _ in range(per_agent):
                    check(await members[i].send(names[i], body(), subject=SUBJECT))

            await asyncio.gather(*(m.send(names[i], body()) for i, m in enumerate(members)))
            start = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(agents)))
            return agents * per_agent / (time.perf_counter() - start)
        finally:
            await bus.aclose()

    return {"msgs_per_s": asyncio.run(run())}


def bus_async_pubsub(ctx: Ctx) -> Metrics:
    """``AsyncBus`` publish -> consume in one event loop: the FastStream pub/sub work
    (see :func:`bench.common.pubsub_phases`). The consumer loops ``wait()`` + ``mark_done()``."""
    n, n_paced = ctx.size(1_000, 5_000), ctx.size(250, 1_000)

    async def run() -> Metrics:
        bus = await _abus(ctx)
        try:
            ch = await maybe_await(bus.channel(ctx.name("apubsub"), **LIMITS))
            sender = await ch.join("sender")
            receiver = await ch.join("receiver")
            sink = Sink()
            stop = asyncio.Event()

            async def consume() -> None:
                while not stop.is_set():
                    w = await receiver.wait(timeout=0.5)
                    now = time.time_ns()
                    for m in w.messages:
                        sink.add(m.body, now)
                    if w.messages:
                        await receiver.mark_done(w.messages)

            async def publish() -> None:
                check(await sender.send("receiver", body(), subject=SUBJECT))

            consumer = asyncio.create_task(consume())
            try:
                return await pubsub_phases(publish, sink, n, n_paced)
            finally:
                # stop cooperatively: cancelling a task blocked in a redis.asyncio read is
                # not reliable (redis-py 8.1 sometimes swallows the cancellation)
                stop.set()
                _, pending = await asyncio.wait({consumer}, timeout=5)
                for task in pending:
                    task.cancel()
        finally:
            await bus.aclose()

    return asyncio.run(run())


# --- broadcast and a large channel ------------------------------------------------------------


def bus_broadcast(ctx: Ctx, recipients: int = 100) -> Metrics:
    """``send("all", ...)`` from one agent to ``recipients`` others: latency per call."""
    n = ctx.size(100, 500)
    with opened(ctx) as bus:
        ch = bus.channel(ctx.name("bcast"), **LIMITS)
        sender = ch.join("sender")
        for i in range(recipients):
            ch.join(f"agent-{i}")
        for _ in range(20):
            check(sender.send("all", body(), subject=SUBJECT))
        lat: list[int] = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            rs = sender.send("all", body(), subject=SUBJECT)
            lat.append(time.perf_counter_ns() - t0)
            check(rs)
        if len(rs) != recipients:
            raise RuntimeError(f"broadcast reached {len(rs)} of {recipients}")
        trips = RoundTrips()
        with trips.counting():
            check(sender.send("all", body(), subject=SUBJECT))
    return {"round_trips": float(trips.count), **latency_metrics(lat)}


def bus_fleet(ctx: Ctx, agents: int = 1_000) -> Metrics:
    """A channel of ``agents`` members: join, roster, tree, broadcast, then every member reads."""
    readers = ctx.size(100, agents - 1)
    client = ctx.client()
    with opened(ctx) as bus:
        ch = bus.channel(ctx.name("fleet"), **LIMITS)
        t0 = time.perf_counter()
        members = [ch.join(f"agent-{i}") for i in range(agents)]
        join_s = time.perf_counter() - t0

        roster_s = _best_of(3, lambda: members[0].agents())
        tree_s = _best_of(3, ch.tree)
        size = len(ch.tree())

        t0 = time.perf_counter()
        rs = members[0].send("all", body(), subject="fleet")
        broadcast_s = time.perf_counter() - t0
        check(rs)
        msg_id = rs[0].id

        trips = RoundTrips()
        calls0 = command_calls(client)
        got = 0
        t0 = time.perf_counter()
        with trips.counting():
            for m in members[1 : readers + 1]:
                got += any(msg.id == msg_id for msg in m.read())
        read_s = time.perf_counter() - t0
        calls = command_calls(client) - calls0 - 1  # minus the INFO call itself
    client.close()
    return {
        "agents": float(size),
        "join_ms_per_agent": join_s * 1000 / agents,
        "join_s": join_s,
        "roster_ms": roster_s * 1000,
        "tree_ms": tree_s * 1000,
        "broadcast_ms": broadcast_s * 1000,
        "broadcast_receipts": float(len(rs)),
        "read_us": read_s * 1e6 / readers,
        "read_round_trips": trips.count / readers,
        "read_commands": calls / readers,
        "delivered_frac": got / readers,
    }


def bus_broadcast_state(ctx: Ctx, agents: int = 1_000) -> Metrics:
    """``agents`` members each broadcast once (pair buckets on, burst 3): the rate state at its
    peak. A broadcast spends the sender's bucket only, so it grows with the senders."""
    n = ctx.size(200, agents)
    client = ctx.client()
    with opened(ctx) as bus:
        ch = bus.channel(
            ctx.name("bstate"),
            **{**LIMITS, "inbox_cap": n + 10, "pair_rate_burst": 3, "pair_rate_per_s": 1},
        )
        members = [ch.join(f"agent-{i:04d}") for i in range(n)]
        t0 = time.perf_counter()
        for m in members:
            check(m.send("all", "hello everyone"))
        took = time.perf_counter() - t0
        fields = int(client.hlen(ch.keys.rate))
        used = int(client.memory_usage(ch.keys.rate, samples=0) or 0)
    client.close()
    return {
        "agents": float(n),
        "rate_fields": float(fields),
        "rate_mib": used / 2**20,
        "rate_mib_per_1000": used / 2**20 * 1000 / n,
        "broadcast_ms": took * 1000 / n,
    }


def _best_of(k: int, fn: Any) -> float:
    best = float("inf")
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


# --- memory: N messages sent and done, before and after trimming -----------------------------


def _trim(ctx: Ctx, ch: Any, batch: int = 10_000) -> float:
    """Trim through the core's public janitor pass (``Channel.sweep``), repeated until it
    trims less than a batch; returns how many entries it trimmed (NaN and a note without it)."""
    sweep = getattr(ch, "sweep", None)
    if not callable(sweep):
        ctx.note(
            "the core has no public trim call (Channel.sweep): "
            "'after trimming' is memory after done, untrimmed"
        )
        return math.nan
    trimmed = 0
    while True:
        n = int(sweep(batch=batch).trimmed)
        trimmed += n
        if n < batch:
            return float(trimmed)


def _drain(receiver: Any, expected: int) -> tuple[int, int]:
    """Receive and mark done ``expected`` messages: ``wait()`` until it goes quiet, then
    ``read()`` for any it did not return. Returns (done, done only through read())."""
    done = 0
    while done < expected:
        w = receiver.wait(timeout=0.5)
        if not w.messages:
            break
        receiver.mark_done(w.messages)
        done += len(w.messages)
    via_read = 0
    while done < expected:
        msgs = [m for m in receiver.read(limit=1_000) if receiver.name in m.to]
        if not msgs:
            break
        receiver.mark_done(msgs)
        done += len(msgs)
        via_read += len(msgs)
    return done, via_read


def bus_memory(ctx: Ctx, batch: int = 1_000) -> Metrics:
    """N messages sent (batched when the core can) and marked done; ``used_memory`` before,
    after sending, after done, and after the core's trimming."""
    n = ctx.memory_messages
    client = ctx.client()
    with opened(ctx) as bus:
        ch = bus.channel(ctx.name("mem"), **LIMITS)
        sender = ch.join("sender")
        receiver = ch.join("receiver")
        before = used_memory(client)
        t0 = time.perf_counter()
        send_many = getattr(sender, "send_many", None)
        for start in range(0, n, batch):
            k = min(batch, n - start)
            if send_many is not None:
                check(send_many([("receiver", body()) for _ in range(k)]))
            else:
                for _ in range(k):
                    check(sender.send("receiver", body()))
        send_s = time.perf_counter() - t0
        sent = used_memory(client)
        t0 = time.perf_counter()
        done, via_read = _drain(receiver, n)
        if via_read:
            ctx.note(
                f"wait() stopped returning messages with {via_read:,} of {n:,} not yet "
                "returned; read() fetched them"
            )
        done_s = time.perf_counter() - t0
        if done != n:
            raise RuntimeError(f"only {done} of {n} messages came back to be marked done")
        after_done = used_memory(client)
        t0 = time.perf_counter()
        trimmed_entries = _trim(ctx, ch)
        trim_s = time.perf_counter() - t0
        trimmed = used_memory(client)
    client.close()
    return {
        **memory_metrics(n, before, sent, after_done, trimmed),
        "send_per_s": n / send_s,
        "done_per_s": n / done_s,
        "missed_by_wait": float(via_read),
        "trimmed_entries": trimmed_entries,
        "trim_s": trim_s,
    }
