"""What the sync and async agent handles share that does no I/O: their state, the bookkeeping
of fetched entries, and the parsing of what a fetch returned."""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from typing import Any

from . import _bindings as bind
from . import _core as core
from . import _otel as otel
from ._errors import InvalidInput
from ._filters import check_entry_id
from ._keys import doorbells
from ._model import Message, Receipt, WaitResult, id_ms

log = logging.getLogger("redisbus")

#: The message a ``serve`` handler is handling, with the handle it came to: what that handle
#: sends meanwhile continues the message's chain (a context variable: per task, per thread).
HANDLING: ContextVar[tuple[Any, str] | None] = ContextVar("redisbus_handling", default=None)

#: Statuses after which an agent's replicas stop waiting (``wait()`` returns "cancelled")
ENDED = frozenset({"failed", "cancelled", "lost"})
#: waits after an empty look that block without looking first (see AsyncAgent.wait)
LOOK_BACKOFF = 3

#: How long one blocking read of a wait lasts at most (it slices longer waits): for an agent
#: with one replica, and for one with several (only one is woken by its cancellation; the
#: others learn it when their slice ends)
SLICE_S, SHARED_SLICE_S = 5.0, 1.0


class AgentState:
    """State of one agent handle; ``Agent`` and ``AsyncAgent`` add the calls that talk to Redis."""

    def __init__(
        self,
        channel: Any,
        name: str,
        agent_id: str,
        depth: int,
        parent: str | None,
        replica: str,
    ) -> None:
        self.channel = channel
        self.name = name
        self.id = agent_id
        self.depth = depth
        self.parent = parent
        self.replica = replica
        self._bus = channel.bus
        self._keys = channel.keys
        self._send_keys = bind.send_keys(channel.keys)
        self._settle_keys = bind.SETTLE.keys_of(channel.keys)
        signing = self._bus._signer.enabled  # (the replay record's keys: see _replay_keep)
        self._fetch_keys = bind.fetch_keys(channel.keys, name, signing)
        self._deferred: builtins.list[str] = []
        # an entry was rejected since the last settle: it is settled before the call returns
        self._rejected = False
        self._recovered = False
        self._pulled = False  # wait() fetched what no doorbell names (once per handle)
        self._held: builtins.list[Message] = []  # fetched while waiting for children; returned next
        # ids returned to this handle and not yet done, with their chain depth: what it sends
        # meanwhile is caused by one of them (see _cause)
        self._handed: dict[str, int] = {}
        self._deepest: tuple[str, int] | None = None  # the deepest of them, once known
        self._wakeup_lost = False  # a fetch failed: the next one does not block first
        self._skip_looks = 0  # waits left that block without looking first (see wait())
        self._cancelled = False
        self._replicas = 1  # live replicas of the agent, as the last heartbeat counted them
        self._want_status: str | None = None
        self._last_claim = float("-inf")
        self._pel_dirty = False  # read()/mark_done() fetched entries wait() has not returned
        # send.lua's KEYS for one recipient named as such: the commonest send's, made once each
        self._keys_to: dict[str, builtins.list[str]] = {}
        self._bus._io.learn(self._keys.stream, [name])  # a member: a broadcast rings it
        # the members this agent's last broadcast reached (accepted or refused): the doorbells
        # its next one is given (None before the first: the members its bus met)
        self._reach: builtins.list[str] | None = None

    def _send_keys_for(self, plans: Iterable[Any]) -> builtins.list[str]:
        """send.lua's KEYS for ``plans`` (SendPlans): the doorbells of the agents they name
        ("parent": this agent's; a broadcast: those its last broadcast reached, else the
        members this bus met so far). A script asks for any others (an agent id's, a member
        that joined since) before it writes."""
        names: builtins.list[str] = []
        for p in plans:
            if p.mode == "all":
                names += (
                    self._bus._io.known(self._keys.stream) if self._reach is None else self._reach
                )
            else:
                names += [self.parent or "" if n == "parent" else n for n in p.names]
        return [*self._send_keys, *doorbells(self._keys.stream, filter(None, names))]

    def _reached(self, plans: Iterable[Any], results: Iterable[Any]) -> None:
        """What broadcasts among ``plans`` returned (``results``, one per plan): the members
        the last one reached, accepted or refused, are the doorbells the next is given. Not
        the whole roster: in a family, a broadcast reaches a few of many; and a member that
        left is no longer passed."""
        for p, result in zip(plans, results, strict=True):
            if p.mode == "all" and isinstance(result, builtins.list):
                names = [r.to for r in result]
                if "all" not in names:  # (a call that failed whole names no member)
                    self._reach = names

    def _resolved(self, given: str, name: str) -> None:
        """A send to ``given`` (an agent id, "parent") went to member ``name``: the next one is
        given that member's doorbell at once."""
        if given in self._keys_to:
            self._keys_to[given] = [*self._send_keys, *doorbells(self._keys.stream, [name])]

    def _send_keys_to(self, plan: Any) -> builtins.list[str]:
        """``_send_keys_for`` of one plan, kept for a plan to one name."""
        if plan.mode != "one":
            return self._send_keys_for([plan])
        keys = self._keys_to.get(plan.names[0])
        if keys is None:
            keys = self._send_keys_for([plan])
            if len(self._keys_to) < 1024:
                self._keys_to[plan.names[0]] = keys
        return keys
        self.slots: Any = None
        self._wait_ns: int | None = None  # when the current wait() began (for its span)

    @property
    def beat_field(self) -> str:
        """This replica's field in the channel's beat hash (its lease deadline)."""
        return f"{self.name}\n{self.replica}"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.channel.name!r}>"

    def _count(self, result: Receipt | builtins.list[Receipt], type_: str) -> None:
        m = self._bus.metrics
        if isinstance(result, Receipt):  # one recipient: no list to build
            if result.id:
                m.sent(type_)
            if result.error is not None:
                m.rejected(result.error.code)
            return
        receipts = result
        if any(r.id for r in receipts):
            m.sent(type_)
        for r in receipts:
            if r.error is not None:
                m.rejected(r.error.code)

    def _count_batch(self, sent: dict[str, int], refused: builtins.list[str]) -> None:
        """Metrics of a send_many: the messages appended, by type (one update per type), and
        the refusals, per recipient."""
        m = self._bus.metrics
        for type_, n in sent.items():
            m.sent(type_, n)
        for code in refused:
            m.rejected(code)

    def _hand(self, messages: Iterable[Message]) -> None:
        """These messages are now this handle's to handle."""
        deepest = self._deepest
        for m in messages:
            self._handed[m.id] = m.depth
            if deepest is not None and m.depth >= deepest[1]:
                deepest = (m.id, m.depth)
        self._deepest = deepest

    def _drop_handed(self, ids: Iterable[str]) -> None:
        """These messages are done with: they cause nothing any more."""
        pop = self._handed.pop
        for i in ids:
            pop(i, None)
        if self._deepest is not None and self._deepest[0] not in self._handed:
            self._deepest = None

    def _cause(self) -> str:
        """The message a send of this handle continues the chain of: the one a ``serve``
        handler is handling, else the deepest of those handed to it and not done (a loop
        of new messages grows deeper through whichever one caused it), else none."""
        current = HANDLING.get()
        if current is not None and current[0] is self:
            return str(current[1])
        if not self._handed:
            return ""
        if self._deepest is None:
            best = max(self._handed.values())
            # the latest of the deepest: dicts keep insertion order
            self._deepest = next((i, d) for i, d in reversed(self._handed.items()) if d == best)
        return self._deepest[0]

    def _heard(self, mine: Sequence[Any]) -> None:
        """What a heartbeat found (beat.lua's ``{agent, status, live replicas, ...}``): an
        agent that ended elsewhere (failed, cancelled, lost) stops waiting here too."""
        for i in range(0, len(mine) - 2, 3):
            if mine[i] == self.name:
                self._replicas = int(mine[i + 2])
                if mine[i + 1] in ENDED:
                    self._cancelled = True
                return

    def _slice_s(self) -> float:
        return SHARED_SLICE_S if self._replicas > 1 else SLICE_S

    def _settle_calls(self) -> builtins.list[bind.Call]:
        if not self._deferred:
            return []
        return [bind.settle(self._settle_keys, self.name, self._deferred)]

    def _result(self, msgs: builtins.list[Message], *, running: bool = False) -> WaitResult:
        if not running:  # (a fetch's wake.lua already set it when it returned messages)
            self._deferred += ["s", "running"]  # written with the next call (or the heartbeat)
        if otel.on:
            otel.received(self.channel.name, self.name, msgs, self._wait_ns, "wait")
        kind = core.wait_kind(self.name, msgs)
        if kind == "cancelled":
            self._cancelled = True
        return WaitResult(kind, msgs)

    def _take(
        self,
        entries: builtins.list[Any],
        now_ms: int,
        *,
        redelivered: bool = False,
        own: bool = False,
        marked: bool = False,
    ) -> builtins.list[Message]:
        """The messages among fetched ``entries`` for this agent; what is left to record about
        each goes into the deferred settle ops. ``marked``: a fetch's "n" op already marked
        them read and acknowledged the others' entries, so only what it cannot know is left
        (control messages, deleted and rejected entries, an expiry seen by the later clock)."""
        out = []
        bus, name, channel, deferred = self._bus, self.name, self.channel.name, self._deferred
        metrics, signer, unsigned = bus.metrics, bus._signer, bus.settings.unsigned
        for entry_id, f in entries:
            if f is None:  # deleted while pending
                deferred += ["a", entry_id]
                continue
            if not core.addressed_to(f, name):
                if not marked:
                    deferred += ["a", entry_id]
                continue
            if core.expired_at(entry_id, f, now_ms):
                deferred += ["x", entry_id]
                continue
            if own and entry_id in self._handed:
                continue  # this handle already returned it
            # a cancel signed for an ancestor wakes this agent only once the server says it
            # ended (the fetch's status, or the heartbeat's)
            ok, reason = signer.verdict(
                channel, entry_id, f, name, self.id, cascade=self._cancelled, unsigned=unsigned
            )
            if reason:
                self._reject(entry_id, reason)
                continue
            if not redelivered:
                metrics.delivered(max(0.0, (now_ms - id_ms(entry_id)) / 1000))
            msg = core.message_from_fields(channel, entry_id, f, read=True, verified=ok)
            out.append(msg)
            # control messages are consumed on sight; the others become read
            if msg.type == "control":
                deferred += ["d", entry_id]
            else:
                self._hand((msg,))
                if not marked:
                    deferred += ["r", entry_id]
        if out:
            metrics.received(len(out))
            if redelivered:
                metrics.redelivered(len(out))
        return out

    def _replay_keep(self) -> int:
        """How long the server remembers signatures' nonces (ms); 0: signing off."""
        signer = self._bus._signer
        return signer.replay_keep_ms if signer.enabled else 0

    def _reject(self, entry_id: str, reason: str) -> None:
        """An entry for this agent that failed a check: never handed over; settle.lua acks it,
        counts the inbox down and marks it rejected before the call that found it returns (one
        more round trip, on this path only), so the sender's receipt says so at once."""
        self._deferred += [f"j:{reason}", entry_id]
        self._rejected = True
        self._bus.metrics.message_rejected(reason)
        log.warning("redisbus: rejected message %s to %s: %s", entry_id, self.name, reason)

    def _sort(self, messages: builtins.list[Message], outcomes: builtins.list[Message]) -> None:
        for m in messages:
            (outcomes if m.type == "outcome" else self._held).append(m)


#: The consumers the open handles of this process serve, by (server, stream key, agent
#: name): each consumer name with the bus whose handle holds it
_CONSUMERS: dict[tuple[str, str, str], dict[str, int]] = {}
_CONSUMERS_LOCK = threading.Lock()


def _server(bus: Any) -> str:
    return str(bus.url or id(bus))


def take_consumer(bus: Any, stream: str, agent: str, replica: str, *, exact: bool = False) -> str:
    """The consumer name of a new handle of ``agent``: ``replica``, or ``replica#2``, ``#3``…
    while another open handle of this process (of any bus on the same server) serves the agent
    under it. Two handles sharing a consumer would both be handed the same message (each reads
    the consumer's pending list); as separate replicas, each message goes to one of them.
    With ``exact`` (a name the caller chose) the name is taken as it is."""
    with _CONSUMERS_LOCK:
        taken = _CONSUMERS.setdefault((_server(bus), stream, agent), {})
        name, n = replica, 1
        while name in taken and not exact:
            n += 1
            name = f"{replica}#{n}"
        taken.setdefault(name, id(bus))  # (an exact name another handle holds stays its)
    if n > 1:
        log.info(
            "redisbus: %s already has a handle in this process as %s; this one serves it as %s",
            agent,
            replica,
            name,
        )
    return name


def give_back_consumer(bus: Any, stream: str, agent: str, replica: str) -> None:
    """A handle closed: its consumer name is free for the next handle of this process."""
    with _CONSUMERS_LOCK:
        key = (_server(bus), stream, agent)
        taken = _CONSUMERS.get(key)
        if taken is not None and taken.get(replica) == id(bus):
            del taken[replica]
            if not taken:
                del _CONSUMERS[key]


def give_back_consumers(bus: Any) -> None:
    """A bus closed: every consumer name its handles held is free."""
    with _CONSUMERS_LOCK:
        for key, taken in list(_CONSUMERS.items()):
            for name in [n for n, owner in taken.items() if owner == id(bus)]:
                del taken[name]
            if not taken:
                del _CONSUMERS[key]


def message_ids(message: Any) -> builtins.list[str]:
    """The entry ids of a message id, a ``Message``, or a non-empty iterable of them."""
    if isinstance(message, Message):
        return [message.id]
    if isinstance(message, str):
        return [check_entry_id(message)]
    if isinstance(message, Iterable):
        out = [m.id if isinstance(m, Message) else check_entry_id(m) for m in message]
        if not out:
            raise InvalidInput("no message ids given")
        return out
    raise InvalidInput(f"expected a message id or Message, got {type(message).__name__}")
