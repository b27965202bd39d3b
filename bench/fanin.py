"""Many agents waiting on one channel, one producer sending each a direct message in turn.

The figure the doorbells are for: before them, every send woke every agent blocked on the
channel's stream, and each read and acknowledged an entry that was not for it, so a channel of
n waiting agents paid n wake-ups per direct message. The baseline is raw redis-py laid out for
this load at its best: one stream per consumer, each consumer blocked on its own. Consumers run
as tasks of one process (redis.asyncio / AsyncBus), the producer in another, sending
sequentially; the aggregate is messages handed over and acknowledged (done) per second, from
the first send to the last acknowledgement, and the server's CPU per message (INFO cpu, user +
system, over the same span)."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from multiprocessing.synchronize import Event
from typing import Any

import redis
import redis.asyncio as aredis

from bench.common import Ctx, Metrics, body, settle_heap

GROUP = "g"


def _server_cpu_s(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _measure(ctx: Ctx, n: int, start_producer: Any, consume: Any) -> Metrics:
    """Run ``consume(armed, end)`` (a coroutine that sets ``armed`` once its consumers run, and
    calls ``end()`` the moment the ``n``-th message is done) against a producer process started
    by ``start_producer(spawn, ready, go)``: messages per second and server µs per message
    between the go and that moment."""
    spawn = mp.get_context("spawn")
    ready, go = spawn.Event(), spawn.Event()
    proc = start_producer(spawn, ready, go)
    client = redis.Redis.from_url(ctx.url)
    try:

        async def run() -> tuple[float, float]:
            armed = asyncio.Event()
            ended: list[float] = []

            def end() -> None:
                ended.extend([time.perf_counter(), _server_cpu_s(client)])

            task = asyncio.ensure_future(consume(armed, end))
            await armed.wait()  # every consumer is blocked on its read
            await asyncio.sleep(0.2)
            if not await asyncio.to_thread(ready.wait, 60):
                raise RuntimeError("producer process did not start")
            settle_heap()
            cpu0, t0 = _server_cpu_s(client), time.perf_counter()
            go.set()
            await asyncio.wait_for(task, 300)
            return ended[0] - t0, ended[1] - cpu0

        elapsed, cpu = asyncio.run(run())
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
        client.close()
    if proc.exitcode not in (0, None):
        raise RuntimeError(f"producer process exited with {proc.exitcode}")
    return {"msgs_per_s": n / elapsed, "server_us_per_msg": cpu / n * 1e6}


async def _until(finished: asyncio.Event, consumers: list[Any]) -> None:
    """Run the consumers until ``finished``, then cancel them (each blocks up to 30 s: long
    enough that no quiet slice's bookkeeping counts in the measure)."""
    tasks = [asyncio.ensure_future(c) for c in consumers]
    await finished.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Tally:
    """What the consumers of one measure share: how many have started (``armed`` once all
    have), how many messages are done (``end()`` and ``finished`` at the ``n``-th)."""

    def __init__(self, consumers: int, n: int, armed: asyncio.Event, end: Any) -> None:
        self.consumers, self.n, self.armed, self.end = consumers, n, armed, end
        self.started = self.done = 0
        self.finished = asyncio.Event()

    def start(self) -> None:
        self.started += 1
        if self.started == self.consumers:
            self.armed.set()

    def add(self, k: int) -> None:
        self.done += k
        if self.done >= self.n and not self.finished.is_set():
            self.end()
            self.finished.set()


# --- raw redis-py: one stream per consumer -----------------------------------------------------


def _raw_producer(url: str, streams: list[str], n: int, ready: Event, go: Event) -> None:
    r = redis.Redis.from_url(url)
    r.ping()
    ready.set()
    go.wait(60)
    for i in range(n):
        r.xadd(streams[i % len(streams)], {"from": "producer", "body": body()})
    r.close()


def raw_fanin(ctx: Ctx, members: int = 100) -> Metrics:
    """``members`` consumers, each blocked (``XREADGROUP BLOCK``) on a stream of its own; the
    producer ``XADD``s to each in turn; each consumer ``XACK``s what it read."""
    n = ctx.size(2_000, 5_000)
    base = ctx.name(f"fanin-raw-{members}")
    streams = [f"{base}:{i}" for i in range(members)]
    setup = redis.Redis.from_url(ctx.url)
    for s in streams:
        setup.xgroup_create(s, GROUP, id="$", mkstream=True)
    setup.close()

    async def consume(armed: asyncio.Event, end: Any) -> None:
        r = aredis.Redis.from_url(ctx.url)
        tally = Tally(members, n, armed, end)

        async def consumer(stream: str) -> None:
            tally.start()
            while not tally.finished.is_set():
                got: Any = await r.xreadgroup(GROUP, "c", {stream: ">"}, count=100, block=30_000)
                if got:
                    ids = [e[0] for e in got[0][1]]
                    await r.xack(stream, GROUP, *ids)
                    tally.add(len(ids))

        try:
            await _until(tally.finished, [consumer(s) for s in streams])
        finally:
            await r.aclose()

    def start(spawn: Any, ready: Event, go: Event) -> Any:
        p = spawn.Process(target=_raw_producer, args=(ctx.url, streams, n, ready, go))
        p.start()
        return p

    return _measure(ctx, n, start, consume)


# --- raw redis-py: the layouts a channel could have (the alternatives of docs/architecture.md) --


def _shared_producer(
    url: str, stream: str, names: list[str], n: int, ring: bool, ready: Event, go: Event
) -> None:
    r = redis.Redis.from_url(url)
    r.ping()
    ready.set()
    go.wait(60)
    for i in range(n):
        to = names[i % len(names)]
        if ring:  # the entry and the recipient's doorbell, in one round trip
            pipe = r.pipeline(transaction=False)
            pipe.xadd(stream, {"from": "producer", "to": to, "body": body()})
            pipe.xadd(f"{stream}:bell:{to}", {"i": "1"})
            pipe.execute()
        else:
            r.xadd(stream, {"from": "producer", "to": to, "body": body()})
    r.close()


def _raw_shared(ctx: Ctx, members: int, ring: bool) -> Metrics:
    """One stream, one consumer group per consumer (the channel's layout). Without ``ring``
    every consumer blocks on the stream (``XREADGROUP BLOCK``) and acknowledges every entry,
    keeping its own; with ``ring`` each blocks on a doorbell stream of its own (``XREAD
    BLOCK``), then reads its group, everything since its last read, without blocking."""
    n = ctx.size(2_000, 5_000)
    stream = ctx.name(f"fanin-shared-{members}-{int(ring)}")
    names = [f"w{i}" for i in range(members)]
    setup = redis.Redis.from_url(ctx.url)
    for w in names:
        setup.xgroup_create(stream, w, id="$", mkstream=True)
    setup.close()

    async def consume(armed: asyncio.Event, end: Any) -> None:
        r = aredis.Redis.from_url(ctx.url)
        tally = Tally(members, n, armed, end)

        async def consumer(w: str) -> None:
            tally.start()
            seen = "0-0"
            while not tally.finished.is_set():
                if ring:
                    rung: Any = await r.xread({f"{stream}:bell:{w}": seen}, count=1, block=30_000)
                    if not rung:
                        continue
                    seen = rung[0][1][-1][0]
                    got: Any = await r.xreadgroup(w, "c", {stream: ">"}, count=1_000)
                else:
                    got = await r.xreadgroup(w, "c", {stream: ">"}, count=100, block=30_000)
                if got:
                    entries = got[0][1]
                    await r.xack(stream, w, *[e[0] for e in entries])
                    tally.add(sum(1 for e in entries if e[1][b"to"] == w.encode()))

        try:
            await _until(tally.finished, [consumer(w) for w in names])
        finally:
            await r.aclose()

    def start(spawn: Any, ready: Event, go: Event) -> Any:
        args = (ctx.url, stream, names, n, ring, ready, go)
        p = spawn.Process(target=_shared_producer, args=args)
        p.start()
        return p

    return _measure(ctx, n, start, consume)


def raw_fanin_shared(ctx: Ctx) -> Metrics:
    return _raw_shared(ctx, 100, ring=False)


def raw_fanin_bell_scan(ctx: Ctx) -> Metrics:
    return _raw_shared(ctx, 100, ring=True)


# --- redisbus: one channel, one agent per consumer ---------------------------------------------


def _bus_producer(
    url: str, channel: str, names: list[str], n: int, ready: Event, go: Event
) -> None:
    from bench.cases import LIMITS, check
    from redisbus import Bus

    bus = Bus.from_url(url)
    try:
        producer = bus.channel(channel, **LIMITS).join("producer")
        ready.set()
        go.wait(60)
        for i in range(n):
            check(producer.send(names[i % len(names)], body()))
    finally:
        bus.close()


def bus_fanin(ctx: Ctx, members: int = 100) -> Metrics:
    """``members`` agents of one channel, each looping ``wait()`` + ``mark_done()`` as a task
    of one ``AsyncBus``; the producer ``send()``s to each in turn."""
    from bench.cases import LIMITS
    from redisbus import AsyncBus

    n = ctx.size(2_000, 5_000)
    name = ctx.name(f"fanin-{members}")
    names = [f"w{i}" for i in range(members)]

    async def consume(armed: asyncio.Event, end: Any) -> None:
        bus = AsyncBus.from_url(ctx.url)
        try:
            ch = await bus.channel(name, **LIMITS)
            agents = [await ch.join(w) for w in names]
            for a in agents:  # past each handle's first look at its group
                await a.wait(timeout=0)
            tally = Tally(members, n, armed, end)

            async def consumer(a: Any) -> None:
                tally.start()
                while not tally.finished.is_set():
                    got = await a.wait(timeout=30)
                    if got.messages:
                        await a.mark_done(got.messages)
                        tally.add(len(got.messages))

            await _until(tally.finished, [consumer(a) for a in agents])
        finally:
            await bus.aclose()

    def start(spawn: Any, ready: Event, go: Event) -> Any:
        p = spawn.Process(target=_bus_producer, args=(ctx.url, name, names, n, ready, go))
        p.start()
        return p

    return _measure(ctx, n, start, consume)


def bus_fanin_10(ctx: Ctx) -> Metrics:
    return bus_fanin(ctx, 10)


def bus_fanin_1000(ctx: Ctx) -> Metrics:
    return bus_fanin(ctx, 1000)
