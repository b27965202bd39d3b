"""The value types every call returns: Message, Receipt, WaitResult (ChildrenResult), Roster,
Member."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypedDict, TypeVar, cast

from ._errors import RedisbusError

Status = Literal["queued", "delivered", "read", "done", "rejected", "failed", "expired"]
WaitKind = Literal["message", "outcome", "cancelled", "timeout"]
AgentStatus = Literal["running", "waiting", "idle", "completed", "failed", "cancelled", "lost"]
Relationship = Literal["parent", "sibling", "child", "member"]

#: The types a sender may give, in the order the tools list them. "outcome" and "control" are
#: the bus's own (a child's final result, a cancellation): a sender that could give them could
#: fake a cancellation or an outcome to its peers.
SEND_TYPES = (
    "message",
    "request",
    "response",
    "status_update",
    "delegate_task",
    "request_data",
    "auto_reply",
)
MESSAGE_TYPES = frozenset({*SEND_TYPES, "outcome", "control"})


class SendOptions(TypedDict, total=False):
    """The keyword options of ``send`` (``ask`` takes them too), for callers that pass them on:
    ``def post(agent, to, body, **options: Unpack[SendOptions])``. Their meaning and defaults
    are ``send``'s."""

    subject: str
    type: str
    priority: int
    reply_to: str | None
    ttl_s: float | None
    idempotency_key: str | None
    trace: str | None
    await_delivery: float | None
    durable: bool | None


_T = TypeVar("_T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def ms_to_dt(ms: int | None) -> datetime | None:
    """A Redis-clock millisecond as an aware UTC datetime (exact: no float on the way; one
    object made instead of fromtimestamp's two)."""
    return None if ms is None else _EPOCH + timedelta(milliseconds=ms)


def id_ms(entry_id: str) -> int:
    """The Redis-clock millisecond of a stream entry id."""
    return int(entry_id.partition("-")[0])


@dataclass(frozen=True, slots=True)
class Message:
    """One attributed envelope. ``read`` is as seen by the agent that fetched it."""

    id: str
    channel: str
    sender: str
    to: tuple[str, ...]
    subject: str
    body: str
    type: str = "message"
    priority: int = 0
    reply_to: str | None = None
    depth: int = 0
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    ttl_s: float | None = None
    read: bool = False
    truncated: bool = False
    idempotency_key: str | None = None
    trace: str | None = None
    verified: bool | None = None
    deliveries: int = 1

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "channel": self.channel,
            "from": self.sender,
            "to": list(self.to),
            "subject": self.subject,
            "body": self.body,
            "type": self.type,
            "priority": self.priority,
            "reply_to": self.reply_to,
            "depth": self.depth,
            "created_at": self.created_at.isoformat(),
            "ttl_s": self.ttl_s,
            "read": self.read,
            "truncated": self.truncated,
            "verified": self.verified,
        }


@dataclass(frozen=True, slots=True)
class Receipt:
    """The sender's view of one message to one recipient."""

    id: str | None
    to: str
    status: Status
    error: RedisbusError | None = None
    queued_at: datetime | None = None
    delivered_at: datetime | None = None
    read_at: datetime | None = None
    done_at: datetime | None = None
    result: str | None = None
    durable: bool | None = None  # with durable=True: did WAIT reach the replicas asked for?

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, object]:
        def iso(d: datetime | None) -> str | None:
            return d.isoformat() if d else None

        return {
            "id": self.id,
            "to": self.to,
            "status": self.status,
            "error": None if self.error is None else f"{self.error.code}: {self.error}",
            "queued_at": iso(self.queued_at),
            "delivered_at": iso(self.delivered_at),
            "read_at": iso(self.read_at),
            "done_at": iso(self.done_at),
        }


# The fast constructors. A frozen dataclass's __init__ sets each field through
# object.__setattr__; a wake-up makes one Message and a send one Receipt per recipient, so
# that cost shows. Measured (Python 3.11, this machine): Receipt(...) 8.5 us; object.__new__
# plus each slot's descriptor __set__ 2.6 us; filling an unguarded twin with the same slots and
# giving it the frozen class (below) 1.5 us. The result is an ordinary frozen, equal, hashable
# instance. A field left unset would fail only when read: tests/contract/test_model.py builds each
# class this way and reads every field of dataclasses.fields(), so a field added to a class
# must be added to its fast constructor before the suite passes.


class _OpenMessage:
    """Message's slots without the frozen guard: filled in, then handed to ``frozen_as``."""

    __slots__ = Message.__slots__


class _OpenReceipt:
    """Receipt's slots without the frozen guard: filled in, then handed to ``frozen_as``."""

    __slots__ = Receipt.__slots__


def frozen_as(open_twin: Any, cls: type[_T]) -> _T:
    """``open_twin`` (every slot set) becomes an instance of the frozen class ``cls``."""
    object.__setattr__(open_twin, "__class__", cls)
    return cast(_T, open_twin)


def queued_receipt(entry_id: str | None, to: str, queued_at: datetime | None) -> Receipt:
    """A new "queued" receipt, made the fast way (see above)."""
    r: Any = _OpenReceipt()
    r.id, r.to, r.status, r.error, r.queued_at = entry_id, to, "queued", None, queued_at
    r.delivered_at = r.read_at = r.done_at = r.result = r.durable = None
    return frozen_as(r, Receipt)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message moved to its channel's dead-letter stream after too many deliveries."""

    id: str
    original_id: str
    recipient: str
    deliveries: int
    reason: str
    dead_at: datetime | None
    message: Message

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "original_id": self.original_id,
            "recipient": self.recipient,
            "deliveries": self.deliveries,
            "reason": self.reason,
            "dead_at": self.dead_at.isoformat() if self.dead_at else None,
            "message": self.message.as_dict(),
        }


@dataclass(frozen=True, slots=True)
class WaitResult:
    kind: WaitKind
    messages: list[Message] = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.kind != "timeout"


@dataclass(frozen=True, slots=True)
class ChildrenResult(WaitResult):
    """What ``wait_children()`` returns: ``kind`` is ``"outcome"`` once every direct child has
    ended, ``"timeout"`` when some had not by the timeout (``unfinished`` names them),
    ``"cancelled"`` when the waiting agent was; ``messages`` are the outcome messages received.

    It was a plain list in 0.1.0: iterating, ``len()`` and indexing still go to
    ``messages``, but truth is a WaitResult's (false on a timeout), not the list's."""

    unfinished: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages)

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, i: int) -> Message:
        return self.messages[i]


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a channel, as ``ch.tree()`` and roster entries report it."""

    name: str
    id: str
    parent: str | None
    depth: int
    status: AgentStatus
    host: str = ""
    description: str = ""
    skills: tuple[str, ...] = ()
    relationship: Relationship | None = None

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "name": self.name,
            "id": self.id,
            "parent": self.parent,
            "depth": self.depth,
            "status": self.status,
            "host": self.host,
        }
        if self.relationship:
            d["relationship"] = self.relationship
        if self.description:
            d["description"] = self.description
        if self.skills:
            d["skills"] = list(self.skills)
        return d


@dataclass(frozen=True, slots=True)
class Roster:
    """``agent.agents()``: the agent itself and the members it may reach, in roster order."""

    self: Member
    family: list[Member]

    def names(self) -> list[str]:
        return [m.name for m in self.family]

    def as_dict(self) -> dict[str, object]:
        return {
            "self": {"name": self.self.name, "id": self.self.id, "depth": self.self.depth},
            "family": [m.as_dict() for m in self.family],
        }
