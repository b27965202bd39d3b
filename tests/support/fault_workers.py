"""Agent processes for the fault tests: each joins one channel under a parent, beats a few
times, says ``{"ready": NAME}`` on stdout, then plays its mode, saying what it saw as one JSON
line per event (each with ``at``, the wall clock). One body for both faces: every call goes
through ``aw``, which awaits what the async face returns and passes the sync face's results on.

    python -m tests.support.fault_workers URL CHANNEL NAME PARENT REPLICA FACE MODE HEARTBEAT_S
    LEASE_S

Modes:
  echo     serve the parent until cancelled: answer each message with "echo BODY"; say every
           wait() that returned something other than a timeout (errors while Redis is away are
           counted, not said)
  finish   read "go" on stdin, then wait() (the task is already there), mark it done, complete
           and say so; then live on (beating) until killed
  replica  read "go" on stdin, then wait(timeout=30) twice, saying each result and how long
           it took; then serve() and say when it returned
"""

from __future__ import annotations

import asyncio
import inspect
import json
import sys
import time
from typing import Any

from redisbus import AsyncBus, Bus, BusSettings, RedisbusError


async def aw(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def say(**kw: Any) -> None:
    print(json.dumps({**kw, "at": time.time()}), flush=True)


async def echo(bus: Any, agent: Any) -> None:
    while True:
        try:
            res = await aw(agent.wait(timeout=0.5))
            if res.kind == "timeout":
                continue
            say(kind=res.kind, bodies=[m.body for m in res.messages])
            if res.kind == "cancelled":
                return
            for m in res.messages:
                if m.type == "message":
                    await aw(agent.send("parent", f"echo {m.body}"))
                await aw(agent.mark_done(m.id))
        except RedisbusError:  # Redis away: the next wait() tries again
            await asyncio.sleep(0.05)


async def finish(bus: Any, agent: Any) -> None:
    await asyncio.to_thread(sys.stdin.readline)
    res = await aw(agent.wait(timeout=10))
    for m in res.messages:
        await aw(agent.mark_done(m.id))
    await aw(agent.complete("done"))
    say(completed=[m.body for m in res.messages])
    await asyncio.sleep(120)


async def replica(bus: Any, agent: Any) -> None:
    await asyncio.to_thread(sys.stdin.readline)
    for _ in range(2):
        t0 = time.monotonic()
        res = await aw(agent.wait(timeout=30))
        say(kind=res.kind, took=time.monotonic() - t0)

    def handle(agent: Any, msg: Any) -> None:
        say(handled=msg.body)

    async def handle_async(agent: Any, msg: Any) -> None:
        handle(agent, msg)

    await aw(bus.serve({agent: handle if isinstance(bus, Bus) else handle_async}, poll_s=0.2))
    say(served="returned")


MODES = {"echo": echo, "finish": finish, "replica": replica}


async def main() -> None:
    url, channel, name, parent, replica_name, face, mode = sys.argv[1:8]
    heartbeat_s, lease_s = float(sys.argv[8]), float(sys.argv[9])
    s = BusSettings(
        metrics=False, heartbeat_s=heartbeat_s, agent_lease_s=lease_s, replica=replica_name
    )
    bus: Any = (
        Bus.from_url(url, settings=s) if face == "sync" else AsyncBus.from_url(url, settings=s)
    )
    ch = await aw(bus.channel(channel))
    agent = await aw(ch.join(name, parent=parent or None))
    await asyncio.sleep(3 * heartbeat_s)  # a few beats: the replica count is known
    say(ready=name)
    try:
        await MODES[mode](bus, agent)
    finally:
        await aw(bus.aclose() if face == "async" else bus.close())


if __name__ == "__main__":
    asyncio.run(main())
