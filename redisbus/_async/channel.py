"""``AsyncChannel``: a named scope of conversation, its members, limits and janitor pass."""

from __future__ import annotations

import builtins
from collections.abc import Iterable
from typing import Any, Unpack

from .. import _bindings as bind
from .. import _core as core
from .. import _validate as check
from .._agent import give_back_consumer, take_consumer
from .._errors import InvalidInput, NotPermitted, UnknownChannel
from .._filters import check_entry_id
from .._keys import ChannelKeys, registry_key
from .._model import DeadLetter, Member
from .._tasks_async import Semaphore
from .agent import AsyncAgent

__all__ = ["AsyncChannel"]


class AsyncChannel:
    """A named scope of conversation; one Redis stream with one consumer group per agent."""

    def __init__(self, bus: Any, keys: ChannelKeys, config: core.ChannelConfig) -> None:
        self.bus = bus
        self.keys = keys
        self.name = keys.channel
        self.config = config

    def __repr__(self) -> str:
        return f"<AsyncChannel {self.name!r} routing={self.config.routing}>"

    async def join(
        self,
        name: str,
        parent: str | None = None,
        replica: str | None = None,
        *,
        description: str = "",
        skills: Iterable[str] = (),
        slots: Semaphore | None = None,
    ) -> AsyncAgent:
        """Join as ``name`` (or attach one more replica of it). ``slots``: an optional
        semaphore shared by a team's agents, released while this agent waits."""
        s = self.bus.settings
        agent = check.agent_name(name, int(self.config.limits.get("max_name_chars", 128)))
        if parent is not None:
            check.member(parent, "parent")
        rep = check.name(replica, "replica", 256) if replica is not None else s.consumer
        desc = check.text(description, "description", 2000, allow_newlines=True)
        sk = [check.name(x, "skill") for x in skills] if not isinstance(skills, str) else None
        if sk is None:
            raise InvalidInput("skills must be a list of strings")
        if not self.bus._signer.may_speak(self.name, agent):
            # names are owned: this host's key may not speak for it, so it may not receive
            # as it either
            raise NotPermitted(f"this host's key may not speak for {agent!r} on {self.name!r}")
        await self.bus._measure_clock()  # (signing on: a skewed host learns it here)
        k = self.keys
        # a second handle of the agent in this process is a replica of its own (a name the
        # caller gives is taken as given: a stable name is the caller's promise, see
        # docs/delivery.md, and a restarted replica must find its pending entries under it)
        rep = take_consumer(self.bus, k.stream, agent, rep, exact=replica is not None)
        lease_ms = int(s.agent_lease_s * 1000)  # the heartbeat deadline, not a message's lease
        call = bind.join(k, agent, parent, core.new_agent_id(), rep, s.host, desc, sk, lease_ms)
        try:
            joined = bind.joined(await self.bus._io.script(*call))
        except BaseException:
            give_back_consumer(self.bus, k.stream, agent, rep)
            raise
        handle = AsyncAgent(self, agent, joined.id, joined.depth, joined.parent, rep)
        handle.slots = slots
        # a member this join made has a group younger than any bell: nothing to fetch first
        handle._pulled = joined.created
        self.bus._heart.add(handle)
        return handle

    async def remove(self, agent: str, *, force: bool = False) -> None:
        """Take ``agent`` off the channel and free its name: a later ``join`` of that name
        makes a new member (this is how a cancelled or failed name comes back: statuses never
        go back to running). Refused (NotPermitted) while it holds work: undone messages,
        pending entries, open children or a replica still beating; ``force=True`` drops that
        work (its children keep its name as their parent). UnknownAgent when not a member."""
        name = check.member(agent, "agent")
        if not isinstance(force, bool):
            raise InvalidInput("force must be True or False")
        core.raise_if_refused(await self.bus._io.script(*bind.remove(self.keys, name, force)))

    async def leave(self, agent: AsyncAgent) -> bool:
        """Undo the join that made ``agent`` (a handle of this channel), when nothing has
        happened to it since: the member, its consumer group and its heartbeat go, and its
        name is free again; True. Nothing happened means the member is still the one that
        join made (not removed and joined anew), still running, with no undone message, no
        pending entry, no child and no other replica; otherwise it stays as it is: False. One
        script checks and removes, so nothing slips in between. The handle is closed either
        way. For a program that joined only to try something, such as ``redisbus send``
        joining its sender for a send that was refused; ``remove`` takes off a member that
        did work."""
        if not isinstance(agent, AsyncAgent) or agent.channel.keys != self.keys:
            raise InvalidInput("leave takes a handle that this channel's join returned")
        await agent.close()  # no heartbeat may bring its lease back
        call = bind.leave(self.keys, agent.name, agent.id, agent.replica)
        return bind.left(await self.bus._io.script(*call))

    async def delete(self, *, force: bool = False) -> None:
        """Delete the channel: its stream, members, limits, dead letters, every key it has.
        Refused (NotPermitted) while it is in use: an undone message, or an open agent with a
        replica still beating; ``force=True`` deletes it anyway. UnknownChannel when it is
        already gone. Handles on it stop working; ``bus.channel(name)`` creates it anew."""
        if not isinstance(force, bool):
            raise InvalidInput("force must be True or False")
        k = self.keys
        # the members' doorbells (a bell goes with its member when it leaves or is removed)
        names = await self.bus._io.call(self.bus._io.r.hkeys, k.members)
        members = [n.decode() if isinstance(n, bytes) else n for n in names]
        reply = await self.bus._io.script(*bind.delete(k, members, force))
        if int(reply[0]) == 0 and reply[1] == "unknown_channel":
            raise UnknownChannel(f"no such channel: {self.name!r}")
        core.raise_if_refused(reply)
        # the registry is outside the channel's slot: never in the script
        await self.bus._io.call(
            self.bus._io.r.srem, registry_key(self.bus.settings.prefix), self.name
        )

    async def members(self) -> dict[str, Member]:
        r = self.bus._io.r
        records = await self.bus._io.call(r.hgetall, self.keys.members)
        statuses = await self.bus._io.call(r.hgetall, self.keys.status)
        return core.members_from_hashes(records, statuses, self.name)

    async def tree(self) -> builtins.list[Member]:
        return core.tree_order(await self.members())

    async def refresh(self) -> core.ChannelConfig:
        h = await self.bus._io.call(self.bus._io.r.hgetall, self.keys.meta)
        self.config = core.config_from_hash(self.name, h)
        return self.config

    async def configure(self, **limits: Unpack[core.ChannelLimits]) -> core.ChannelConfig:
        """Change stored limits (those of ``ChannelLimits``) for every host at once."""
        planned = core.plan_channel(self.bus.settings, None, None, limits)
        return await self._update_meta({f: v for f, v, explicit in planned if explicit})

    async def _update_meta(self, fields: dict[str, str]) -> core.ChannelConfig:
        """Write meta fields and drop send.lua's packed copy of the limits and pause switch
        (the rate hash's '#lim'; it repacks them from meta), and older versions' copy, in one
        script: atomic, so every send after it, on any host, sees the change, and a failure
        leaves the channel as it was."""
        stored = bind.configured(await self.bus._io.script(*bind.configure(self.keys, fields)))
        self.config = core.config_from_hash(self.name, stored)
        return self.config

    async def pause(self) -> None:
        await self._update_meta({"paused": "1"})

    async def resume(self) -> None:
        await self._update_meta({"paused": "0"})

    async def dead_letters(self, limit: int = 100) -> builtins.list[DeadLetter]:
        """Messages dead-lettered after too many deliveries, oldest first."""
        lim = check.integer(limit, "limit", 1, 100_000)
        entries = await self.bus._io.call(self.bus._io.r.xrange, self.keys.dlq, count=lim)
        # a malformed entry (a raw write) is passed over, warned about and counted once
        metrics = self.bus.metrics
        return core.parse_dead_letters(
            self.name, entries, lambda _id, _why: metrics.message_rejected("malformed")
        )

    async def replay(self, dead_letter_id: str) -> str:
        """Give a dead letter back to its recipient as a new message; returns the new id.
        InvalidInput when there is no such dead letter, or its entry is malformed (a raw
        write: ``dead_letters()`` does not list it either)."""
        k = self.keys
        dead = check_entry_id(dead_letter_id, "dead letter id")
        got = await self.bus._io.call(self.bus._io.r.xrange, k.dlq, dead, dead)
        if not got:
            raise InvalidInput(f"no dead letter {dead}")
        f = dict(got[0][1])
        why = core.dead_letter_fault(f)
        if why:
            raise InvalidInput(f"dead letter {dead} is malformed ({why}): it cannot be replayed")
        sig: builtins.list[str] = []
        signer = self.bus._signer
        if signer.enabled:  # this host signs the replay; the original's signature goes along
            sig = list(signer.sign(self.name, f, mode="replay", recipients=[f["a"]]))
        return bind.replayed(await self.bus._io.script(*bind.replay(k, dead, sig)))

    async def sweep(
        self, *, batch: int = 1000, consumer_idle_s: float = 24 * 3600
    ) -> core.SweepReport:
        """One janitor pass: dead-letter over-delivered messages, trim what every group has
        acknowledged (or what is older than the retention), drop idle empty consumers."""
        idle_ms = int(check.duration(consumer_idle_s, "consumer_idle_s") * 1000)
        per_call = check.integer(batch, "batch", 1, 100_000)
        cfg, s = self.config.limits, self.bus.settings
        call = bind.sweep(
            self.keys,
            int(float(cfg.get("lease_s", s.lease_s)) * 1000),
            int(cfg.get("max_deliveries", s.max_deliveries)),
            int(float(cfg.get("retention_s", s.retention_s)) * 1000),
            idle_ms,
            per_call,
            # the receivers' replay horizon (Signer.replay_keep_ms), from this host's settings
            # whether or not it signs: a janitor needs no key
            int(max(s.replay_keep_s, 2 * s.signing_window_s) * 1000),
        )
        return bind.swept(await self.bus._io.script(*call))

    async def repair(self, *, budget: int = 0) -> dict[str, tuple[int | None, int]]:
        """Rebuild every inbox counter from the stream (entries addressed to each agent that
        its group holds pending, plus those past its cursor); returns the counters that were
        wrong, as name -> (stored or None when missing, counted). ``budget``: most entries
        one call may look at (0 = no bound); over it nothing is written and InvalidInput
        says so."""
        call = bind.repair(self.keys, check.integer(budget, "budget", 0, 1 << 40))
        wrong = bind.repaired(await self.bus._io.script(*call))
        if wrong is None:
            raise InvalidInput(f"repair of {self.name!r} needs more than {budget} entries")
        return wrong

    async def counts(self) -> dict[str, int]:
        """Inbox counters (undone messages per agent), as stored."""
        h = await self.bus._io.call(self.bus._io.r.hgetall, self.keys.inbox)
        return {k: int(v) for k, v in h.items()}

    async def length(self) -> int:
        return int(await self.bus._io.call(self.bus._io.r.xlen, self.keys.stream))
