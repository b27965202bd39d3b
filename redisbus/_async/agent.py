"""``AsyncAgent``: a handle bound to one agent identity: send, read, wait, mark done, family.

The state and the parsing of fetched entries live in ``_agent.AgentState``; the fetch and the
reclaim of pending entries in ``fetching.Fetching``, its base; this module holds the calls of
the public API."""

from __future__ import annotations

import builtins
import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, Unpack, overload

from .. import _bindings as bind
from .. import _core as core
from .. import _otel as otel
from .. import _validate as check
from .._agent import LOOK_BACKOFF, give_back_consumer, message_ids
from .._errors import AskTimeout, InvalidInput, RedisbusError
from .._model import ChildrenResult, Member, Message, Receipt, Roster, SendOptions, WaitResult
from .._tasks_async import sleep
from .fetching import Fetching

__all__ = ["AsyncAgent"]

log = logging.getLogger("redisbus")

# what a waiting agent may show; terminal statuses come from complete()/fail()/cancel()
WAIT_STATUSES = ("waiting", "idle")


class AsyncAgent(Fetching):
    """A handle bound to one agent identity; every message it sends carries that identity."""

    # -- sending ----------------------------------------------------------------------------
    # What send returns, for the type checker: one Receipt for one name (or "parent"); a list
    # for "all" (the literal: a str holding "all" is typed as one name) or a list of names.
    @overload
    async def send(  # type: ignore[overload-overlap]
        self, to: Literal["all"], body: str, **options: Unpack[SendOptions]
    ) -> builtins.list[Receipt]: ...
    @overload
    async def send(self, to: str, body: str, **options: Unpack[SendOptions]) -> Receipt: ...
    @overload
    async def send(
        self, to: builtins.list[str] | tuple[str, ...], body: str, **options: Unpack[SendOptions]
    ) -> builtins.list[Receipt]: ...
    @overload
    async def send(
        self, to: str | Sequence[str], body: str, **options: Unpack[SendOptions]
    ) -> Receipt | builtins.list[Receipt]: ...
    async def send(
        self,
        to: str | Sequence[str],
        body: str,
        *,
        subject: str = "",
        type: str = "message",
        priority: int = 0,
        reply_to: str | None = None,
        ttl_s: float | None = None,
        idempotency_key: str | None = None,
        trace: str | None = None,
        await_delivery: float | None = None,
        durable: bool | None = None,
    ) -> Receipt | builtins.list[Receipt]:
        """Send to a name, ``"parent"``, a list of names or ``"all"``.

        Returns one ``Receipt`` for a single name, else a list in roster (or given) order.
        A single recipient's refusal raises; list and broadcast refusals are per receipt.

        ``durable=True`` (or ``BusSettings.durable``) waits until ``durable_replicas`` replicas
        acknowledged the write (``WAIT``); ``Receipt.durable`` says whether they did. A durable
        send carries an idempotency key (one is made when none is given), so it is retried
        safely across connection drops and failovers.
        """
        span = None
        if otel.on:  # the one test the send path pays when tracing is off (see _otel)
            span, trace = otel.start_send(self.channel.name, self.name, trace)
        try:
            if durable is None:
                durable = self._bus.settings.durable
            if durable and idempotency_key is None:
                idempotency_key = core.new_agent_id().replace("ag-", "auto-")
            try:  # a refusal counts whether the client or the script makes it
                plan = core.plan_send(
                    self.name,
                    to,
                    body,
                    subject=subject,
                    type=type,
                    priority=priority,
                    reply_to=reply_to,
                    ttl_s=ttl_s,
                    idempotency_key=idempotency_key,
                    trace=trace,
                    signer=self._bus._signer,
                    channel=self.channel.name,
                    parent=self.parent,
                    cause=self._cause(),
                )
                wait_s = (
                    None
                    if await_delivery is None
                    else check.seconds(await_delivery, "await_delivery")
                )
                reply = await self._bus._coalescer.send(
                    bind.send(self._send_keys_to(plan), [plan.argv]),
                    idempotent=idempotency_key is not None,
                )
                result = core.parse_send(plan, reply)
                if isinstance(result, Receipt):
                    if result.to != plan.names[0]:
                        self._resolved(plan.names[0], result.to)
                elif plan.mode == "all":
                    self._reached([plan], [result])
            except RedisbusError as e:
                self._bus.metrics.rejected(e.code)
                raise
            if isinstance(result, Receipt):  # one recipient, accepted (a refusal raised above)
                self._bus.metrics.sent(type)
            else:
                self._count(result, type)
            if durable:
                s = self._bus.settings
                reached = await self._bus._io.replicate(
                    self._keys.stream, s.durable_replicas, s.durable_timeout_s
                )
                if not reached:
                    log.warning(
                        "redisbus: durable send to %s: fewer than %d replicas acknowledged",
                        plan.names or "all",
                        s.durable_replicas,
                    )
                result = core.with_durable(result, reached)
            if wait_s:
                result = await self._await_delivery(result, wait_s)
        except BaseException as e:
            if span is not None:
                otel.end_send(span, None, e)
            raise
        if span is not None:
            otel.end_send(span, result, None)
        return result

    async def send_many(
        self, items: Iterable[Mapping[str, Any] | tuple[Any, ...]]
    ) -> builtins.list[Receipt | builtins.list[Receipt]]:
        """Send a batch in one round trip (on a standalone server): each item is ``(to, body)``
        or a dict of ``send`` arguments. Returns one result per item, in order, as ``send``
        would (a Receipt, or a list of them); a refused item gives rejected receipts (with
        ``.error``) instead of raising."""
        span = None
        # only what plan_batch would take as a batch is copied: it refuses anything else
        if otel.on and isinstance(items, Iterable) and not isinstance(items, str | bytes | Mapping):
            items = builtins.list(items)
            span, header = otel.start_send(self.channel.name, self.name, None, len(items))
            if header is not None:
                items = otel.with_trace(items, header)
        try:
            sent, types = core.plan_batch(
                self.name, items, self._bus._signer, self.channel.name, self.parent, self._cause()
            )
            if not sent:
                out: builtins.list[Receipt | builtins.list[Receipt]] = []
            else:
                replies = core.unbatch(
                    sent,
                    await self._bus._io.scripts_raw(core.batch_calls(self._send_keys_for, sent)),
                )
                out, counts, refused = core.batch_results(sent, types, replies)
                self._reached(sent, out)
                self._count_batch(counts, refused)
        except BaseException as e:
            if span is not None:
                otel.end_send(span, None, e)
            raise
        if span is not None:
            otel.end_send(span, out, None)
        return out

    async def ask(
        self,
        to: str,
        body: str,
        *,
        timeout: float | None = None,
        **send_kwargs: Unpack[SendOptions],
    ) -> Message:
        """Send a ``request`` to one agent and return its reply: the first message to this
        agent whose ``reply_to`` is the request's id. Raises ``AskTimeout`` (with the request's
        id) when none comes within ``timeout`` (default ``wait_timeout_s``, at most 300 s); a
        refused request raises as ``send`` does.

        Other messages that arrive meanwhile are not taken: ask() watches the stream without
        the agent's group, then reads only the reply, so they stay unread for the next
        ``wait()`` or ``read()``."""
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        if not isinstance(to, str) or to == "all":
            raise InvalidInput("ask() sends to one agent: give its name (or 'parent')")
        send_kwargs.setdefault("type", "request")
        receipt = await self.send(to, body, **send_kwargs)
        request_id = receipt.id
        deadline = time.monotonic() + t
        cursor = request_id
        while True:
            block_ms = int(min(deadline - time.monotonic(), 5.0) * 1000)
            if block_ms < 1:
                raise AskTimeout(
                    f"no reply to {request_id} from {to} within {t:g} s", request_id=request_id
                )
            entries = await self._bus._io.watch(self._keys.stream, cursor, block_ms)
            for entry_id, f in entries:
                if f and f.get("r") == request_id and core.addressed_to(f, self.name):
                    reply = await self._take_reply(entry_id)
                    if reply is not None:
                        return reply
            if entries:
                cursor = entries[-1][0]

    async def _take_reply(self, entry_id: str) -> Message | None:
        """Read the one entry ``entry_id`` (it becomes read, as read() makes it): the view
        starts just before it and returns one message, so later ones stay unread."""
        got = await self._view(
            "to:me", core.id_before(entry_id), 1, pull=True, mark=True, preview=None
        )
        if not got or got[0].id != entry_id:
            return None
        return got[0] if got[0].read else dataclasses.replace(got[0], read=True)

    async def _await_delivery(self, result: Any, wait_s: float) -> Any:
        receipts = result if isinstance(result, list) else [result]
        entry = next((r.id for r in receipts if r.id), None)
        if entry is None:
            return result
        deadline = time.monotonic() + wait_s
        pause = 0.002
        while True:
            current = {r.to: r for r in await self.receipt(entry)}
            fresh = [current.get(r.to, r) if r.id else r for r in receipts]
            if (
                all(r.status != "queued" for r in fresh if r and r.id)
                or time.monotonic() >= deadline
            ):
                return fresh if isinstance(result, list) else fresh[0]
            await sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)

    # -- receiving --------------------------------------------------------------------------
    async def read(
        self, filter_by: str | None = "unread", since: str | None = None, limit: int = 100
    ) -> builtins.list[Message]:
        """Messages matching the filter; those addressed to this agent become read."""
        out = await self._view(filter_by, since, limit, pull=True, mark=True, preview=None)
        await self._settle_rejected()
        return out

    async def list(
        self,
        filter_by: str | None = "all",
        since: str | None = None,
        limit: int = 100,
        preview_chars: int | None = 200,
    ) -> builtins.list[Message]:
        """Headers and read flags; changes nothing. Bodies are cut to ``preview_chars``."""
        if preview_chars is not None:
            check.integer(preview_chars, "preview_chars", 0, 1 << 20)
        out = await self._view(
            filter_by, since, limit, pull=False, mark=False, preview=preview_chars
        )
        await self._settle_rejected()
        return out

    async def flush(self) -> None:
        """Write pending bookkeeping (read marks, acks of others' entries) now."""
        calls = self._settle_calls()
        if calls:
            await self._bus._io.scripts(calls)
            self._deferred.clear()

    async def _settle_rejected(self) -> None:
        """Settle now what the call rejected (a forged, copied or malformed entry), with the
        rest of the bookkeeping: its sender's receipt says rejected when the call returns."""
        if self._rejected:
            self._rejected = False
            await self.flush()

    async def wait(self, timeout: float | None = None, *, status: str = "waiting") -> WaitResult:
        """Block until a message for this agent, a child's outcome, its own cancellation, or
        the timeout (default 30 s, at most 300 s). Never polls: one blocking read at a time (on
        the async face, holding no thread).

        While blocked the agent shows ``status`` ("waiting", or "idle" for a served agent) and
        releases its concurrency slot, if it has one. Any other status is ``InvalidInput``
        (finishing is ``complete()``/``fail()``, never a wait).
        """
        result = await self._wait(timeout, status)
        await self._settle_rejected()
        return result

    async def _wait(self, timeout: float | None, status: str) -> WaitResult:
        if status not in WAIT_STATUSES:
            raise InvalidInput(
                f"wait status must be one of {', '.join(WAIT_STATUSES)}, got {status!r}"
            )
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        if self._cancelled:
            return WaitResult("cancelled", [])
        if self._held:
            msgs, self._held = self._held, []
            return WaitResult(core.wait_kind(self.name, msgs), msgs)
        if otel.on:
            self._wait_ns = otel.now_ns()
        deadline = time.monotonic() + t
        if not self._recovered or self._pel_dirty:
            # Own pending entries first: after a restart (redeliveries), or after read() and
            # mark_done() fetched entries this handle has not returned yet.
            msgs = await self._redeliver(own=True)
            self._recovered, self._pel_dirty = True, False
            if msgs:
                return self._result(msgs)
        if not self._pulled:
            # Then, once per handle, what no doorbell names: entries written before the
            # agent's bell existed (by an older redisbus) or by a raw write (rejected if bad)
            self._pulled = True
            await self._pull()
            msgs = await self._redeliver(own=True)
            self._pel_dirty = False
            if msgs:
                return self._result(msgs)
        claimed = await self._redeliver(own=False)
        if claimed:
            return self._result(claimed)
        if self._cancelled:  # claim.lua found the agent ended (another replica was woken)
            return WaitResult("cancelled", [])
        if t > 0 and self._skip_looks:
            self._skip_looks -= 1
        elif t > 0:
            # What the doorbell names already is taken first, without blocking and without
            # showing the wait: an agent back from a turn mostly finds its messages rung
            # during it, and gets them in one script (no status written twice, no pop). An
            # agent that finds nothing blocks below, as it did (a message rung in between
            # leaves its wakeup for the pop), and its next LOOK_BACKOFF waits block without
            # looking: an agent that is always quicker than its senders pays one empty look
            # in LOOK_BACKOFF + 1 waits, not one in every wait.
            entries, now_ms = await self._fetch(None)
            msgs = self._take(entries, now_ms, marked=True)
            if msgs:
                return self._result(msgs, running=True)
            self._skip_looks = LOOK_BACKOFF
            if self._cancelled:
                return WaitResult("cancelled", [])
        released = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                # one replica is woken by a cancel; the others learn it at their slice's end
                block_ms: int | None = int(min(remaining, self._slice_s()) * 1000)
                if t == 0:
                    block_ms = None
                elif block_ms is not None and block_ms < 1:
                    self._deferred += ["s", "running"]
                    await self.flush()
                    return WaitResult("timeout", [])
                if block_ms and not released:
                    self._deferred += ["s", status]
                    self._want_status = "running"
                    if self.slots is not None:
                        self.slots.release()
                        released = True
                entries, now_ms = await self._fetch(block_ms)
                msgs = self._take(entries, now_ms, marked=True)
                fresh = bool(msgs)  # wake.lua set the agent running
                if (
                    block_ms
                    and not msgs
                    and any(f and core.addressed_to(f, self.name) for _, f in entries)
                ):
                    # the fetch's read marks set "running", but nothing was handed over (a
                    # forged entry): show the wait again with the next fetch
                    self._deferred += ["s", status]
                if not entries and block_ms:
                    # A quiet slice: pick up what a reply lost to a dropped connection left in
                    # this replica's pending list (a client retry may hide the drop), then
                    # what dead replicas left behind.
                    msgs = await self._redeliver(own=True, lapsed=block_ms >= 1000)
                if msgs:
                    return self._result(msgs, running=fresh)
                if self._cancelled:
                    return WaitResult("cancelled", [])
                if t == 0:
                    await self.flush()
                    return WaitResult("timeout", [])
        finally:
            if released and self.slots is not None:
                await self.slots.acquire()

    async def extend_lease(self, message: str | Message) -> bool:
        """Keep a message this replica is still handling from being reclaimed (long turns):
        resets its idle time without counting a delivery. False when this replica no longer
        holds it (done, dead-lettered, or taken back by another replica after its lease ran
        out, which keeps it: a lease is never taken back)."""
        entry = message_ids(message)[0]
        k = self._keys
        return bool(await self._bus._io.script(*bind.lease(k, self.name, self.replica, [entry])))

    async def mark_done(
        self, message: str | Message | Iterable[str | Message], result: str = "ok"
    ) -> bool:
        """Mark messages done (acknowledged). True if at least one changed state now."""
        ids = message_ids(message)
        res = check.text(result, "result", 1024, allow_newlines=True)
        done = bind.done(self._keys, self.name, res, ids)
        flags = bind.done_flags((await self._bus._io.scripts([*self._settle_calls(), done]))[-1])
        self._deferred.clear()
        if -1 in flags:
            pass  # refused as a whole: nothing changed, nothing fetched
        elif -2 in flags:
            # addressed to this agent but not fetched yet (seen with list()): fetch, then retry
            await self._pull()
            flags = bind.done_flags(await self._bus._io.script(*done))
        self._drop_handed(ids)
        bad = [i for i, f in zip(ids, flags, strict=True) if f < 0]
        if bad:
            raise InvalidInput(
                f"not addressed to {self.name} or unknown message id(s): {', '.join(bad)}; "
                "nothing was marked done"
            )
        n = sum(1 for f in flags if f == 1)
        if n:
            self._bus.metrics.done(n)
        return n > 0

    async def receipt(self, message_id: str | Message | Receipt) -> builtins.list[Receipt]:
        """The message's state for each of its recipients: by its id, the ``Message``, or a
        ``Receipt`` that ``send`` returned (one that was refused has no message to look at)."""
        if isinstance(message_id, Receipt):
            if message_id.id is None:
                raise InvalidInput(
                    f"the send to {message_id.to!r} was refused: there is no message to look at"
                )
            message_id = message_id.id
        entry = message_ids(message_id)[0]
        return core.parse_receipt(
            entry, await self._bus._io.script(*bind.receipt(self._keys, entry))
        )

    # -- family -----------------------------------------------------------------------------
    async def agents(self) -> Roster:
        cfg = self.channel.config
        return core.roster_of(self.name, await self.channel.members(), cfg.routing, cfg.siblings)

    async def complete(self, summary: str = "") -> str | None:
        """Finish: status ``completed``; the summary reaches the parent as an outcome message.
        A completed agent can still receive (a message to it is a follow-up)."""
        return await self._outcome("complete", self.name, summary)

    async def fail(self, error: str = "") -> str | None:
        """Finish with an error: the parent gets a ``failed`` outcome; descendants are cancelled."""
        out = await self._outcome("fail", self.name, error)
        self._bus._heart.remove(self)
        self._cancelled = True  # it ended: its wait() says so, as its other replicas' do
        return out

    async def cancel(self, child: str, reason: str = "") -> str | None:
        """Cancel a direct child and its whole subtree, on every host. Parents only."""
        return await self._outcome("cancel", check.member(child, "child"), reason)

    async def _outcome(self, op: str, target: str, text: str) -> str | None:
        body = check.body(check.text(text, "text", 32768, allow_newlines=True))
        await self.flush()
        # the outcome is for the target's parent: this agent's own, or this agent (a cancel)
        parent = self.name if op == "cancel" else (self.parent or "")
        sigs = core.sign_outcome(
            self._bus._signer, self.channel.name, op, self.name, target, body, parent
        )
        # it writes to the parent (the outcome) and, cancelling, to the target (the control
        # message); a cascade's others, the script asks for
        to = [parent, target] if op == "cancel" else [parent]
        call = bind.outcome(self._keys, op, self.name, target, body, sigs, filter(None, to))
        entry = bind.outcome_id(await self._bus._io.script(*call))
        if entry:
            self._bus.metrics.sent("outcome")
        return entry

    async def children(self) -> dict[str, str]:
        """Direct children and their statuses."""
        members = await self.channel.members()
        return {m.name: m.status for m in members.values() if m.parent == self.name}

    async def wait_children(self, timeout: float | None = None) -> ChildrenResult:
        """Wait until every direct child has ended (completed, failed, cancelled, lost), or
        the timeout; returns as soon as the last one ends. The result is a WaitResult: kind
        ``"outcome"`` (all ended), ``"timeout"`` (``.unfinished`` names the children still
        open) or ``"cancelled"``, with the outcome messages received in ``.messages``
        (iterating it still yields them, as when it returned a list). Other messages that
        arrive meanwhile are kept for the next ``wait()``."""
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        deadline = time.monotonic() + t
        outcomes: builtins.list[Message] = []
        terminal = ("completed", "failed", "cancelled", "lost")
        while True:
            open_children = [n for n, st in (await self.children()).items() if st not in terminal]
            remaining = deadline - time.monotonic()
            if not open_children or remaining <= 0:
                # collect outcomes already in the stream without blocking
                res = await self.wait(0)
                self._sort(res.messages, outcomes)
                if open_children:
                    return ChildrenResult("timeout", outcomes, tuple(sorted(open_children)))
                return ChildrenResult("outcome", outcomes)
            res = await self.wait(min(remaining, 1.0))
            if res.kind == "cancelled":
                return ChildrenResult("cancelled", outcomes, tuple(sorted(open_children)))
            self._sort(res.messages, outcomes)

    async def discover(self, query: str = "", limit: int = 20) -> builtins.list[Member]:
        """Reachable members ranked by how well their cards (description, skills) match."""
        q = check.text(query, "query", 512)
        lim = check.integer(limit, "limit", 1, 10_000)
        return core.rank_cards(q, await self.agents(), lim)

    async def close(self) -> None:
        """Stop heartbeating for this handle (releasing its lease: a closed handle is never
        reported lost) and write pending bookkeeping (none is left to write once the bus itself
        was closed)."""
        self._bus._heart.remove(self)
        give_back_consumer(self._bus, self._keys.stream, self.name, self.replica)
        if not self._bus._io.closed:
            await self._bus._release([self])
            await self.flush()
