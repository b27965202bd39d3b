"""Closing a bus always ends, whatever its heartbeat is doing.

``AsyncBus.aclose()`` stops the heartbeat task before it releases the replicas' leases. It used
to wait for the task's cancellation alone; when the cancel landed inside a client library's
own timeout or error handling and came out as an ordinary error, the heartbeat loop logged it
and slept on, and ``aclose()`` waited for good (seen in the suite: a Cluster bus after its
connections were killed, and a fakeredis bus under load, each hung past the 300 s test
timeout with the loop asleep on the heartbeat's period)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from redisbus import AsyncBus, BusSettings, _tasks_async, _tasks_sync
from tests.support.servers import Server


def run_bounded(coro: Any, timeout: float = 20) -> Any:
    """``asyncio.run(coro)`` in a thread of its own, failing the test (not hanging it) when
    it has not returned within ``timeout``: the bug was a close that never returned."""
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(coro)), daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still running after {timeout} s: the bus never closed"
    assert out, "the coroutine raised (see the thread's traceback above)"
    return out[0]


BEAT: dict[str, Any] = {
    "heartbeat_s": 0.05,
    "agent_lease_s": 5.0,
    "metrics": False,
    "host": "test-host",
}


async def _close_with_beat(
    server: Server, beat: Any, started: asyncio.Event
) -> tuple[float, list[asyncio.Task[Any]]]:
    bus = AsyncBus.from_url(server.url, settings=BusSettings(**BEAT))
    agent = await (await bus.channel("close-beat")).join("a")
    bus._heart.beat = beat
    await asyncio.wait_for(started.wait(), 5)  # a beat is in flight when the bus closes
    t0 = time.monotonic()
    await asyncio.wait_for(bus.aclose(), 30)
    took = time.monotonic() - t0
    await asyncio.sleep(0.3)  # several heartbeat periods: nothing may beat any more
    alive = [
        t
        for t in asyncio.all_tasks()
        if t is not asyncio.current_task() and "_run" in repr(t.get_coro())
    ]
    assert agent.name == "a"
    return took, alive


def test_aclose_ends_when_the_beat_turns_its_cancellation_into_an_error(redis7: Server) -> None:
    # given: a heartbeat whose beat, cancelled, raises an ordinary error (as a library's
    # timeout or connection handling can), so the heartbeat loop would survive the cancel
    calls = []
    started = asyncio.Event()

    async def beat(groups: Any) -> None:
        calls.append(time.monotonic())
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise ConnectionError("the cancel came out as a connection error") from None

    # when: the bus closes mid-beat
    took, alive = run_bounded(_close_with_beat(redis7, beat, started))
    # then: aclose returned at once, the heartbeat task is gone and beat no more
    assert took < 2, took
    assert not alive, alive
    n = len(calls)
    time.sleep(0.2)
    assert len(calls) == n


def test_aclose_gives_up_on_a_beat_that_ignores_its_cancellation(
    redis7: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a beat that swallows every cancellation and runs on (bounded here to 5 s), and a
    # halt bound of half a second
    monkeypatch.setattr(_tasks_async, "HALT_S", 0.5)
    started = asyncio.Event()

    async def beat(groups: Any) -> None:
        started.set()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    # when: the bus closes mid-beat
    took, _ = run_bounded(_close_with_beat(redis7, beat, started))
    # then: aclose returned after the bound (the sync face joins its thread as long), not
    # after the beat
    assert 0.4 < took < 3, took


def test_both_faces_wait_for_a_beat_in_flight_equally_long() -> None:
    assert getattr(_tasks_async, "HALT_S", 0) == getattr(_tasks_sync, "HALT_S", 1)
