"""Shared helpers of the benchmark suite: the run context, payloads and statistics."""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import math
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import redis
import redis.connection

Mode = Literal["quick", "default", "full"]
Metrics = dict[str, float]

T = TypeVar("T")

#: Bytes of filler in every benchmark message body (after the timestamp).
BODY_PAD = "x" * 96


@dataclass
class Ctx:
    """What every measurement gets: where Redis is, how big to go, and unique names."""

    url: str
    mode: Mode
    run_id: str
    own_server: bool
    memory_messages: int
    #: Remarks a measurement makes about what it found (moved into the figure's notes).
    notes: list[str] = field(default_factory=list)
    _seq: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def size(self, quick: int, default: int, full: int | None = None) -> int:
        """Pick a workload size for the current mode."""
        if self.mode == "quick":
            return quick
        if self.mode == "full" and full is not None:
            return full
        return default

    def name(self, tag: str) -> str:
        """A stream/channel name unique to this run (all start with ``bench-<run_id>``)."""
        return f"{self.prefix}-{tag}-{next(self._seq)}"

    @property
    def prefix(self) -> str:
        return f"bench-{self.run_id}"

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)


def settle_heap() -> None:
    """Run the collector's full pass now, before the clock starts.

    A fresh process holds tens of thousands of import-time objects that wait for its first
    full collection, which CPython runs at an arbitrary moment soon after start-up. On the
    machines this suite runs on that pass takes 10-40 ms and lands on whichever message is
    in flight. Both sides of a latency figure (baseline and redisbus, sender and receiver)
    call this once after set-up, so the figure is the steady state, not the start-up.
    Collections while the clock runs still count."""
    gc.collect()


def body(ts_ns: int | None = None) -> str:
    """A message body: a wall-clock timestamp (ns) then filler."""
    return f"{time.time_ns() if ts_ns is None else ts_ns} {BODY_PAD}"


def body_ts(text: str | bytes) -> int:
    """The timestamp a :func:`body` starts with."""
    if isinstance(text, bytes):
        text = text.decode()
    return int(text.split(" ", 1)[0])


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of unsorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


#: The latency distributions of the measurement running now, by metric prefix: each
#: :func:`latency_metrics` call keeps its samples' quantiles here and the runner moves them
#: into the results (``quantiles_us``), where the plots read them.
QUANTILES: dict[str, list[float]] = {}
QUANTILE_POINTS = 201


def quantiles(values: Sequence[float], points: int = QUANTILE_POINTS) -> list[float]:
    """``points`` evenly spaced order statistics, minimum to maximum (a CDF's outline)."""
    ordered = sorted(values)
    if not ordered:
        return []
    last = len(ordered) - 1
    return [round(ordered[round(i * last / (points - 1))], 2) for i in range(points)]


def latency_metrics(samples_ns: Sequence[int], prefix: str = "") -> Metrics:
    """p50/p99/mean in microseconds of nanosecond samples."""
    us = [s / 1000 for s in samples_ns]
    QUANTILES[prefix] = quantiles(us)
    return {
        f"{prefix}p50_us": percentile(us, 50),
        f"{prefix}p99_us": percentile(us, 99),
        f"{prefix}mean_us": statistics.fmean(us) if us else math.nan,
    }


def median(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def used_memory(client: redis.Redis) -> int:
    info: dict[str, Any] = client.info("memory")
    return int(info["used_memory"])


def command_calls(client: redis.Redis) -> int:
    """Total commands the server has executed (sum of INFO commandstats calls)."""
    stats: dict[str, Any] = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values() if isinstance(v, dict))


async def maybe_await(value: T | Awaitable[T]) -> T:
    """Await ``value`` when it is awaitable (async APIs that may be sync or async)."""
    if inspect.isawaitable(value):
        return await value
    return value


class RoundTrips:
    """Counts writes to Redis sockets (one per command or per pipeline) of sync clients, the
    bus's lanes included, and with ``names=True`` the top-level commands they carried."""

    def __init__(self, names: bool = False) -> None:
        self.count = 0
        self.names = names
        self.commands: Counter[str] = Counter()

    @contextmanager
    def counting(self) -> Iterator[RoundTrips]:
        cls = redis.connection.AbstractConnection
        original: Callable[..., None] = cls.send_packed_command

        def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            self.count += 1
            if self.names:
                chunks = command if isinstance(command, list) else [command]
                self.commands.update(command_names(b"".join(bytes(c) for c in chunks)))
            original(conn, command, check_health)

        # the bus's own lanes write straight to their sockets
        from redisbus import _transport_sync as lanes

        lane_write: Callable[..., None] = lanes._sendall

        def lane_counted(sock: Any, data: Any, flags: int = 0) -> None:
            self.count += 1
            if self.names:
                self.commands.update(command_names(bytes(data)))
            lane_write(sock, data)

        cls.send_packed_command = counted  # type: ignore[method-assign]
        lanes._sendall = lane_counted
        try:
            yield self
        finally:
            cls.send_packed_command = original  # type: ignore[method-assign]
            lanes._sendall = lane_write


def command_names(data: bytes) -> list[str]:
    """Names of the RESP commands packed in ``data`` (arrays of bulk strings)."""
    names: list[str] = []
    i = 0
    while i < len(data) and data[i : i + 1] == b"*":
        j = data.index(b"\r\n", i)
        argc, i = int(data[i + 1 : j]), j + 2
        for k in range(argc):
            j = data.index(b"\r\n", i)
            size, i = int(data[i + 1 : j]), j + 2
            if k == 0:
                names.append(data[i : i + size].decode(errors="replace").upper())
            i += size + 2
    return names


# --- publish -> consume in one event loop (FastStream and AsyncBus alike) ---------------------

#: Rate of the paced phase that measures pub/sub latency without a backlog.
PACED_RATE = 500.0


class Sink:
    """What a consumer records: latency of each message from the stamp in its body."""

    def __init__(self) -> None:
        self.lat: list[int] = []
        self.last = 0.0

    def reset(self) -> None:
        self.lat = []

    def add(self, text: str | bytes, now: int | None = None) -> None:
        self.lat.append((time.time_ns() if now is None else now) - body_ts(text))
        self.last = time.perf_counter()

    async def settle(self, expect: int, quiet_s: float = 2.0) -> None:
        """Return once ``expect`` messages arrived, or none arrived for ``quiet_s``."""
        seen, since = -1, time.perf_counter()
        while len(self.lat) < expect:
            if len(self.lat) != seen:
                seen, since = len(self.lat), time.perf_counter()
            elif time.perf_counter() - since > quiet_s:
                return
            await asyncio.sleep(0.005)


async def pubsub_phases(
    publish: Callable[[], Awaitable[object]], sink: Sink, n: int, n_paced: int
) -> Metrics:
    """Throughput: ``n`` publishes back to back until all are consumed. Latency: ``n_paced``
    publishes paced at :data:`PACED_RATE` (so no backlog inflates it). Messages the consumer
    never got are counted as ``missed``."""
    sink.reset()
    start = time.perf_counter()
    for _ in range(n):
        await publish()
    published = time.perf_counter()
    await sink.settle(n)
    got = len(sink.lat)
    end = sink.last if got else time.perf_counter()

    sink.reset()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(n_paced):
        delay = t0 + i / PACED_RATE - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await publish()
    await sink.settle(n_paced)
    return {
        "msgs_per_s": got / (end - start),
        "publish_per_s": n / (published - start),
        "missed": float(n - got + n_paced - len(sink.lat)),
        **latency_metrics(sink.lat),
    }
