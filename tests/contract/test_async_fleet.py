"""150 async agents of one process wait at once on a real redis-server (docs/benchmarks.md:
100 async agents per process), with the bus's default settings."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis

from redisbus import AsyncBus, BusSettings

N = 150


async def test_150_async_agents_wait_at_once_in_one_process(redis_url: str) -> None:
    # given 150 agents of one AsyncBus, default pool
    async with AsyncBus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        ch = await bus.channel(f"fleet-{uuid.uuid4().hex[:6]}")
        boss = await ch.join("boss")
        agents = [await ch.join(f"agent-{i:03d}", parent="boss") for i in range(N)]
        # when every one of them blocks in wait() at the same time
        waits = [asyncio.create_task(a.wait(timeout=60)) for a in agents]
        plain = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 30
        while int(plain.info("clients")["blocked_clients"]) < N:
            assert time.monotonic() < deadline, "the agents never all blocked"
            assert not any(w.done() for w in waits), [w.exception() for w in waits if w.done()]
            await asyncio.sleep(0.02)
        # and a broadcast reaches them
        await boss.send("all", "go")
        results = await asyncio.gather(*waits)
        # then each wakes with it
        assert [r.kind for r in results] == ["message"] * N
        assert {r.messages[0].body for r in results} == {"go"}
        plain.close()
