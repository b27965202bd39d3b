"""Baselines: what a user gets from raw redis-py and from FastStream on the same server."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from typing import Any

import redis
import redis.asyncio as aredis
from redis.typing import EncodableT, FieldT

from bench.common import (
    Ctx,
    Metrics,
    RoundTrips,
    Sink,
    body,
    body_ts,
    latency_metrics,
    pubsub_phases,
    settle_heap,
    used_memory,
)

#: Fields of a raw entry, shaped like a small envelope so the payload is comparable.
SENDER = "alice"
RECIPIENT = "bob"
SUBJECT = "bench"
GROUP = "bob"
WARMUP = 200


def _fields(text: str, to: str = RECIPIENT) -> dict[FieldT, EncodableT]:
    return {"from": SENDER, "to": to, "subject": SUBJECT, "body": text}


Entry = tuple[bytes, dict[bytes, bytes]]


def _read(r: redis.Redis, stream: str, count: int, block: int | None = None) -> list[Entry]:
    """``XREADGROUP`` new entries of one stream for the benchmark group, as (id, fields)."""
    resp: Any = r.xreadgroup(GROUP, "c1", {stream: ">"}, count=count, block=block)
    if not resp:
        return []
    entries: list[Entry] = resp[0][1]
    return entries


# --- sequential and pipelined XADD --------------------------------------------------------


def raw_xadd_seq(ctx: Ctx) -> Metrics:
    """One client, one ``XADD`` per round trip."""
    n = ctx.size(2_000, 10_000)
    stream = ctx.name("xadd")
    r = ctx.client()
    try:
        for _ in range(WARMUP):
            r.xadd(stream, _fields(body()))
        lat: list[int] = []
        start = time.perf_counter()
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r.xadd(stream, _fields(body()))
            lat.append(time.perf_counter_ns() - t0)
        elapsed = time.perf_counter() - start
        trips = RoundTrips()
        with trips.counting():
            r.xadd(stream, _fields(body()))
    finally:
        r.close()
    return {"msgs_per_s": n / elapsed, "round_trips": float(trips.count), **latency_metrics(lat)}


def raw_xadd_pipelined(ctx: Ctx, batch: int = 100) -> Metrics:
    """One client, ``XADD`` in pipelines of ``batch`` (no MULTI)."""
    n = ctx.size(5_000, 50_000)
    stream = ctx.name("xaddp")
    r = ctx.client()
    try:
        r.xadd(stream, _fields(body()))
        start = time.perf_counter()
        for _ in range(n // batch):
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(stream, _fields(body()))
            pipe.execute()
        elapsed = time.perf_counter() - start
        trips = RoundTrips()
        with trips.counting():
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(stream, _fields(body()))
            pipe.execute()
    finally:
        r.close()
    return {"msgs_per_s": (n // batch) * batch / elapsed, "round_trips": float(trips.count)}


def raw_async_xadd_seq(ctx: Ctx) -> Metrics:
    """``redis.asyncio``: one task, one awaited ``XADD`` at a time."""
    n = ctx.size(2_000, 10_000)
    stream = ctx.name("axadd")

    async def run() -> float:
        r = aredis.Redis.from_url(ctx.url)
        try:
            for _ in range(WARMUP):
                await r.xadd(stream, _fields(body()))
            start = time.perf_counter()
            for _ in range(n):
                await r.xadd(stream, _fields(body()))
            return n / (time.perf_counter() - start)
        finally:
            await r.aclose()

    return {"msgs_per_s": asyncio.run(run())}


def raw_async_xadd_concurrent(ctx: Ctx, tasks: int = 100) -> Metrics:
    """``redis.asyncio``: ``tasks`` concurrent tasks on one client, each awaiting ``XADD``s."""
    per_task = ctx.size(20, 100)
    stream = ctx.name("axaddc")

    async def worker(r: aredis.Redis, i: int) -> None:
        for _ in range(per_task):
            await r.xadd(stream, _fields(body(), to=f"agent-{i}"))

    async def run() -> float:
        r = aredis.Redis.from_url(ctx.url, max_connections=tasks + 10)
        try:
            await asyncio.gather(*(r.ping() for _ in range(tasks)))
            start = time.perf_counter()
            await asyncio.gather(*(worker(r, i) for i in range(tasks)))
            return tasks * per_task / (time.perf_counter() - start)
        finally:
            await r.aclose()

    return {"msgs_per_s": asyncio.run(run())}


def raw_xadd_fanout(ctx: Ctx, recipients: int = 100) -> Metrics:
    """One ``XADD`` naming ``recipients`` recipients: the floor of a one-round-trip broadcast."""
    n = ctx.size(100, 500)
    stream = ctx.name("fanout")
    to = ",".join(f"agent-{i}" for i in range(recipients))
    r = ctx.client()
    try:
        for _ in range(20):
            r.xadd(stream, _fields(body(), to=to))
        lat: list[int] = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            r.xadd(stream, _fields(body(), to=to))
            lat.append(time.perf_counter_ns() - t0)
        trips = RoundTrips()
        with trips.counting():
            r.xadd(stream, _fields(body(), to=to))
    finally:
        r.close()
    return {"round_trips": float(trips.count), **latency_metrics(lat)}


# --- wake-up latency: XADD in another process -> XREADGROUP BLOCK --------------------------


def paced(rate: float, n: int) -> list[float]:
    """Absolute send times (perf_counter seconds) for ``n`` sends at ``rate`` per second."""
    t0 = time.perf_counter() + 0.01
    return [t0 + i / rate for i in range(n)]


def sleep_until(deadline: float) -> None:
    delay = deadline - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def _raw_sender(url: str, stream: str, n: int, rate: float, ready: Event, go: Event) -> None:
    r = redis.Redis.from_url(url)
    r.ping()
    settle_heap()
    ready.set()
    go.wait(30)
    for deadline in paced(rate, n):
        sleep_until(deadline)
        r.xadd(stream, _fields(body()))
    r.close()


def wakeup_count(ctx: Ctx) -> int:
    return ctx.size(500, 3_000)


def receive_until_quiet(
    sender: BaseProcess, n: int, received: Callable[[], int], grace_s: float = 1.0
) -> Iterator[None]:
    """Drive a receive loop until ``n`` arrived, or the sender has exited and ``grace_s``
    passed with nothing new (so a message the receiver never gets shows as missed)."""
    last, quiet_since = -1, time.monotonic()
    hard_stop = time.monotonic() + 600
    while received() < n and time.monotonic() < hard_stop:
        got = received()
        if got != last:
            last, quiet_since = got, time.monotonic()
        elif not sender.is_alive() and time.monotonic() - quiet_since > grace_s:
            return
        yield


def wakeup_metrics(lat_ns: list[int], sent: int) -> Metrics:
    """Latency percentiles (the first 5% dropped as warm-up) and how many never woke up."""
    samples = lat_ns[min(50, len(lat_ns) // 20) :]
    return {"missed": float(sent - len(lat_ns)), **latency_metrics(samples)}


def raw_xreadgroup_wakeup(ctx: Ctx, rate: float = 1_000.0) -> Metrics:
    """Sender process paces ``XADD`` at ``rate``/s; this process blocks in ``XREADGROUP``.

    Latency = receive wall clock - the send wall clock stamped in the body (same machine).
    """
    n = wakeup_count(ctx)
    stream = ctx.name("wake")
    r = ctx.client()
    r.xgroup_create(stream, GROUP, id="$", mkstream=True)
    spawn = mp.get_context("spawn")
    ready, go = spawn.Event(), spawn.Event()
    proc = spawn.Process(target=_raw_sender, args=(ctx.url, stream, n, rate, ready, go))
    proc.start()
    lat: list[int] = []
    try:
        if not ready.wait(30):
            raise RuntimeError("sender process did not start")
        settle_heap()
        go.set()
        for _ in receive_until_quiet(proc, n, lambda: len(lat)):
            entries = _read(r, stream, count=100, block=500)
            now = time.time_ns()
            for _id, fields in entries:
                lat.append(now - body_ts(fields[b"body"]))
            if entries:
                r.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
        r.close()
    return wakeup_metrics(lat, n)


def raw_async_xreadgroup_wakeup(ctx: Ctx, rate: float = 1_000.0) -> Metrics:
    """:func:`raw_xreadgroup_wakeup` with a ``redis.asyncio`` receiver: the sender process
    paces ``XADD`` at ``rate``/s (the same sender); an event loop awaits ``XREADGROUP BLOCK``
    then ``XACK``, as an async consumer on raw Redis would."""
    n = wakeup_count(ctx)
    stream = ctx.name("awake")
    setup = ctx.client()
    setup.xgroup_create(stream, GROUP, id="$", mkstream=True)
    setup.close()
    spawn = mp.get_context("spawn")
    ready, go = spawn.Event(), spawn.Event()
    proc = spawn.Process(target=_raw_sender, args=(ctx.url, stream, n, rate, ready, go))
    proc.start()
    lat: list[int] = []

    async def run() -> None:
        r = aredis.Redis.from_url(ctx.url)
        try:
            await r.ping()
            settle_heap()
            go.set()
            for _ in receive_until_quiet(proc, n, lambda: len(lat)):
                resp: Any = await r.xreadgroup(GROUP, "c1", {stream: ">"}, count=100, block=500)
                now = time.time_ns()
                entries: list[Entry] = resp[0][1] if resp else []
                for _id, fields in entries:
                    lat.append(now - body_ts(fields[b"body"]))
                if entries:
                    await r.xack(stream, GROUP, *[entry_id for entry_id, _ in entries])
        finally:
            await r.aclose()

    try:
        if not ready.wait(30):
            raise RuntimeError("sender process did not start")
        asyncio.run(run())
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return wakeup_metrics(lat, n)


# --- memory floor: raw entries added, acked and trimmed -----------------------------------


def raw_memory(ctx: Ctx, batch: int = 1_000) -> Metrics:
    """Raw streams: N entries added, read and acked by one group, then ``XTRIM MINID``."""
    n = ctx.memory_messages
    stream = ctx.name("mem")
    r = ctx.client()
    try:
        r.xgroup_create(stream, GROUP, id="$", mkstream=True)
        before = used_memory(r)
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(batch, n - start)):
                pipe.xadd(stream, _fields(body()))
            pipe.execute()
        send_s = time.perf_counter() - t0
        sent = used_memory(r)
        last = b"0-0"
        while True:
            entries = _read(r, stream, count=batch)
            if not entries:
                break
            ids = [entry_id for entry_id, _ in entries]
            r.xack(stream, GROUP, *ids)
            last = ids[-1]
        done = used_memory(r)
        ms, seq = last.decode().split("-")
        r.xtrim(stream, minid=f"{ms}-{int(seq) + 1}", approximate=False)
        trimmed = used_memory(r)
    finally:
        r.close()
    return {**memory_metrics(n, before, sent, done, trimmed), "send_per_s": n / send_s}


def memory_metrics(n: int, before: int, sent: int, done: int, trimmed: int) -> Metrics:
    mib = 1024 * 1024
    return {
        "messages": float(n),
        "before_mib": before / mib,
        "sent_mib": sent / mib,
        "done_mib": done / mib,
        "trimmed_mib": trimmed / mib,
        "bytes_per_msg": (sent - before) / n,
        "residual_mib": (trimmed - before) / mib,
        "residual_pct": 100 * (trimmed - before) / max(1, sent - before),
    }


# --- FastStream (Redis Streams) ------------------------------------------------------------


def faststream_publish(ctx: Ctx) -> Metrics:
    """FastStream ``broker.publish(..., stream=...)``, one awaited publish at a time."""
    from faststream.redis import RedisBroker

    n = ctx.size(1_000, 5_000)
    stream = ctx.name("fs-pub")

    async def run() -> float:
        broker = RedisBroker(ctx.url, logger=None)  # type: ignore[arg-type]  # None: no logging
        await broker.connect()
        try:
            for _ in range(WARMUP):
                await broker.publish(body(), stream=stream)
            start = time.perf_counter()
            for _ in range(n):
                await broker.publish(body(), stream=stream)
            return n / (time.perf_counter() - start)
        finally:
            await broker.stop()

    return {"msgs_per_s": asyncio.run(run())}


def faststream_pubsub(ctx: Ctx) -> Metrics:
    """FastStream publish -> consumer-group subscriber, in one event loop
    (see :func:`bench.common.pubsub_phases`)."""
    from faststream.redis import RedisBroker, StreamSub

    n, n_paced = ctx.size(1_000, 5_000), ctx.size(250, 1_000)
    stream = ctx.name("fs-pubsub")

    async def run() -> Metrics:
        broker = RedisBroker(ctx.url, logger=None)  # type: ignore[arg-type]  # None: no logging
        sink = Sink()

        @broker.subscriber(stream=StreamSub(stream, group=GROUP, consumer="c1"))
        async def handle(msg: str) -> None:
            sink.add(msg)

        async def publish() -> None:
            await broker.publish(body(), stream=stream)

        await broker.start()
        try:
            return await pubsub_phases(publish, sink, n, n_paced)
        finally:
            await broker.stop()

    return asyncio.run(run())
