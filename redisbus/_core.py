"""Everything the sync and async faces share that does no I/O: the arguments each script takes,
and the parsing of what it returns. A face only decides *how* to wait on the network.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, NamedTuple, cast

from . import _validate as check
from ._errors import (
    ChannelMismatch,
    InvalidInput,
    RedisbusError,
    UnknownAgent,
    error_from_code,
)
from ._filters import Filter, later_id, parse_filter, parse_since
from ._model import (
    _EPOCH,
    MESSAGE_TYPES,
    DeadLetter,
    Member,
    Message,
    Receipt,
    Relationship,
    Roster,
    Status,
    WaitKind,
    _OpenMessage,
    id_ms,
    ms_to_dt,
    queued_receipt,
)
from ._settings import BusSettings
from ._signing import Signer

Routing = Literal["open", "family"]

# Channel limits stored in Redis, with the BusSettings field each defaults from.
LIMITS: tuple[str, ...] = (
    "inbox_cap",
    "max_body_bytes",
    "max_name_chars",
    "pair_rate_burst",
    "pair_rate_per_s",
    "sender_rate_burst",
    "sender_rate_per_s",
    "max_chain_depth",
    "max_depth",
    "max_members",
    "max_messages",
    "retention_s",
    "lease_s",
    "max_deliveries",
    "dampen_turns",
    "dampen_window_s",
    "breaker_failures",
    "breaker_window_s",
    "breaker_cooldown_s",
)
_INT_LIMITS = frozenset(
    {
        "inbox_cap",
        "max_body_bytes",
        "max_name_chars",
        "max_chain_depth",
        "max_depth",
        "max_members",
        "max_messages",
        "max_deliveries",
        "dampen_turns",
        "breaker_failures",
    }
)


# "outcome" and "control" are written only by the bus itself (complete/fail/cancel/lost):
# a sender could otherwise forge a cancellation.
SENDABLE_TYPES = MESSAGE_TYPES - {"outcome", "control"}


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    """A channel's configuration as stored in Redis (every host enforces the same numbers)."""

    name: str
    routing: Routing
    siblings: bool
    paused: bool
    limits: Mapping[str, float]
    created_ms: int

    def __getattr__(self, item: str) -> float:
        try:
            return self.limits[item]
        except KeyError:
            raise AttributeError(item) from None


def plan_channel(
    settings: BusSettings, routing: object, siblings: object, overrides: Mapping[str, object]
) -> list[str]:
    """ARGV for channel.lua: (field, value, explicit) triples."""
    overrides = dict(overrides)
    deny = overrides.pop("auto_reply_deny", None)
    unknown = set(overrides) - set(LIMITS)
    if unknown:
        raise InvalidInput(f"unknown channel limit(s): {', '.join(sorted(unknown))}")
    if routing is not None and routing not in ("open", "family"):
        raise InvalidInput(f"routing must be 'open' or 'family', got {routing!r}")
    if siblings is not None and not isinstance(siblings, bool):
        raise InvalidInput("siblings must be True or False")
    argv: list[str] = [
        "routing",
        str(routing or "open"),
        "1" if routing is not None else "0",
        "siblings",
        "1"
        if siblings
        else ("0" if siblings is not None else ("1" if (routing or "open") == "open" else "0")),
        "1" if siblings is not None else "0",
    ]
    for field in LIMITS:
        if field in overrides and overrides[field] is not None:
            value = overrides[field]
            if field in _INT_LIMITS:
                v: float = check.integer(value, field, 0, 2**31)
            else:
                v = check.positive_number(value, field)
            explicit = "1"
        else:
            v = float(getattr(settings, field))
            explicit = "0"
        argv += [field, _fmt(v), explicit]
    if deny is None:
        argv += ["auto_reply_deny", "\n".join(settings.auto_reply_deny), "0"]
    else:
        if isinstance(deny, str) or not isinstance(deny, list | tuple | set | frozenset):
            raise InvalidInput("auto_reply_deny must be a list of agent names")
        names = [check.name(n, "denied sender") for n in deny]
        argv += ["auto_reply_deny", "\n".join(names), "1"]
    return argv


def parse_channel(name: str, reply: Sequence[Any]) -> tuple[bool, ChannelConfig]:
    if int(reply[0]) == 0:
        _, field, stored, wanted = reply
        raise ChannelMismatch(
            f"channel {name!r} exists with {field}={stored}; you passed {wanted} "
            f"(attach without it, or reconfigure with ch.configure({field}=...))"
        )
    created = int(reply[1]) == 1
    flat = list(reply[2:])
    return created, config_from_hash(name, dict(zip(flat[::2], flat[1::2], strict=True)))


def config_from_hash(name: str, h: Mapping[str, str]) -> ChannelConfig:
    if not h:
        raise UnknownAgent(f"no such channel: {name!r}")
    limits = {f: float(h[f]) for f in LIMITS if f in h}
    return ChannelConfig(
        name=name,
        routing="family" if h.get("routing") == "family" else "open",
        siblings=h.get("siblings") == "1",
        paused=h.get("paused") == "1",
        limits=limits,
        created_ms=int(h.get("created_ms", "0")),
    )


def new_agent_id() -> str:
    return "ag-" + secrets.token_hex(6)


def refusal(code: str, message: str, limit: str, current: str, retry_ms: str) -> RedisbusError:
    return error_from_code(
        code,
        message,
        limit=float(limit) if limit else None,
        current=float(current) if current else None,
        retry_after_s=float(retry_ms) / 1000 if retry_ms else None,
    )


def raise_if_refused(reply: Sequence[Any]) -> None:
    """join.lua / status.lua style replies: {0, code, message} is a refusal."""
    if int(reply[0]) == 0:
        raise error_from_code(str(reply[1]), str(reply[2]))


# -- messages -----------------------------------------------------------------------------------


def message_from_fields(
    channel: str,
    entry_id: str,
    f: Mapping[str, str],
    *,
    read: bool,
    deliveries: int = 1,
    verified: bool | None = None,
) -> Message:
    # Every wake-up makes one of these: one lookup per field, and (as queued_receipt does)
    # the eighteen fields set on a twin without the frozen guard, which then becomes a
    # Message: an ordinary frozen Message (tests/test_model.py compares it with the keyword
    # form), made in half the time
    get = f.get
    to, prio, depth, ttl = get("t"), get("p"), get("d"), get("x")
    m: Any = _OpenMessage()
    m.id, m.channel, m.sender, m.to = (
        entry_id,
        channel,
        get("f", ""),
        tuple(to.split("\n")) if to else (),
    )
    m.subject, m.body, m.type = get("s", ""), get("b", ""), get("k", "message")
    m.priority = int(prio) if prio and prio.isdigit() else 0
    m.reply_to = get("r") or None
    m.depth = int(depth) if depth and depth.isdigit() else 0
    m.created_at = _EPOCH + timedelta(milliseconds=int(entry_id.partition("-")[0]))
    m.ttl_s = float(ttl) if ttl else None
    m.read, m.truncated, m.verified, m.deliveries = read, False, verified, deliveries
    m.idempotency_key, m.trace = get("i") or None, get("c") or None
    object.__setattr__(m, "__class__", Message)
    return cast(Message, m)


def fields_from_flat(flat: Sequence[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=False))


def addressed_to(f: Mapping[str, str], agent: str) -> bool:
    to = f.get("t")
    return to is not None and (to == agent or agent in to.split("\n"))


def expired_at(entry_id: str, f: Mapping[str, str], now_ms: int) -> bool:
    ttl = f.get("x")
    return bool(ttl) and id_ms(entry_id) + float(ttl) * 1000 < now_ms  # type: ignore[arg-type]


def wait_kind(agent: str, messages: Sequence[Message]) -> WaitKind:
    """The kind of a wait() that returns ``messages``: "cancelled" when any is a cancel,
    "outcome" when all are outcomes, else "message"."""
    outcomes = bool(messages)
    for m in messages:
        if m.type != "outcome":
            if m.type == "control" and m.subject == "cancel":
                return "cancelled"
            outcomes = False
    return "outcome" if outcomes else "message"


# -- send ---------------------------------------------------------------------------------------


class SendPlan(NamedTuple):
    """A checked send: its mode ("one", "many", "all"), the names as given, send.lua's ARGV.
    A named tuple: made on every send, it costs half what a frozen dataclass does."""

    mode: str
    names: list[str]
    argv: list[str]


def plan_send(
    sender: str,
    to: object,
    body: object,
    *,
    subject: object = "",
    type: object = "message",
    priority: object = 0,
    reply_to: object = None,
    ttl_s: object = None,
    idempotency_key: object = None,
    trace: object = None,
    signer: Signer | None = None,
    channel: str = "",
) -> SendPlan:
    mode, names = check.recipients(to)
    text_body = check.body(body)
    subj = check.text(subject, "subject")
    if not isinstance(type, str) or type not in SENDABLE_TYPES:
        raise InvalidInput(f"type must be one of {sorted(SENDABLE_TYPES)}, got {type!r}")
    prio = check.integer(priority, "priority", 0, 2)
    rt = ""
    if reply_to is not None:
        from ._filters import check_entry_id

        rt = check_entry_id(reply_to, "reply_to")
    ttl = ""
    if ttl_s is not None:
        ttl = _fmt(check.positive_number(ttl_s, "ttl_s", allow_zero=False))
    ikey = "" if idempotency_key is None else check.name(idempotency_key, "idempotency_key", 256)
    tr = "" if trace is None else check.text(trace, "trace", 1024)
    sig = ts = ""
    if signer is not None and signer.enabled:
        sig, ts = signer.sign(
            channel,
            {
                "f": sender,
                "s": subj,
                "b": text_body,
                "k": type,
                "p": str(prio),
                "r": rt,
                "x": ttl,
                "i": ikey,
            },
        )
    return SendPlan(
        mode,
        names,
        [
            sender,
            mode,
            "\n".join(names),
            subj,
            text_body,
            type,
            str(prio),
            rt,
            ttl,
            ikey,
            tr,
            sig,
            ts,
        ],
    )


def plan_batch(
    sender: str, items: Iterable[object], signer: Signer | None, channel: str
) -> tuple[list[SendPlan], list[str]]:
    """send_many's items checked (all of them, before anything is sent): their plans and
    message types. An item is a ``(to, body)`` pair or a mapping of send() arguments."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidInput(f"send_many takes a list of items, got {type(items).__name__}")
    plans: list[SendPlan] = []
    types: list[str] = []
    for item in items:
        kw: dict[str, Any] = {}
        if (item.__class__ is tuple or isinstance(item, tuple | list)) and len(item) == 2:
            to, body = item
        elif isinstance(item, Mapping):
            kw = dict(item)
            if "to" not in kw or "body" not in kw:
                raise InvalidInput("a send_many item needs 'to' and 'body'")
            unknown = kw.keys() - _BATCH_ARGS
            if unknown:
                raise InvalidInput(f"send_many items take no {sorted(map(str, unknown))}")
            to, body = kw.pop("to"), kw.pop("body")
        else:
            raise InvalidInput(
                "a send_many item is a (to, body) pair or a dict of send() arguments, "
                f"got {type(item).__name__}"
            )
        if kw:
            plans.append(plan_send(sender, to, body, **kw, signer=signer, channel=channel))
            types.append(kw.get("type", "message"))
        else:  # a pair: send()'s defaults
            plans.append(plan_send(sender, to, body, signer=signer, channel=channel))
            types.append("message")
    return plans, types


#: What a send_many item may say: send()'s arguments that one script call can honour.
_BATCH_ARGS = frozenset(
    {"to", "body", "subject", "type", "priority", "reply_to", "ttl_s", "idempotency_key", "trace"}
)


def batch_results(
    plans: Sequence[SendPlan], types: Sequence[str], replies: Sequence[Any]
) -> tuple[list[Any], dict[str, int], list[str]]:
    """One result per plan (a receipt, a list of them, or rejected receipts where the send was
    refused), the accepted messages by type and the refusals' codes (one per recipient)."""
    out: list[Any] = []
    counts: dict[str, int] = {}
    refused: list[str] = []
    times: dict[str, datetime | None] = {}
    for plan, type_, reply in zip(plans, types, replies, strict=True):
        if isinstance(reply, RedisbusError):  # the whole call failed
            out.append(rejected_receipt(plan, reply))
            continue
        try:
            result = parse_send(plan, reply, times)
        except RedisbusError as e:
            refused.append(e.code)
            out.append(rejected_receipt(plan, e))
            continue
        out.append(result)
        if isinstance(result, Receipt):  # one recipient: accepted (a refusal raised above)
            if result.id:
                counts[type_] = counts.get(type_, 0) + 1
            continue
        if any(r.id for r in result):
            counts[type_] = counts.get(type_, 0) + 1
        refused += [r.error.code for r in result if r.error is not None]
    return out, counts, refused


#: Messages per send.lua call in send_many: one call checks and appends them all, sharing the
#: reads; bounded so that one call holds the server for a millisecond or two at most.
SEND_BATCH = 100


def batch_calls(
    keys: Sequence[str], plans: Sequence[SendPlan]
) -> list[tuple[str, Sequence[str], list[str]]]:
    """send.lua calls for ``plans``, up to SEND_BATCH messages each (argv concatenated)."""
    calls: list[tuple[str, Sequence[str], list[str]]] = []
    for i in range(0, len(plans), SEND_BATCH):
        argv: list[str] = []
        for p in plans[i : i + SEND_BATCH]:
            argv += p.argv
        calls.append(("send", keys, argv))
    return calls


def unbatch(plans: Sequence[SendPlan], replies: Sequence[Any]) -> list[Any]:
    """One reply (or the call's error) per plan, from the replies of ``batch_calls``."""
    sizes = [len(plans[i : i + SEND_BATCH]) for i in range(0, len(plans), SEND_BATCH)]
    return split_replies(sizes, replies)


def split_replies(sizes: Sequence[int], replies: Sequence[Any]) -> list[Any]:
    """Replies of calls that each carried ``sizes[i]`` messages, one per message: send.lua
    answers a call of several with a list; a failed call fails each of its messages."""
    out: list[Any] = []
    for n, reply in zip(sizes, replies, strict=True):
        if n == 1:
            out.append(reply)
        elif isinstance(reply, Exception):
            out += [reply] * n
        else:
            out += list(reply)
    return out


def parse_send(
    plan: SendPlan, reply: Sequence[Any], times: dict[str, datetime | None] | None = None
) -> Receipt | list[Receipt]:
    """Raise for a refused send; otherwise the receipt (one recipient) or receipts.
    ``times``: entry-id milliseconds already turned into datetimes (a batch's replies mostly
    share theirs)."""
    kind = int(reply[0])
    if kind == 1 and plan.mode == "one":  # accepted: {1, id, name}
        entry_id = reply[1]
        if times is None:
            return queued_receipt(entry_id, reply[2], ms_to_dt(id_ms(entry_id)))
        ms = entry_id.partition("-")[0]
        at = times.get(ms)
        if at is None:
            at = times[ms] = ms_to_dt(int(ms))
        return queued_receipt(entry_id, reply[2], at)
    if kind == 0:
        _, code, message, limit, current, retry_ms = reply
        raise refusal(str(code), str(message), str(limit), str(current), str(retry_ms))
    entry_id = reply[1] or None
    accepted = list(reply[2])
    queued = ms_to_dt(id_ms(entry_id)) if entry_id else None
    receipts = [queued_receipt(entry_id, n, queued) for n in accepted]
    if kind == 1:
        flat = list(reply[3])
        for i in range(0, len(flat), 6):
            name, code, message, limit, current, retry_ms = flat[i : i + 6]
            receipts.append(
                Receipt(
                    id=None,
                    to=str(name),
                    status="rejected",
                    error=refusal(str(code), str(message), str(limit), str(current), str(retry_ms)),
                )
            )
    if plan.mode == "one":
        return receipts[0]
    if plan.mode == "many":
        order = {n: i for i, n in enumerate(plan.names)}
        receipts.sort(key=lambda r: order.get(r.to, len(order)))
    return receipts


# -- receipts -----------------------------------------------------------------------------------


def parse_receipt(entry_id: str, reply: Sequence[Any]) -> list[Receipt]:
    now = int(reply[0])
    if len(reply) == 1:
        raise InvalidInput(f"no message {entry_id} on this channel (never sent, or trimmed)")
    ttl = float(reply[1]) if reply[1] else None
    queued = ms_to_dt(id_ms(entry_id))
    out = []
    for name, passed, idle, mark in reply[2:]:
        status: Status
        delivered = read = done = None
        result = None
        idle = int(idle)
        mark = str(mark)
        if mark.startswith("D"):
            parts = mark[1:].split(":", 3)
            status = "done"
            done = ms_to_dt(int(parts[0]))
            read = ms_to_dt(int(parts[1])) if len(parts) > 1 and parts[1] else None
            delivered = ms_to_dt(int(parts[2])) if len(parts) > 2 and parts[2] else None
            result = parts[3] if len(parts) > 3 and parts[3] else None
        elif mark.startswith("F"):
            status, done = "failed", ms_to_dt(int(mark[1:]))
        elif mark.startswith("X"):
            status = "expired"
        elif idle >= 0:
            delivered = ms_to_dt(now - idle)
            if mark.startswith("R"):
                status, read = "read", ms_to_dt(int(mark[1:]))
            else:
                status = "delivered"
        elif int(passed):
            status = "done"
        elif ttl is not None and id_ms(entry_id) + ttl * 1000 < now:
            status = "expired"
        else:
            status = "queued"
        out.append(
            Receipt(
                id=entry_id,
                to=str(name),
                status=status,
                queued_at=queued,
                delivered_at=delivered,
                read_at=read,
                done_at=done,
                result=result,
            )
        )
    return out


# -- views (read / list) ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ViewPlan:
    filter: Filter
    argv: list[str]
    limit: int


def plan_view(
    agent: str,
    consumer: str,
    routing: str,
    filter_by: object,
    since: object,
    limit: object,
    *,
    pull: bool,
    mark: bool,
) -> ViewPlan:
    flt = parse_filter(filter_by)
    lim = check.integer(limit, "limit", 1, 10_000)
    lower = later_id(parse_since(since), flt.after)
    to = agent if flt.to == "me" else (flt.to or "")
    scope = "board" if routing == "open" else "own"
    argv = [
        agent,
        consumer,
        "1" if pull else "0",
        "1" if mark else "0",
        lower or "",
        str(lim),
        "1" if flt.unread else "0",
        flt.sender or "",
        to,
        (flt.subject or "").lower(),
        scope,
    ]
    return ViewPlan(flt, argv, lim)


def verdict(
    signer: Signer | None, unsigned: str, channel: str, f: Mapping[str, str]
) -> bool | None:
    """None: signing off. True: verified. False: bad or missing signature, delivered flagged
    (``unsigned="flag"``). Raises nothing; the caller drops the entry when ``reject``."""
    if signer is None or not signer.enabled:
        return None
    return signer.verify(channel, f)


def parse_view(
    channel: str,
    agent: str,
    reply: Sequence[Any],
    *,
    preview_chars: int | None,
    signer: Signer | None = None,
    unsigned: str = "reject",
) -> list[Message]:
    out = []
    for entry_id, flat, mark in reply[3:]:
        f = fields_from_flat(flat)
        ok = verdict(signer, unsigned, channel, f)
        if ok is False and unsigned == "reject":
            continue
        msg = message_from_fields(channel, entry_id, f, read=(mark != ""), verified=ok)
        if preview_chars is not None and len(msg.body) > preview_chars:
            from dataclasses import replace

            msg = replace(msg, body=msg.body[:preview_chars], truncated=True)
        out.append(msg)
    return out


# -- roster -------------------------------------------------------------------------------------


def members_from_hashes(
    records: Mapping[str, str], statuses: Mapping[str, str]
) -> dict[str, Member]:
    import json

    out = {}
    for name, raw in records.items():
        r = json.loads(raw)
        skills = r.get("skills") or []
        out[name] = Member(
            name=name,
            id=r["id"],
            parent=r.get("parent") or None,
            depth=int(r.get("depth", 0)),
            status=statuses.get(name, "running"),  # type: ignore[arg-type]
            host=r.get("host", ""),
            description=r.get("description", ""),
            skills=tuple(skills) if isinstance(skills, list) else (),
        )
    return out


def roster_of(me: str, members: Mapping[str, Member], routing: str, siblings: bool) -> Roster:
    from dataclasses import replace

    if me not in members:
        raise UnknownAgent(f"{me!r} is not a member of this channel")
    self_m = members[me]
    groups: dict[Relationship, list[Member]] = {
        "parent": [],
        "sibling": [],
        "child": [],
        "member": [],
    }
    for name, m in members.items():
        if name == me:
            continue
        rel: Relationship
        if m.parent == me:
            rel = "child"
        elif self_m.parent is not None and name == self_m.parent:
            rel = "parent"
        elif m.parent == self_m.parent:
            rel = "sibling"
        else:
            rel = "member"
        reachable = (
            routing == "open" or rel in ("parent", "child") or (rel == "sibling" and siblings)
        )
        if reachable:
            groups[rel].append(replace(m, relationship=rel))
    family: list[Member] = []
    for rel in ("parent", "sibling", "child", "member"):
        family += sorted(groups[rel], key=lambda m: m.name)
    return Roster(self=self_m, family=family)


def tree_order(members: Mapping[str, Member]) -> list[Member]:
    """Every member, parents before children, siblings by name."""
    children: dict[str | None, list[Member]] = {}
    for m in members.values():
        children.setdefault(m.parent if m.parent in members else None, []).append(m)
    out: list[Member] = []
    stack = sorted(children.get(None, []), key=lambda m: m.name, reverse=True)
    while stack:
        m = stack.pop()
        out.append(m)
        stack += sorted(children.get(m.name, []), key=lambda c: c.name, reverse=True)
    return out


def rank_cards(query: str, roster: Roster, limit: int) -> list[Member]:
    """Agent cards ranked for a query: skill matches count double, then description and name."""
    words = [w for w in query.lower().replace(",", " ").split() if w]
    scored = []
    for pos, m in enumerate(roster.family):
        skills = " ".join(m.skills).lower()
        text = f"{m.name} {m.description}".lower()
        score = sum(2 * (w in skills) + (w in text) for w in words)
        if score or not words:
            scored.append((-score, pos, m))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [m for _, _, m in scored[:limit]]


def parse_dead_letters(channel: str, entries: Sequence[Any]) -> list[DeadLetter]:
    out = []
    for entry_id, f in entries:
        orig = f.get("o", "0-0")
        out.append(
            DeadLetter(
                id=entry_id,
                original_id=orig,
                recipient=f.get("a", ""),
                deliveries=int(f.get("n", "0")),
                reason=f.get("w", ""),
                dead_at=ms_to_dt(int(f["dead_ms"])) if f.get("dead_ms") else None,
                message=message_from_fields(channel, orig, f, read=False),
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class SweepReport:
    trimmed: int = 0
    dead_lettered: int = 0
    consumers_removed: int = 0
    expired_undone: int = 0


def with_durable(result: Receipt | list[Receipt], reached: bool) -> Any:
    from dataclasses import replace

    if isinstance(result, list):
        return [replace(r, durable=reached) if r.id else r for r in result]
    return replace(result, durable=reached)


def rejected_receipt(plan: SendPlan, err: RedisbusError) -> Receipt | list[Receipt]:
    """A refused send in a batch: the error as a receipt instead of an exception."""
    if plan.mode == "one":
        return Receipt(id=None, to=plan.names[0], status="rejected", error=err)
    names = plan.names or ["all"]
    return [Receipt(id=None, to=n, status="rejected", error=err) for n in names]


_OUTCOME_STATUS = {"complete": "completed", "fail": "failed", "cancel": "cancelled", "lost": "lost"}


def sign_outcome(
    signer: Signer, channel: str, op: str, actor: str, target: str, text: str
) -> list[str]:
    """Signatures of the messages outcome.lua writes: the outcome (from the target) and the
    control message that wakes a cancelled subtree (from the actor)."""
    if not signer.enabled:
        return ["", "", ""]
    status = _OUTCOME_STATUS.get(op, op)
    out_sig, ts = signer.sign(channel, {"f": target, "s": status, "b": text, "k": "outcome"})
    ctl_sig, _ = signer.sign(channel, {"f": actor, "s": "cancel", "b": text, "k": "control"}, ts)
    return [out_sig, ctl_sig, ts]
