"""How an agent handle gets entries out of its group: the view of read()/list() (view.lua),
the blocking fetch of new entries, and the reclaim (claim.lua) of what a replica left pending,
with the hand-out counts of each. The base of the agent class, whose public calls use them."""

from __future__ import annotations

import builtins
import time
from typing import Any

from .. import _bindings as bind
from .. import _core as core
from .. import _otel as otel
from .._agent import ENDED, AgentState
from .._errors import RedisbusError
from .._model import Message, id_ms

__all__ = ["Fetching"]


class Fetching(AgentState):
    """What an agent handle does to get entries out of its group: ``_view`` (read and list),
    ``_fetch`` (new entries, blocking or not) and ``_redeliver`` (pending ones due to this
    replica)."""

    async def _view(
        self, filter_by: Any, since: Any, limit: Any, *, pull: bool, mark: bool, preview: int | None
    ) -> builtins.list[Message]:
        plan = core.plan_view(
            self.name,
            self.replica,
            self.channel.config.routing,
            filter_by,
            since,
            limit,
            pull=pull,
            mark=mark,
        )
        k = self._keys
        rejected: builtins.list[tuple[str, str]] = []
        calls = [*self._settle_calls(), bind.view(k, self.name, plan.argv, self._replay_keep())]
        reply = (await self._bus._io.scripts(calls))[-1]
        self._deferred.clear()
        if pull:
            self._pel_dirty = True
        # Each call's work is capped: carry on from where it stopped (the resume token) until
        # the selection is complete, so a long backlog never hides a message.
        head, got = reply[: core.VIEW_ENTRIES], builtins.list(reply[core.VIEW_ENTRIES :])
        seen = {e[0] for e in got}
        while head[3] and len(got) < plan.limit:
            rest = bind.with_limit(plan.argv, plan.limit - len(got))
            more = await self._bus._io.script(
                *bind.view(k, self.name, rest, self._replay_keep(), head[3])
            )
            fresh = [e for e in more[core.VIEW_ENTRIES :] if e[0] not in seen]
            seen.update(e[0] for e in fresh)
            # a newest-first scan continues with earlier entries
            got = [*fresh, *got] if str(head[3]).startswith("v") else [*got, *fresh]
            head = more[: core.VIEW_ENTRIES]
        reply = [*head, *got]
        msgs = core.parse_view(
            self.channel.name,
            self.name,
            reply,
            preview_chars=preview,
            signer=self._bus._signer,
            unsigned=self._bus.settings.unsigned,
            agent_id=self.id,
            rejected=rejected,
        )
        for entry_id, reason in rejected if mark else ():
            self._reject(entry_id, reason)  # written with the next call
        if mark:
            mine = [m for m in msgs if self.name in m.to and not m.read]
            self._hand(mine)
            now_ms = int(reply[0])
            for m in mine:  # first time this agent gets them: delivery latency on the Redis clock
                self._bus.metrics.delivered(max(0.0, (now_ms - id_ms(m.id)) / 1000))
            if mine:
                self._bus.metrics.received(len(mine))
                if otel.on:
                    otel.received(self.channel.name, self.name, mine, None, "read")
        return msgs

    async def _pull(self) -> None:
        """Fetch every new entry of the agent's group into this replica's pending list, as
        read() does (view.lua), handing none over: wait() hands them out next."""
        pull = core.plan_view(self.name, self.replica, "open", None, None, 1, pull=True, mark=False)
        only = bind.with_limit(pull.argv, 0)  # limit 0: only fetch new entries into the group
        while True:  # fetch until nothing is left (each call is capped)
            got = await self._bus._io.script(
                *bind.view(self._keys, self.name, only, self._replay_keep())
            )
            if not int(got[2]):
                break
        self._pel_dirty = True  # the fetch may have taken entries wait() has not returned

    async def _fetch(self, block_ms: int | None) -> tuple[builtins.list[Any], int]:
        """New entries for this agent: those its doorbell names (wake.lua), after blocking on
        its wakeup list up to ``block_ms`` (None: not at all)."""
        settle = list(self._deferred) if self._deferred else None
        io = self._bus._io
        before = io.retries
        if self._wakeup_lost:  # the last fetch failed: its pop may have taken the wakeup
            block_ms, self._wakeup_lost = None, False
        try:
            entries, now, replayed, status = await io.fetch(
                self._fetch_keys,
                self.name,
                self.replica,
                block_ms,
                settle,
                self._replay_keep(),
            )
        except RedisbusError:
            self._pel_dirty = True  # the fetch may have handed over entries we never saw
            self._wakeup_lost = True
            raise
        if io.retries != before:
            self._pel_dirty = True
        if settle:
            del self._deferred[: len(settle)]
        if replayed:  # wake.lua rejected them (a copy of an earlier signed entry)
            self._bus.metrics.message_rejected("replay", replayed)
        if status in ENDED:  # another replica was woken by the cancel, or the agent ended
            self._cancelled = True
        return entries, now

    async def _redeliver(self, *, own: bool, lapsed: bool = True) -> builtins.list[Message]:
        """Pending entries due to this replica (claim.lua), dead-lettering instead those
        handed out max_deliveries times: with ``own``, its own pending entries this handle
        does not hold (after a restart, a reply lost to a dropped connection, or entries read()
        and mark_done() fetched ahead); with ``lapsed``, at most every lease/4, entries whose
        lease ran out on any replica (this one too: a message it returned and that was never
        marked done comes back to it). Nothing here reads the group, so ``deliveries`` counts
        hand-outs, and the entries this handle holds keep ageing towards their lease."""
        cfg = self.channel.config.limits
        lease_s = float(cfg.get("lease_s", self._bus.settings.lease_s))
        now = time.monotonic()
        lapsed = lapsed and now - self._last_claim >= lease_s / 4
        if not own and not lapsed:
            return []
        if lapsed:
            self._last_claim = now
        max_deliveries = int(cfg.get("max_deliveries", self._bus.settings.max_deliveries))
        count, start = (100 if lapsed else 0), ("-" if own else "")
        out: builtins.list[Message] = []
        while True:
            claim = bind.claim(
                self._keys,
                self.name,
                self.replica,
                int(lease_s * 1000),
                max_deliveries,
                count,
                start,
                self._handed,
            )
            got = bind.claimed((await self._bus._io.scripts([*self._settle_calls(), claim]))[-1])
            if got.status in ENDED:  # (claim.lua handed nothing)
                self._cancelled = True
                return out
            self._deferred.clear()
            if got.dead:
                self._bus.metrics.dead_lettered(got.dead)
            out += self._handed_out(got.entries, got.now_ms)
            if not got.resume:
                return out
            count, start = 0, got.resume

    def _handed_out(self, claimed: Any, now_ms: int) -> builtins.list[Message]:
        """The messages claim.lua handed this replica, each with its count of hand-outs."""
        out = []
        redelivered = 0
        metrics, channel = self._bus.metrics, self.channel.name
        for entry_id, flat, deliveries in claimed:
            f = core.fields_from_flat(flat)
            ok, reason = self._bus._signer.verdict(
                channel, entry_id, f, self.name, self.id, unsigned=self._bus.settings.unsigned
            )
            if reason:
                self._reject(entry_id, reason)
                continue
            msg = core.message_from_fields(
                channel, entry_id, f, read=True, deliveries=int(deliveries), verified=ok
            )
            out.append(msg)
            if msg.deliveries > 1:
                redelivered += 1
            else:  # first hand-out of an entry fetched ahead: delivered now
                metrics.delivered(max(0.0, (now_ms - id_ms(entry_id)) / 1000))
            if msg.type == "control":  # consumed on sight
                self._deferred += ["d", entry_id]
            else:
                self._hand([msg])
        if out:
            metrics.received(len(out))
        if redelivered:
            metrics.redelivered(redelivered)
        return out
