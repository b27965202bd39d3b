"""Sends: the arguments of send.lua for one send and for a batch, the parsing of its replies
into receipts, receipts as read back, and the signatures of outcomes. No I/O."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, NamedTuple

from . import _bindings as bind
from . import _validate as check
from ._channels import fmt_number
from ._entries import ttl_seconds
from ._errors import (
    DeadLettered,
    InvalidInput,
    MessageRejected,
    RedisbusError,
    refusal,
)
from ._filters import check_entry_id
from ._model import (
    MESSAGE_TYPES,
    Receipt,
    Status,
    id_ms,
    ms_to_dt,
    queued_receipt,
)
from ._signing import Signer

# "outcome" and "control" are written only by the bus itself (complete/fail/cancel/lost):
# a sender could otherwise forge a cancellation.
SENDABLE_TYPES = MESSAGE_TYPES - {"outcome", "control"}

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
    parent: str | None = None,
    cause: str = "",
) -> SendPlan:
    """``cause``: the entry id of the message the sender is handling ("" when none): the new
    message joins its chain, one deeper (send.lua reads the chain from that entry)."""
    mode, names = check.recipients(to)
    text_body = check.body(body)
    subj = check.text(subject, "subject")
    if not isinstance(type, str) or type not in SENDABLE_TYPES:
        raise InvalidInput(f"type must be one of {sorted(SENDABLE_TYPES)}, got {type!r}")
    prio = check.integer(priority, "priority", 0, 2)
    rt = ""
    if reply_to is not None:
        rt = check_entry_id(reply_to, "reply_to")
    ttl = ""
    if ttl_s is not None:
        ttl = fmt_number(check.positive_number(ttl_s, "ttl_s", allow_zero=False))
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
                "c": tr,
                "u": cause,  # what the chain id and depth are derived from, with "r"
            },
            mode=mode,
            # the recipients as requested, "parent" resolved: receivers find themselves in it
            recipients=[parent if n == "parent" and parent else n for n in names],
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
            cause,
        ],
    )


def plan_batch(
    sender: str,
    items: Iterable[object],
    signer: Signer | None,
    channel: str,
    parent: str | None = None,
    cause: str = "",
) -> tuple[list[SendPlan], list[str]]:
    """send_many's items checked (all of them, before anything is sent): their plans and
    message types. An item is a ``(to, body)`` pair or a mapping of send() arguments; each
    carries ``cause`` (see plan_send)."""
    if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
        raise InvalidInput(f"send_many takes a list of items, got {type(items).__name__}")
    plans: list[SendPlan] = []
    types: list[str] = []
    # unsigned, a pair's plan is plan_send's with its defaults, whose checks pass by
    # construction: only the recipients and the body are checked (the same checks)
    bare = signer is None or not signer.enabled
    for item in items:
        kw: dict[str, Any] = {}
        if item.__class__ is tuple and len(item) == 2 and bare:
            to, body = item
            mode, names = check.recipients(to)
            text_body = check.body(body)
            rcpt = names[0] if mode == "one" else "\n".join(names)
            plans.append(
                SendPlan(
                    mode,
                    names,
                    [sender, mode, rcpt, "", text_body, "message", "0", *_BARE, cause],
                )
            )
            types.append("message")
            continue
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
            plans.append(
                plan_send(
                    sender,
                    to,
                    body,
                    **kw,
                    signer=signer,
                    channel=channel,
                    parent=parent,
                    cause=cause,
                )
            )
            types.append(kw.get("type", "message"))
        else:  # a pair: send()'s defaults
            plans.append(
                plan_send(
                    sender, to, body, signer=signer, channel=channel, parent=parent, cause=cause
                )
            )
            types.append("message")
    return plans, types


#: A pair's reply_to, ttl, idempotency key, trace and signature (with its time): none.
_BARE = ("", "", "", "", "", "")

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
    keys_for: Callable[[Sequence[SendPlan]], Sequence[str]], plans: Sequence[SendPlan]
) -> list[bind.Call]:
    """send.lua calls for ``plans``, up to SEND_BATCH messages each (argv concatenated), each
    with the KEYS ``keys_for`` gives its messages (their recipients' doorbells)."""
    return [
        bind.send(keys_for(part), [p.argv for p in part])
        for part in (plans[i : i + SEND_BATCH] for i in range(0, len(plans), SEND_BATCH))
    ]


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
    if isinstance(reply, str):  # accepted, for the one recipient as named: its entry id
        entry_id, to = reply, plan.names[0]
    elif int(reply[0]) == 1 and plan.mode == "one":  # accepted: {1, id, name}
        entry_id, to = reply[1], reply[2]
    else:
        return _parse_other(plan, reply)
    if times is None:
        return queued_receipt(entry_id, to, ms_to_dt(id_ms(entry_id)))
    ms = entry_id.partition("-")[0]
    at = times.get(ms)
    if at is None:
        at = times[ms] = ms_to_dt(int(ms))
    return queued_receipt(entry_id, to, at)


def _parse_other(plan: SendPlan, reply: Sequence[Any]) -> Receipt | list[Receipt]:
    """parse_send for a refusal, an idempotent replay, or a send with several recipients."""
    kind = int(reply[0])
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
    if len(reply) > 4:  # some were refused: the script says each recipient's place
        place = {str(n): i for i, n in enumerate(reply[4])}
        receipts.sort(key=lambda r: place.get(r.to, len(place)))
    return receipts


# -- receipts -----------------------------------------------------------------------------------


def parse_receipt(entry_id: str, reply: Sequence[Any]) -> list[Receipt]:
    now = int(reply[0])
    if len(reply) == 1:
        raise InvalidInput(f"no message {entry_id} on this channel (never sent, or trimmed)")
    ttl = ttl_seconds(reply[1])  # (None for what a raw write left there)
    queued = ms_to_dt(id_ms(entry_id))
    out = []
    for name, passed, idle, mark in reply[2:]:
        status: Status
        delivered = read = done = None
        result = None
        error: RedisbusError | None = None
        idle = int(idle)
        mark = str(mark)
        if mark.startswith("D"):
            parts = mark[1:].split(":", 3)
            status = "done"
            done = ms_to_dt(int(parts[0]))
            read = ms_to_dt(int(parts[1])) if len(parts) > 1 and parts[1] else None
            delivered = ms_to_dt(int(parts[2])) if len(parts) > 2 and parts[2] else None
            result = parts[3] if len(parts) > 3 and parts[3] else None
        elif mark.startswith("F"):  # "F<ms>[:reason]" (marks written before reasons: none)
            when, _, why = mark[1:].partition(":")
            status, done = "failed", ms_to_dt(int(when))
            why = why or "max_deliveries"
            error = DeadLettered(f"dead-lettered: {why}", reason=why)
        elif mark.startswith("X"):
            status = "expired"
        elif mark.startswith("J"):
            reason = mark.partition(":")[2]
            status, done = "rejected", ms_to_dt(int(mark[1:].partition(":")[0]))
            error = MessageRejected(f"the recipient rejected the message: {reason}", reason=reason)
        elif idle >= 0:
            delivered = ms_to_dt(now - idle)
            if mark.startswith("R"):
                status, read = "read", ms_to_dt(int(mark[1:]))
            else:
                status = "delivered"
        elif int(passed):
            # the recipient's cursor is past it, and it was never handed over nor marked: no
            # send rang it (a raw write, such as a copy, which a wait jumps over) or its
            # recipient was removed before taking it; never done
            status = "rejected"
            error = MessageRejected(
                "never handed over: the recipient's cursor passed it (no send rang it, or the "
                "recipient was removed)",
                reason="passed_over",
            )
        elif ttl is not None and id_ms(entry_id) + ttl * 1000 < now:
            status = "expired"
        else:
            status = "queued"
        if delivered is not None:
            # the pending list keeps when an entry was last handed out, read as "now less its
            # idle time" (the clock read at another instant, to the millisecond), and a
            # re-read or a reclaim moves it later. Once read, the read mark (written as the
            # entry is handed over) says when: delivered_at is read_at; before, it is no
            # earlier than the send.
            if read is not None:
                delivered = read
            if queued is not None and delivered < queued:
                delivered = queued
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
                error=error,
            )
        )
    return out


def with_durable(result: Receipt | list[Receipt], reached: bool) -> Any:
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
    signer: Signer, channel: str, op: str, actor: str, target: str, text: str, parent: str = ""
) -> list[str]:
    """Signatures of the messages outcome.lua writes: the outcome (from the target, for its
    ``parent``) and the control message that wakes a cancelled subtree (from the actor, for
    the target)."""
    if not signer.enabled:
        return ["", "", ""]
    status = _OUTCOME_STATUS.get(op, op)
    # "lost" is declared by whichever host saw the leases run out, for an agent it may not
    # speak for: its own mode, which receivers check against the channel only
    lost = op == "lost"
    out_sig, ts = signer.sign(
        channel,
        {"f": target, "s": status, "b": text, "k": "outcome"},
        mode="lost" if lost else "out",
        recipients=[parent] if parent else (),
    )
    ctl_sig, _ = signer.sign(
        channel,
        {"f": actor, "s": "cancel", "b": text, "k": "control"},
        mode="lost" if lost else "ctl",
        recipients=[target],
        ts=ts,
    )
    return [out_sig, ctl_sig, ts]
