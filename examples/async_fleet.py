"""A fleet of 100 async agents in one process: each messages its neighbour, all wait at once.

REDISBUS_URL=redis://localhost:6379/0 python examples/async_fleet.py
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid

from redisbus import AsyncAgent, AsyncBus
from redisbus.embedded import EmbeddedRedis

N = 100


async def main(url: str) -> None:
    # each waiting agent holds a connection while it blocks: the bus's pool has room for
    # BusSettings.max_connections (2000 by default) of them
    async with AsyncBus.from_url(url) as bus:
        ch = await bus.channel(f"example-fleet-{uuid.uuid4().hex[:6]}")
        agents = [await ch.join(f"agent-{i:03d}") for i in range(N)]
        t0 = time.perf_counter()

        async def turn(i: int, me: AsyncAgent) -> str:
            await me.send(f"agent-{(i + 1) % N:03d}", f"hello from {me.name}")
            got = await me.wait(timeout=10)  # holds no thread while it waits
            await me.mark_done(got.messages)
            return got.messages[0].sender

        senders = await asyncio.gather(*(turn(i, a) for i, a in enumerate(agents)))
        took = time.perf_counter() - t0
        assert senders == [f"agent-{(i - 1) % N:03d}" for i in range(N)]
        print(f"{N} agents: {N} messages sent, received and done in {took * 1000:.0f} ms")


if __name__ == "__main__":
    url = os.environ.get("REDISBUS_URL")
    server = None if url else EmbeddedRedis.start()  # no REDISBUS_URL: a private Redis
    try:
        asyncio.run(main(url or server.url))  # type: ignore[union-attr]
    finally:
        if server is not None:
            server.stop()
