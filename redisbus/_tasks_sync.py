"""What the sync face does with threads where the async face uses tasks: the heartbeat, the
sends (no coalescing: each goes from its caller's thread), sleeping, stopping and running
handlers side by side.

Hand-written per face (the async twin is ``_tasks_async``): these are the places where the
two faces truly differ. The generated code in ``_sync/`` uses only the names below."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._bindings import Call
from ._outage import Outage
from ._transport_sync import sleep

if TYPE_CHECKING:
    from ._model import Message

__all__ = ["Coalescer", "Event", "Handler", "Heart", "Semaphore", "run_all", "sleep"]

Event = threading.Event
Semaphore = threading.Semaphore
# what ``serve`` runs for each message: ``handler(agent, message)``
Handler = Callable[[Any, "Message"], Any]


def run_all(calls: Sequence[tuple[str, Callable[[], None]]]) -> None:
    """Run the named calls side by side (one daemon thread each) until every one returns."""
    threads = [
        threading.Thread(target=fn, daemon=True, name=f"redisbus-serve-{name}")
        for name, fn in calls
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


#: How long ``Heart.halt`` waits for a beat in flight (the async face waits its task as long)
HALT_S = 10.0


class Heart:
    """One thread per Bus: every ``period_s`` it hands its local agents, grouped by channel, to
    ``beat`` (which renews their leases and reports lost agents). Started by the first join."""

    def __init__(self, period_s: float, beat: Callable[[list[dict[str, Any]]], None]) -> None:
        self.period_s = period_s
        self.beat = beat
        # stream key -> "NAME\nREPLICA" -> handle (two handles of one agent are two replicas)
        self.agents: dict[str, dict[str, Any]] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def add(self, agent: Any) -> None:
        with self.lock:
            self.agents.setdefault(agent._keys.stream, {})[agent.beat_field] = agent
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="redisbus-heartbeat", daemon=True
                )
                self.thread.start()

    def remove(self, agent: Any) -> None:
        with self.lock:
            self.agents.get(agent._keys.stream, {}).pop(agent.beat_field, None)

    def groups(self) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(v) for v in self.agents.values() if v]

    def cancel(self) -> None:
        self.stop.set()

    def halt(self) -> None:
        """Stop beating and wait until no beat is in flight (one could renew a lease after
        the caller released it)."""
        self.stop.set()
        t = self.thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=HALT_S)

    def _run(self) -> None:
        outage = Outage("heartbeat", self.period_s)
        while not self.stop.wait(outage.pause(self.period_s)):
            try:
                self.beat(self.groups())
            except Exception as e:  # never let the heartbeat die: the agents would look lost
                outage.failed(e)
            else:
                outage.succeeded()


class Coalescer:
    """The sync face sends from its caller's thread, on the socket lane: nothing to batch."""

    def __init__(self, io: Any) -> None:
        self.io = io  # the bus's IO: ``_sync/io.py``, whose package imports this module

    def send(self, call: Call, *, idempotent: bool) -> Any:
        """One send.lua call, retried only when it carries an idempotency key."""
        return self.io.script(*call, retry=idempotent)
