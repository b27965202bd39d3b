"""One binding per Lua script of ``lua/``: the script's name, the names of its KEYS and ARGV in
the order its header lists them, the builder of a call and the reader of its reply, in one
place. Both faces call the scripts only through these (``Call``: what ``IO.script`` and
``IO.scripts`` take), so no call site spells a KEYS list or an ARGV position of its own.

Each script's header names its KEYS and ARGV (``-- KEYS[1] stream  KEYS[2] inbox``,
``-- ARGV[3..] ids``: a trailing ``..`` takes the rest; send.lua's ARGV repeats one record of
fields, ``-- k=1 sender``): ``tests/lua/test_bindings.py`` checks every ``Script`` here
against its header, and the highest ``KEYS[n]`` and ``ARGV[n]`` each script's code uses
against the names declared, so a script and its callers cannot drift apart.

A key's name is the ``ChannelKeys`` field it is, but for ``bell`` and ``wakeup`` (the doorbell
and the wakeup list of the agent the call is for), ``bells`` (the doorbells of the agents a
call may write to: see ``unrung``) and ``rest`` (delete.lua's every other key, the caller's
list).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ._channels import ChannelConfig, SweepReport, parse_channel
from ._errors import RedisbusError, UnknownChannel, raise_if_refused
from ._keys import ChannelKeys, doorbells

__all__ = [
    "SCRIPTS",
    "Call",
    "Claimed",
    "FetchKeys",
    "Joined",
    "Script",
    "unrung",
    "with_bells",
]


class Call(NamedTuple):
    """One call of a script: its name, its KEYS, its ARGV."""

    script: str
    keys: Sequence[str]
    args: Sequence[Any]


@dataclass(frozen=True, slots=True)
class Script:
    """A script's signature as its header gives it. ``keys``/``argv``: the names, in order; a
    name ending in ``..`` takes the rest. ``optional``: how many of the last KEYS a call may
    leave out; ``optional_args`` the same for ARGV. ``record``: send.lua's fields of one
    message (its ARGV is one record or several, back to back)."""

    name: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    optional: int = 0
    optional_args: int = 0
    record: tuple[str, ...] = ()
    # how many KEYS and ARGV a call may carry, (least, most or None): made once, so that a
    # call on the hot paths (settle, wake-up) checks its arity in two comparisons
    key_counts: tuple[int, int | None] = field(init=False, repr=False)
    arg_counts: tuple[int, int | None] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_counts", _counts(self.keys, self.optional))
        object.__setattr__(self, "arg_counts", _counts(self.argv, self.optional_args))

    def keys_of(self, k: ChannelKeys, agent: str = "", *, short: bool = False) -> list[str]:
        """The KEYS of a call for ``agent`` (its bell and wakeup), the optional ones left out
        when ``short`` (a last name that takes the rest, ``rest..`` or ``bells..``, is never
        here: the caller adds those keys)."""
        names = self.keys[: len(self.keys) - self.optional] if short else self.keys
        return [_key(k, n, agent) for n in names if not n.endswith("..")]

    def index(self, arg: str) -> int:
        """Where ARGV ``arg`` sits in a call's argument list (from 0)."""
        return self.argv.index(arg)

    def call(self, keys: Sequence[str], args: Sequence[Any]) -> Call:
        """A call, its arity checked against the header (a mistake here is a bug, not input)."""
        least, most = self.key_counts
        if len(keys) < least or (most is not None and len(keys) > most):
            raise TypeError(f"{self.name}.lua takes {self.keys} as KEYS, got {len(keys)}")
        least, most = self.arg_counts
        if len(args) < least or (most is not None and len(args) > most):
            raise TypeError(f"{self.name}.lua takes {self.argv} as ARGV, got {len(args)}")
        return Call(self.name, keys, args)


def _key(k: ChannelKeys, name: str, agent: str) -> str:
    if name == "bell":
        return k.bell(agent)
    if name == "wakeup":
        return k.wakeup(agent)
    return str(getattr(k, name))


def _counts(names: tuple[str, ...], optional: int) -> tuple[int, int | None]:
    """How many values fit ``names``: (least, most), most None when the last name ends in
    ``..`` (it takes any more)."""
    variadic = bool(names) and names[-1].endswith("..")
    fixed = len(names) - variadic
    return fixed - optional, None if variadic else fixed


def _s(name: str, keys: str, argv: str, *, record: str = "", **kw: Any) -> Script:
    return Script(
        name, tuple(keys.split()), tuple(argv.split()), record=tuple(record.split()), **kw
    )


_MEMBER = "stream members parents status ids inbox beat bell wakeup"

BEAT = _s("beat", "beat status", "lease period triples..")
CHANNEL = _s("channel", "meta", "mode triples..")
CLAIM = _s(
    "claim",
    "stream inbox marks dlq rate meta status",
    "agent consumer lease max_deliveries count own held..",
    optional=1,
)
CONFIGURE = _s("configure", "meta limits rate", "pairs..")
DELETE = _s("delete", "meta status inbox beat rest..", "force")
DONE = _s("done", "stream inbox marks", "agent result ids..")
JOIN = _s(
    "join",
    "stream meta members parents status ids inbox beat marks idem",
    "name parent parented id replica host description skills lease",
)
LEASE = _s("lease", "stream", "agent consumer entry..")
LEAVE = _s("leave", _MEMBER, "agent id replica")
OUTCOME = _s(
    "outcome",
    "stream parents status inbox bells..",
    "op actor target text sig control_sig signed_at known",
    optional_args=1,
)
RECEIPT = _s("receipt", "stream marks", "entry")
REMOVE = _s("remove", _MEMBER, "agent force")
REPAIR = _s("repair", "stream inbox", "budget")
REPLAY = _s("replay", "stream inbox dlq status bells..", "dead sig signed_at", optional_args=2)
SEND = _s(
    "send",
    "stream meta parents status ids inbox rate idem limits bells..",
    "messages..",
    record="sender mode recipients subject body type priority reply_to ttl idempotency trace "
    "signature signed_at cause",
)
SETTLE = _s("settle", "stream inbox marks status", "agent pairs..")
SWEEP = _s(
    "sweep",
    "stream inbox marks idem dlq meta rate nonces nonce_at status",
    "lease max_deliveries retention idle budget keep",
)
VIEW = _s(
    "view",
    "stream inbox marks nonces nonce_at dlq rate meta bell wakeup",
    "agent consumer pull mark since limit unread from to subject scope keep resume",
    optional_args=1,
)
WAKE = _s(
    "wake",
    "stream inbox marks status bell wakeup nonces nonce_at",
    "agent consumer keep blocked",
    optional=2,
)

#: Every binding by its script's name.
SCRIPTS: dict[str, Script] = {
    s.name: s
    for s in (
        BEAT,
        CHANNEL,
        CLAIM,
        CONFIGURE,
        DELETE,
        DONE,
        JOIN,
        LEASE,
        LEAVE,
        OUTCOME,
        RECEIPT,
        REMOVE,
        REPAIR,
        REPLAY,
        SEND,
        SETTLE,
        SWEEP,
        VIEW,
        WAKE,
    )
}


def flag(b: bool) -> str:
    return "1" if b else "0"


# -- the calls, and what they return ------------------------------------------------------------


def beat(k: ChannelKeys, lease_ms: int, period_ms: int, triples: Sequence[str]) -> Call:
    """Renew the heartbeats of (agent, replica, status to set) triples."""
    return BEAT.call(BEAT.keys_of(k), [lease_ms, period_ms, *triples])


def beaten(reply: Sequence[Any]) -> tuple[list[str], list[Any]]:
    """beat.lua's reply: the agents found lost, and (agent, status, live replicas) flat."""
    lost, mine = reply
    return list(lost), list(mine)


def channel(k: ChannelKeys, create: bool, settings: Iterable[tuple[str, str, bool]]) -> Call:
    """Create the channel (``create``) or attach to it; ``settings``: plan_channel's."""
    args = ["create" if create else "attach"]
    for name, value, explicit in settings:
        args += [name, value, flag(explicit)]
    return CHANNEL.call(CHANNEL.keys_of(k), args)


def channel_reply(name: str, reply: Sequence[Any]) -> tuple[bool, ChannelConfig]:
    """channel.lua's reply: (created, the stored configuration); UnknownChannel when it
    only attached and there is no such channel, ChannelMismatch when a value differs."""
    if int(reply[0]) == -1:
        raise UnknownChannel(f"no such channel: {name!r} (create it with bus.channel())")
    return parse_channel(name, reply)


def claim(
    k: ChannelKeys,
    agent: str,
    consumer: str,
    lease_ms: int,
    max_deliveries: int,
    count: int,
    own: str,
    held: Iterable[str],
) -> Call:
    """Pending entries due to ``consumer`` (see claim.lua), the agent's status read too."""
    args = [agent, consumer, lease_ms, max_deliveries, count, own, *held]
    return CLAIM.call(CLAIM.keys_of(k), args)


class Claimed(NamedTuple):
    entries: list[Any]  # {id, {field, value...}, deliveries}
    dead: int
    resume: str
    now_ms: int
    status: str | None


def claimed(reply: Sequence[Any]) -> Claimed:
    entries, dead, resume, now_ms, *status = reply
    return Claimed(
        entries, int(dead), str(resume or ""), int(now_ms), status[0] if status else None
    )


def configure(k: ChannelKeys, fields: Mapping[str, str]) -> Call:
    return CONFIGURE.call(CONFIGURE.keys_of(k), [x for kv in fields.items() for x in kv])


def configured(reply: Sequence[Any]) -> dict[str, str]:
    """configure.lua's reply: meta after the change (a refusal raised)."""
    raise_if_refused(reply)
    flat = reply[1:]
    return dict(zip(flat[::2], flat[1::2], strict=True))


def delete(k: ChannelKeys, members: Iterable[str], force: bool) -> Call:
    """Delete every key of the channel and the doorbells and wakeup lists of ``members``."""
    first = DELETE.keys_of(k)
    rest = [
        getattr(k, f)
        for f in ChannelKeys.__dataclass_fields__
        if f not in ("channel", "bells", "wakeups") and getattr(k, f) not in first
    ]
    per_member = [key for n in members for key in (k.bell(n), k.wakeup(n))]
    return DELETE.call([*first, *rest, *per_member], [flag(force)])


def done(k: ChannelKeys, agent: str, result: str, ids: Sequence[str]) -> Call:
    return DONE.call(DONE.keys_of(k), [agent, result, *ids])


def done_flags(reply: Sequence[Any]) -> list[int]:
    """done.lua's one flag per id (see its header)."""
    return [int(x) for x in reply]


def join(
    k: ChannelKeys,
    name: str,
    parent: str | None,
    agent_id: str,
    replica: str,
    host: str,
    description: str,
    skills: Sequence[str],
    lease_ms: int,
) -> Call:
    args = [
        name,
        parent or "",
        flag(parent is not None),
        agent_id,
        replica,
        host,
        description,
        json.dumps(list(skills)),
        lease_ms,
    ]
    return JOIN.call(JOIN.keys_of(k), args)


class Joined(NamedTuple):
    id: str
    depth: int
    parent: str | None
    status: str
    created: bool


def joined(reply: Sequence[Any]) -> Joined:
    raise_if_refused(reply)
    if len(reply) != 6:  # join.lua found the member's record without an id (a raw write)
        raise RedisbusError(
            "the member's stored record is unreadable: remove it (ch.remove(name, force=True)) "
            "and join again"
        )
    _, agent_id, depth, parent, status, created = reply
    return Joined(str(agent_id), int(depth), parent or None, str(status), int(created) == 1)


def leave(k: ChannelKeys, agent: str, agent_id: str, replica: str) -> Call:
    return LEAVE.call(LEAVE.keys_of(k, agent), [agent, agent_id, replica])


def left(reply: Sequence[Any]) -> bool:
    return int(reply[0]) == 1


def outcome(
    k: ChannelKeys,
    op: str,
    actor: str,
    target: str,
    text: str,
    sigs: Sequence[str],
    to: Iterable[str] = (),
) -> Call:
    """An outcome (complete, fail), a cancel or a loss; ``sigs``: sign_outcome's three; ``to``:
    the agents it is known to write to (the outcome's parent; a cancelled target), whose
    doorbells it is given (those of others, a cascade's, it asks for: see ``unrung``)."""
    keys = [*OUTCOME.keys_of(k), *doorbells(k.stream, to)]
    return OUTCOME.call(keys, [op, actor, target, text, *sigs])


def outcome_id(reply: Sequence[Any]) -> str | None:
    """outcome.lua's reply: the outcome entry's id (None when none was written)."""
    raise_if_refused(reply)
    return str(reply[1]) or None


def lease(k: ChannelKeys, agent: str, consumer: str, ids: Sequence[str]) -> Call:
    return LEASE.call(LEASE.keys_of(k), [agent, consumer, *ids])


def receipt(k: ChannelKeys, entry: str) -> Call:
    return RECEIPT.call(RECEIPT.keys_of(k), [entry])


def remove(k: ChannelKeys, agent: str, force: bool) -> Call:
    return REMOVE.call(REMOVE.keys_of(k, agent), [agent, flag(force)])


def repair(k: ChannelKeys, budget: int) -> Call:
    return REPAIR.call(REPAIR.keys_of(k), [budget])


def repaired(reply: Sequence[Any]) -> dict[str, tuple[int | None, int]] | None:
    """repair.lua's reply: name -> (stored or None, counted) for the wrong counters; None when
    the budget was hit (nothing written)."""
    if not int(reply[0]):
        return None
    flat = reply[1:]
    return {
        str(flat[i]): (int(flat[i + 1]) if flat[i + 1] != "" else None, int(flat[i + 2]))
        for i in range(0, len(flat), 3)
    }


def replay(k: ChannelKeys, dead: str, sig: Sequence[str]) -> Call:
    """Replay a dead letter; ``sig``: the replay's signature and time, or nothing."""
    return REPLAY.call(REPLAY.keys_of(k), [dead, *sig])


def replayed(reply: Sequence[Any]) -> str:
    raise_if_refused(reply)
    return str(reply[1])


def send_keys(k: ChannelKeys) -> list[str]:
    """send.lua's KEYS but the doorbells (a handle keeps them: every send passes the same,
    then the doorbells of its recipients)."""
    return SEND.keys_of(k)


#: How many of send.lua's KEYS come before the doorbells.
SEND_FIXED = len(SEND.keys) - 1


def send(keys: Sequence[str], records: Iterable[Sequence[str]]) -> Call:
    """One send.lua call of one message's fields (``SendPlan.argv``) or several; ``keys``:
    ``send_keys``, then the doorbells of the recipients (``_keys.doorbells``)."""
    # (the hot path: only the records are checked)
    args: list[str] = []
    for r in records:
        if len(r) != _SEND_FIELDS:
            raise TypeError(f"send.lua takes {_SEND_FIELDS} fields a message, got {len(r)}")
        args += r
    return Call("send", keys, args)


_SEND_FIELDS = len(SEND.record)


#: The scripts that ring doorbells, and so may answer that they need more (``unrung``).
RINGS = frozenset({"send", "outcome", "replay"})


def unrung(call: Call, reply: Any) -> list[str] | None:
    """A script that rings doorbells is given those of the agents it writes to in KEYS (no
    script makes a key's name). When a call lacked some (an agent id's, "parent"'s, a
    broadcast's members', a cascade's: the caller cannot always know them), the script wrote
    nothing and answered {-1, name, ...}: those names, whose doorbells the call is to be given
    (``with_bells``) before it is made again. None for any other reply."""
    if (
        call.script not in RINGS
        or not isinstance(reply, list)
        or not reply
        or not isinstance(reply[0], int)
        or reply[0] != -1
    ):
        return None
    return [str(n) for n in reply[1:]]


def with_bells(call: Call, names: Iterable[str]) -> Call:
    """``call`` given the doorbells of ``names`` too (its first key is the channel's stream).

    Made again, a send's broadcasts go to the members whose doorbells they are given
    (recipients "known"): every member the first try found is among them, and one that joined
    since joined after the broadcast began, so it neither receives it nor makes it ask again.
    An outcome's cascade ("known" too) cancels such a late descendant without ringing it (it
    learns from its status). Else members that keep joining could keep a call asking."""
    args = call.args
    if call.script == "send":
        args = list(args)
        for i in range(0, len(args) - _SEND_FIELDS + 1, _SEND_FIELDS):
            if args[i + 1] == "all":
                args[i + 2] = "known"
    elif call.script == "outcome":
        args = [*args[: len(OUTCOME.argv) - 1], "known"]  # (its last, optional: "known")
    return Call(call.script, [*call.keys, *doorbells(call.keys[0], names)], args)


def settle(keys: Sequence[str], agent: str, ops: Sequence[str]) -> Call:
    """settle.lua of deferred (op, entry id) pairs; ``keys``: ``SETTLE.keys_of``."""
    return SETTLE.call(keys, [agent, *ops])


def sweep(
    k: ChannelKeys,
    lease_ms: int,
    max_deliveries: int,
    retention_ms: int,
    idle_ms: int,
    budget: int,
    keep_ms: int,
) -> Call:
    args = [lease_ms, max_deliveries, retention_ms, idle_ms, budget, keep_ms]
    return SWEEP.call(SWEEP.keys_of(k), args)


def swept(reply: Sequence[Any]) -> SweepReport:
    return SweepReport(*(int(x) for x in reply))


def view(
    k: ChannelKeys, agent: str, plan: Sequence[str], keep_ms: int, resume: str | None = None
) -> Call:
    """view.lua for ``agent``: ``plan``, plan_view's ARGV (agent to scope), then the replay
    horizon, and the resume token of the call before (None: from the start)."""
    args = [*plan, keep_ms] if resume is None else [*plan, keep_ms, resume]
    return VIEW.call(VIEW.keys_of(k, agent), args)


def with_limit(plan: Sequence[str], limit: int) -> list[str]:
    """plan_view's ARGV with another limit (0: only fetch new entries into the group)."""
    out = list(plan)
    out[VIEW.index("limit")] = str(limit)
    return out


def wake_keys(k: ChannelKeys, agent: str, signing: bool) -> list[str]:
    """KEYS of wake.lua for ``agent``: the replay record only with signing on."""
    return WAKE.keys_of(k, agent, short=not signing)


class FetchKeys(NamedTuple):
    """The keys one fetch of an agent names (``_redis.fetch_commands``): settle.lua's KEYS,
    the agent's wakeup list (what the wait blocks on), wake.lua's KEYS. Made once per handle:
    a wait does not build them."""

    settle: list[str]
    wakeup: str
    wake: list[str]


def fetch_keys(k: ChannelKeys, agent: str, signing: bool) -> FetchKeys:
    return FetchKeys(SETTLE.keys_of(k), k.wakeup(agent), wake_keys(k, agent, signing))


def wake(keys: Sequence[str], agent: str, consumer: str, keep_ms: int, blocked: bool) -> Call:
    """wake.lua; ``blocked``: it follows the wait's blocking pop of the wakeup list."""
    return WAKE.call(keys, [agent, consumer, keep_ms, flag(blocked)])
