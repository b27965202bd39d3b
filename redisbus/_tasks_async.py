"""What the async face does with tasks where the sync face uses threads: the heartbeat, the
coalescing of concurrent sends, sleeping, stopping and running handlers side by side.

Hand-written per face (the sync twin is ``_tasks_sync``): these are the places where the two
faces truly differ. The code in ``_async/`` uses only the names below, and the generated sync
code gets the twins of the same names."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from . import _bindings as bind
from . import _core as core
from ._bindings import Call
from ._outage import Outage
from ._transport_async import sleep

if TYPE_CHECKING:
    from ._model import Message

__all__ = ["Coalescer", "Event", "Handler", "Heart", "Semaphore", "run_all", "sleep"]

Event = asyncio.Event
Semaphore = asyncio.Semaphore
# what ``serve`` runs for each message: ``await handler(agent, message)``
Handler = Callable[[Any, "Message"], Awaitable[Any]]
#: How long ``Heart.halt`` waits for a beat in flight (the sync face joins its thread as long)
HALT_S = 10.0


async def run_all(calls: Sequence[tuple[str, Callable[[], Awaitable[None]]]]) -> None:
    """Run the named calls side by side (tasks of this loop) until every one returns."""
    await asyncio.gather(*(fn() for _, fn in calls))


class Heart:
    """One task per AsyncBus: every ``period_s`` it hands its local agents, grouped by
    channel, to ``beat`` (which renews their leases and reports lost agents). Started by the
    first join; holds no thread."""

    def __init__(
        self, period_s: float, beat: Callable[[list[dict[str, Any]]], Awaitable[None]]
    ) -> None:
        self.period_s = period_s
        self.beat = beat
        # stream key -> "NAME\nREPLICA" -> handle (two handles of one agent are two replicas)
        self.agents: dict[str, dict[str, Any]] = {}
        self.task: asyncio.Task[None] | None = None
        self.stopped = (
            False  # set by halt/cancel: the task ends at its next turn, and no new one starts
        )

    def add(self, agent: Any) -> None:
        self.agents.setdefault(agent._keys.stream, {})[agent.beat_field] = agent
        if self.task is None and not self.stopped:
            self.task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, agent: Any) -> None:
        self.agents.get(agent._keys.stream, {}).pop(agent.beat_field, None)

    def groups(self) -> list[dict[str, Any]]:
        return [dict(v) for v in self.agents.values() if v]

    def cancel(self) -> None:
        self.stopped = True
        if self.task is not None:
            self.task.cancel()

    async def halt(self) -> None:
        """Stop beating and wait until no beat is in flight (one could renew a lease after
        the caller released it), at most ``HALT_S`` as the sync face's thread join.

        The flag, not only the cancellation, ends the task: a cancellation that lands in a
        client library's own timeout or error handling can come out as an ordinary error,
        which the loop below logs and survives; waiting on the task alone then hung
        ``aclose()`` for good (seen on a Cluster after its connections were killed)."""
        self.stopped = True
        task, self.task = self.task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=HALT_S)

    async def _run(self) -> None:
        outage = Outage("heartbeat", self.period_s)
        while not self.stopped:
            await asyncio.sleep(outage.pause(self.period_s))
            if self.stopped:
                return
            try:
                await self.beat(self.groups())
            except Exception as e:  # never let the heartbeat die: the agents would look lost
                if not self.stopped:
                    outage.failed(e)
            else:
                outage.succeeded()


class Coalescer:
    """Sends issued by concurrent tasks in the same loop turn go out as one pipeline.

    A hundred agents in one process each awaiting ``send()`` would otherwise pay a round trip
    apiece; here sends that arrive while one is in flight queue up, and a flush task sends
    them as one batch (sends to the same channel merged into one send.lua call). A send that
    finds nothing in flight, on a bus with a lane, goes out at once from its own task: no
    flush task, two loop turns fewer. Each send still gets its own reply or typed error, and
    a cancelled send never takes another task's send down with it. Only sends that are not
    retried (no idempotency key) are coalesced, and only on a standalone server (Cluster
    pipelines cannot carry EVALSHA safely).
    """

    def __init__(self, io: Any) -> None:
        self.io = io  # the bus's IO: ``_async/io.py``, whose package imports this module
        self.queue: list[tuple[str, Sequence[str], Sequence[Any], asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.lone = False  # a lone send is in flight from its caller's task

    async def send(self, call: Call, *, idempotent: bool) -> Any:
        """One send.lua call: coalesced unless it is retried (an idempotency key) or on a
        Cluster, where it goes alone; retried only with an idempotency key, like the sync
        face (a send whose reply was lost may have been written)."""
        if not idempotent and not self.io.cluster:
            return await self.script(*call)
        return await self.io.script(*call, retry=idempotent)

    async def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        loop = asyncio.get_running_loop()
        idle = not self.lone and not self.queue and (self.task is None or self.task.done())
        if idle and self.io.transport.lane is not None:
            self.lone = True
            try:
                (reply,) = await self.io.scripts_raw([(name, keys, args)])
            finally:
                self.lone = False
                if self.queue:  # sends that came while this one was in flight
                    self.task = loop.create_task(self._flush())
            if isinstance(reply, Exception):
                raise reply
            return reply
        fut: asyncio.Future[Any] = loop.create_future()
        self.queue.append((name, keys, args, fut))
        if not self.lone and (self.task is None or self.task.done()):
            self.task = loop.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the other ready tasks queue their sends first
        while self.queue:
            batch, self.queue = self.queue, []
            calls, sizes = self._merged(batch)
            try:
                merged = await self.io.scripts_raw(calls)
            except Exception as e:  # the whole pipeline failed: every send in it did
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            replies = core.split_replies(sizes, merged)
            for (*_, fut), reply in zip(batch, replies, strict=True):
                if fut.done():
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)

    @staticmethod
    def _merged(
        batch: list[tuple[str, Sequence[str], Sequence[Any], asyncio.Future[Any]]],
    ) -> tuple[list[tuple[str, list[str], list[Any]]], list[int]]:
        """Runs of sends to the same channel become one send.lua call of up to SEND_BATCH
        messages (checked in order, as separate calls would be), given the doorbells each was
        given; anything else goes alone. Returns the calls and how many queued calls each one
        carries."""
        calls: list[tuple[str, list[str], list[Any]]] = []
        sizes: list[int] = []
        given: set[str] = set()  # the doorbells the last call holds
        fixed = bind.SEND_FIXED
        for name, keys, args, _ in batch:
            if (
                name == "send"
                and calls
                and calls[-1][0] == "send"
                and calls[-1][1][0] == keys[0]  # the same channel: its stream names the rest
                and sizes[-1] < core.SEND_BATCH
            ):
                merged = calls[-1][1]
                for i in range(fixed, len(keys), 2):
                    if keys[i] not in given:
                        given.add(keys[i])
                        merged += (keys[i], keys[i + 1])
                calls[-1][2].extend(args)
                sizes[-1] += 1
            else:
                calls.append((name, list(keys), list(args)))
                given = set(keys[fixed::2]) if name == "send" else set()
                sizes.append(1)
        return calls, sizes
