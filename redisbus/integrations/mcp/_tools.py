"""The six tools, bound to one agent: what each call does on the bus, without the MCP plumbing.

Two things here outlast a single call:

- the agent's membership. Redis may come back empty (a restart without persistence, a
  failover to an empty replica, a FLUSHALL); the agent and its channel are then gone, and a
  handle that went on as before would read an empty board and be unknown to everyone. Each
  call first checks that the agent is still a member and, if not, joins it again (creating the
  channel with the settings' limits, as the first join did).
- what ``agent_wait`` handed out, so a wait can resume: MCP clients abandon long tool calls, and
  a result they never received must not be lost (see :class:`Handouts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar, Unpack, cast

import anyio
from mcp.server.mcpserver.exceptions import ToolError

from ... import AsyncAgent, BusConnectionError, LimitExceeded, RedisbusError, SendOptions
from ..._model import SEND_TYPES
from ._schema import (
    FRAMING,
    WAIT_DEFAULT_S,
    WAIT_MAX_S,
    DiscoverOut,
    DoneOut,
    MessageOut,
    MessagesOut,
    ReceiptOut,
    SendOut,
    WaitOut,
)

log = logging.getLogger("redisbus.mcp")

_T = TypeVar("_T")
_P = ParamSpec("_P")

# Ids already handed to the model, so a wait does not hand them out again (at-least-once delivery
# may repeat an entry; so does the core today after a read). Bounded: oldest forgotten first.
SEEN_CAP = 4096

# Messages agent_wait keeps for replay (bodies up to the channel's limit each): a cursor older
# than that replays only what is kept (agent_read_messages with 'all' still shows the rest).
HANDOUTS_CAP = 512

# A waiting agent_wait reports progress this often, when the client asked for progress.
PROGRESS_EVERY_S = 5.0

# agent_wait holds the agent's lock for at most this long at a time, so a send from another
# session of the same server is not stuck behind a long wait.
WAIT_SLICE_S = 1.0

# Where a tool call's log notifications go: set per request by the server (see _server.py), so
# that a re-join is reported to the session whose call found it. Unset: only the Python log.
LogSink = Callable[[str, str], Awaitable[None]]
log_sink: ContextVar[LogSink | None] = ContextVar("redisbus_mcp_log_sink", default=None)


async def emit(level: str, text: str) -> None:
    getattr(log, "warning" if level == "notice" else level, log.info)(text)
    sink = log_sink.get()
    if sink is not None:
        await sink(level, text)


def tool_error(e: RedisbusError) -> ToolError:
    """The typed reason first, so a model (or a script) can act on it; a limit's str() carries
    its limit, current value and retry time already."""
    return ToolError(f"{e.code}: {e}")


def _receipt(r: Any) -> ReceiptOut:
    d = cast(ReceiptOut, r.as_dict())
    err = r.error
    if isinstance(err, LimitExceeded) and err.retry_after_s is not None:
        d["retry_after_s"] = err.retry_after_s
    return d


def dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, default=str)


def _as_text(
    tool: Callable[Concatenate[_T, _P], Awaitable[Any]],
) -> Callable[Concatenate[_T, _P], Awaitable[str]]:
    """The tool method ``tool`` with its result as JSON text (``dump``)."""

    async def as_text(self: _T, /, *args: _P.args, **kw: _P.kwargs) -> str:
        return dump(await tool(self, *args, **kw))

    return as_text


@dataclass
class Card:
    """What a re-join needs besides the handle: the agent card given at the first join."""

    description: str = ""
    skills: Sequence[str] = ()


@dataclass
class Handouts:
    """What agent_wait handed out, in order, so a later wait can resume after a cursor.

    A cursor is ``<run>.<n>``: ``n`` counts the batches handed out by this server process
    (``run`` tells processes apart). Waiting "after ``run.n``" first returns every batch past
    ``n`` again, in case the caller never received them; a cursor of another run (the server
    restarted) has nothing to replay, the bus itself re-delivers what was never marked done.
    """

    run: str = field(default_factory=lambda: secrets.token_hex(4))
    count: int = 0
    batches: deque[tuple[int, str, list[Any]]] = field(default_factory=deque)
    kept: int = 0  # messages in batches

    @property
    def cursor(self) -> str:
        return f"{self.run}.{self.count}"

    def add(self, kind: str, messages: list[Any]) -> None:
        self.count += 1
        self.batches.append((self.count, kind, messages))
        self.kept += len(messages)
        while self.kept > HANDOUTS_CAP and len(self.batches) > 1:
            self.kept -= len(self.batches.popleft()[2])

    def after(self, cursor: str) -> tuple[str, list[Any]] | None:
        """The batches past ``cursor`` merged (kind, messages), or None when there are none."""
        run, _, n = cursor.partition(".")
        if not (run and n.isdigit() and len(cursor) <= 64):
            raise ToolError(
                f"invalid_input: cursor must be one returned by agent_wait, got {cursor!r}"
            )
        if run != self.run:
            return None
        later = [b for b in self.batches if b[0] > int(n)]
        if not later:
            return None
        kinds = {k for _, k, _ in later}
        kind = next((k for k in ("cancelled", "outcome", "message") if k in kinds), later[0][1])
        return kind, [m for _, _, ms in later for m in ms]


class AgentTools:
    """The six tools, bound to one agent handle. The public methods return JSON text; the
    ``*_out`` ones the same result as a dict (the structured content).

    One lock serialises the calls on the handle (it keeps a little unsettled bookkeeping
    between calls); waits take it in short slices.
    """

    def __init__(self, agent: AsyncAgent, card: Card | None = None) -> None:
        self.agent = agent
        self.card = card or Card()
        self._lock = asyncio.Lock()
        self._seen: dict[str, None] = {}  # insertion-ordered set
        self.handouts = Handouts()

    # -- membership -------------------------------------------------------------------------
    async def _ensure_member(self) -> None:
        """Join again when Redis no longer knows this agent (it came back empty). Call with
        the lock held."""
        a = self.agent
        bus = a.channel.bus
        for attempt in (1, 2):  # the first command after a restart may meet a dead connection
            try:
                if await bus.redis.hexists(a.channel.keys.members, a.name):
                    return
                break
            except Exception as e:  # redis-py's errors: this check bypasses the bus's wrapper
                if attempt == 2:
                    raise BusConnectionError(f"Redis unreachable: {e}") from e
        ch = await bus.channel(a.channel.name)
        self.agent = await ch.join(
            a.name,
            parent=a.parent,
            replica=a.replica,
            description=self.card.description,
            skills=list(self.card.skills),
        )
        await emit(
            "warning",
            f"redisbus: Redis no longer knew agent '{a.name}' on channel '{ch.name}' (it lost "
            "its data); joined again. Messages sent before the loss are gone.",
        )

    async def _call(self, fn: Callable[[AsyncAgent], Awaitable[Any]]) -> Any:
        try:
            async with self._lock:
                await self._ensure_member()
                return await fn(self.agent)
        except RedisbusError as e:
            raise tool_error(e) from e

    # -- results ----------------------------------------------------------------------------
    def _remember(self, messages: Sequence[Any]) -> None:
        for m in messages:
            self._seen[m.id] = None
        while len(self._seen) > SEEN_CAP:
            del self._seen[next(iter(self._seen))]

    def _framed(self, messages: Sequence[Any], preview: bool = False) -> MessagesOut:
        out: MessagesOut = {
            "agent": self.agent.name,
            "channel": self.agent.channel.name,
            "count": len(messages),
            "messages": [cast(MessageOut, m.as_dict()) for m in messages],
        }
        if preview:
            out["preview"] = True
        if messages:
            out["note"] = FRAMING
        return out

    # -- the tools --------------------------------------------------------------------------
    async def send_message_out(
        self, to: str | list[str], message: str, **options: Unpack[SendOptions]
    ) -> SendOut:
        kind = options.get("type", "message")
        if kind not in SEND_TYPES:
            raise ToolError(
                f"invalid_input: type must be one of {', '.join(SEND_TYPES)}, got {kind!r}"
            )
        res = await self._call(lambda a: a.send(to, message, **options))
        receipts = res if isinstance(res, list) else [res]
        if not any(r.id for r in receipts):
            if not receipts:
                raise ToolError("unknown_agent: nobody you can reach is on the channel")
            reasons = "; ".join(f"{r.to}: {r.error.code}: {r.error}" for r in receipts if r.error)
            raise ToolError(
                f"{receipts[0].error.code if receipts[0].error else 'error'}: "
                f"every recipient refused: {reasons}"
            )
        sent = [r for r in receipts if r.id]
        return {
            "from": self.agent.name,
            "message_id": sent[0].id,
            "delivered_to": [r.to for r in sent],
            "refused": [_receipt(r) for r in receipts if not r.id],
            "receipts": [_receipt(r) for r in receipts],
        }

    async def read_messages_out(
        self, filter_by: str = "unread", since: str | None = None, limit: int = 20
    ) -> MessagesOut:
        msgs = await self._call(
            lambda a: a.read(filter_by=filter_by or None, since=since or None, limit=limit)
        )
        self._remember(msgs)
        return self._framed(msgs)

    async def list_messages_out(
        self, filter_by: str = "all", since: str | None = None, limit: int = 50
    ) -> MessagesOut:
        msgs = await self._call(
            lambda a: a.list(filter_by=filter_by or None, since=since or None, limit=limit)
        )
        return self._framed(msgs, preview=True)

    async def mark_done_out(self, message_id: str | list[str], result: str = "ok") -> DoneOut:
        ids = [message_id] if isinstance(message_id, str) else list(message_id)
        changed = await self._call(lambda a: a.mark_done(ids, result=result))
        return {"done": ids, "changed": bool(changed), "result": result}

    async def wait_out(
        self,
        timeout: float = WAIT_DEFAULT_S,
        cursor: str | None = None,
        progress: Callable[[float, float], Awaitable[None]] | None = None,
    ) -> WaitOut:
        """``progress(elapsed_s, timeout_s)`` is called every PROGRESS_EVERY_S while waiting:
        clients that reset their time limit on progress then keep a long wait alive."""
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not (0 <= timeout <= WAIT_MAX_S)
        ):
            raise ToolError(
                f"invalid_input: timeout must be 0..{WAIT_MAX_S:g} seconds, got {timeout!r} "
                "(a longer wait: call agent_wait again with the cursor it returns)"
            )
        if cursor:
            again = self.handouts.after(cursor)
            if again is not None:
                return self._waited(*again, replayed=True)
        started = time.monotonic()
        deadline = started + float(timeout)
        report_at = started + PROGRESS_EVERY_S
        while True:
            now = time.monotonic()
            if progress is not None and now >= report_at:
                report_at = now + PROGRESS_EVERY_S
                with contextlib.suppress(Exception):  # progress is a courtesy
                    await progress(round(now - started, 1), float(timeout))
            remaining = max(0.0, deadline - time.monotonic())
            slice_s = min(remaining, WAIT_SLICE_S)
            # Shielded: a call the client abandons (or cancels) ends after this slice, with
            # what the slice fetched recorded for the next wait to replay, never dropped.
            with anyio.CancelScope(shield=True):
                res = await self._call(lambda a, s=slice_s: a.wait(s))  # type: ignore[misc]
                fresh = [m for m in res.messages if m.id not in self._seen]
                if fresh or res.kind == "cancelled":
                    self._remember(fresh)
                    self.handouts.add(res.kind, fresh)
            if fresh or res.kind == "cancelled":
                return self._waited(res.kind, fresh)
            if remaining <= WAIT_SLICE_S:
                out = self._waited("timeout", [])
                out["hint"] = (
                    f"nothing arrived within {timeout:g} s; to keep waiting, call agent_wait "
                    f"again with cursor={out['cursor']!r}"
                )
                return out

    def _waited(self, kind: str, messages: list[Any], replayed: bool = False) -> WaitOut:
        framed = self._framed(messages)
        out: WaitOut = {
            "agent": framed["agent"],
            "channel": framed["channel"],
            "kind": kind,
            "cursor": self.handouts.cursor,
            "count": framed["count"],
            "messages": framed["messages"],
        }
        if replayed:
            out["replayed"] = True
        if "note" in framed:
            out["note"] = framed["note"]
        return out

    async def discover_out(self, query: str = "", limit: int = 10) -> DiscoverOut:
        found = await self._call(lambda a: a.discover(query, limit))
        return {
            "you": self.agent.name,
            "query": query,
            "agents": [m.as_dict() for m in found],
        }

    # -- the same, as JSON text -------------------------------------------------------------
    send_message = _as_text(send_message_out)
    read_messages = _as_text(read_messages_out)
    list_messages = _as_text(list_messages_out)
    mark_done = _as_text(mark_done_out)
    wait = _as_text(wait_out)
    discover = _as_text(discover_out)
