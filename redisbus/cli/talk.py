"""``redisbus`` commands that talk on a channel as one agent: join, send, read, list, wait,
done, receipt, discover."""

from __future__ import annotations

import dataclasses
import sys
import time
from typing import Annotated, Any

import typer
from rich.text import Text

from .. import _core as core
from .. import _validate as check
from .._commands import BusAddress, Exit, err, option, refusal_text, with_address
from .._errors import BusConnectionError, InvalidInput, RedisbusError
from .._model import Member, Message, Receipt
from .._show import message_text, receipt_table, safe
from ..bus import Agent
from ._shared import (
    AsOpt,
    ChannelArg,
    FilterOpt,
    JsonOpt,
    LimitOpt,
    ParentOpt,
    RoutingOpt,
    SinceOpt,
    acting,
    agent_option,
    attach,
    connect,
    existing_channel,
    member_handle,
    out,
    precheck,
    print_items,
    print_messages,
    write_json,
)

# -- talking ----------------------------------------------------------------------------------


def recipients(to: str) -> str | list[str]:
    """``a,b,c`` is a list of names (no name has a comma: --as refuses one); ``all``, ``parent``
    or a single name otherwise."""
    if "," not in to:
        return to
    names = [n.strip() for n in to.split(",")]
    if not all(names):
        raise InvalidInput(f"recipient list {to!r} has an empty name (syntax: a,b,c)")
    return names


@with_address
def join(
    address: BusAddress,
    channel: ChannelArg,
    agent: AsOpt,
    parent: ParentOpt = None,
    description: Annotated[
        str, option("--description", "REDISBUS_DESCRIPTION", "Agent card.")
    ] = "",
    skills: Annotated[
        list[str] | None, option("--skill", "REDISBUS_SKILLS", "Agent card skill (repeatable).")
    ] = None,
    routing: RoutingOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Join --as NAME to a channel (creating the channel if needed), so others can address it."""
    with connect(address) as bus:
        ch = bus.channel(channel, routing=routing)
        me = attach(ch, agent, parent, bus.settings, description=description, skills=skills or ())
        if as_json:
            write_json(
                {
                    "channel": ch.name,
                    "name": me.name,
                    "id": me.id,
                    "depth": me.depth,
                    "parent": me.parent,
                }
            )
        else:
            err.print(
                f"{me.name} ({me.id}) is a member of {ch.name}, depth {me.depth}"
                + (f", parent {me.parent}" if me.parent else "")
            )


@with_address
def send(
    address: BusAddress,
    channel: ChannelArg,
    to: Annotated[
        str,
        typer.Argument(
            help="Recipient: a name, 'parent', 'all', or a list a,b,c (names have no commas).",
            show_default=False,
        ),
    ],
    body: Annotated[str, typer.Argument(help="Message body; '-' reads stdin.", show_default=False)],
    agent: AsOpt,
    parent: ParentOpt = None,
    subject: Annotated[str, typer.Option("--subject", "-s", envvar="REDISBUS_SUBJECT")] = "",
    type_: Annotated[str, option("--type", "REDISBUS_TYPE", "message, request, ...", "-t")] = (
        "message"
    ),
    priority: Annotated[int, typer.Option("--priority", envvar="REDISBUS_PRIORITY")] = 0,
    reply_to: Annotated[str | None, typer.Option("--reply-to", envvar="REDISBUS_REPLY_TO")] = None,
    ttl: Annotated[float | None, option("--ttl", "REDISBUS_TTL_S", "s")] = None,
    key: Annotated[
        str | None, typer.Option("--idempotency-key", envvar="REDISBUS_IDEMPOTENCY_KEY")
    ] = None,
    await_delivery: Annotated[
        float | None,
        option(
            "--await-delivery",
            "REDISBUS_AWAIT_DELIVERY_S",
            "Wait up to this many seconds for the recipient to fetch it; exit 1 when it has not "
            "by then (the message stays queued).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Send a message as --as NAME on an existing channel (joining NAME if it is not a member).

    A send refused for every recipient leaves nothing behind: a NAME it joined is removed again.
    """
    text = sys.stdin.read() if body == "-" else body
    agent_option(agent)
    if parent is not None:
        agent_option(parent, "--parent")
    target = recipients(to)
    fields: dict[str, Any] = {
        "subject": subject,
        "type": type_,
        "priority": priority,
        "reply_to": reply_to,
        "ttl_s": ttl,
        "idempotency_key": key,
    }
    core.plan_send(agent, target, text, **fields)  # bad input: refused before anything joins
    if await_delivery is not None:
        check.seconds(await_delivery, "await_delivery")
    with connect(address) as bus:
        ch = existing_channel(bus, channel)
        new = agent not in ch.members()
        me = attach(ch, agent, parent, bus.settings)
        try:
            result = me.send(target, text, await_delivery=await_delivery, **fields)
        except (InvalidInput, BusConnectionError):
            if new:
                ch.leave(me)
            raise
        except RedisbusError as e:  # one recipient, refused: a rejected receipt, as for lists
            result = Receipt(id=None, to=to, status="rejected", error=e)
        receipts: list[Receipt] = result if isinstance(result, list) else [result]
        if new and not any(r.id for r in receipts):
            ch.leave(me)  # nothing was sent: the join is undone, unless it was used meanwhile
        if as_json:
            write_json(
                [r.as_dict() for r in receipts] if isinstance(result, list) else result.as_dict()
            )
        else:
            for r in receipts:
                if r.error is None:
                    out.print(Text.assemble((r.status, "green"), f"  {r.id}  → ", safe(r.to)))
                else:
                    out.print(
                        Text.assemble(
                            ("refused", "red"), f"  → {safe(r.to)}  ", safe(refusal_text(r.error))
                        )
                    )
    if not receipts:
        raise Exit(f"nobody to send to: {agent} is the only member of {channel}", 1)
    refused = [r for r in receipts if r.error is not None]
    if refused:
        if len(receipts) == 1:
            assert refused[0].error is not None
            raise Exit(f"refused: {refusal_text(refused[0].error)}", 1)
        raise Exit(f"refused for {len(refused)} of {len(receipts)} recipient(s)", 1)
    late = [r for r in receipts if await_delivery and r.status == "queued"]
    if late:
        raise Exit(
            f"not delivered within {await_delivery or 0:g} s to "
            f"{', '.join(r.to for r in late)}: still queued (it stays so until the recipient "
            f"fetches it; is it running `redisbus wait`? `redisbus receipt {channel} "
            f"{late[0].id} --as {agent}` shows when it does)",
            1,
        )


@with_address
def read(
    address: BusAddress,
    channel: ChannelArg,
    agent: AsOpt,
    filter_by: FilterOpt = "unread",
    since: SinceOpt = None,
    limit: LimitOpt = 100,
    done: Annotated[
        bool, option("--done", "REDISBUS_DONE", "Also mark the messages addressed to you done.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Read messages in full as an existing member; those addressed to you become read
    (default filter: unread)."""
    precheck(filter_by=filter_by, since=since, limit=limit)
    with connect(address) as bus:
        me = acting(existing_channel(bus, channel), agent, bus)
        msgs = me.read(filter_by=filter_by, since=since, limit=limit)
        # what this read returned to its addressee is read now, whatever it was before
        msgs = [dataclasses.replace(m, read=True) if me.name in m.to else m for m in msgs]
        mine = [m for m in msgs if me.name in m.to]
        if done and mine:
            me.mark_done(mine)
        print_messages(msgs, as_json, show_read=False)


@with_address
def list_(
    address: BusAddress,
    channel: ChannelArg,
    agent: AsOpt,
    filter_by: FilterOpt = "all",
    since: SinceOpt = None,
    limit: LimitOpt = 100,
    preview: Annotated[
        int, option("--preview", "REDISBUS_PREVIEW_CHARS", "Body chars shown.")
    ] = 200,
    as_json: JsonOpt = False,
) -> None:
    """List message headers and read flags as an existing member; changes nothing (default
    filter: all)."""
    precheck(filter_by=filter_by, since=since, limit=limit, preview=preview)
    with connect(address) as bus:
        me = member_handle(existing_channel(bus, channel), agent, bus.settings)
        print_messages(
            me.list(filter_by=filter_by, since=since, limit=limit, preview_chars=preview),
            as_json,
            show_read=True,
        )


@with_address
def wait(
    address: BusAddress,
    channel: ChannelArg,
    agent: AsOpt,
    timeout: Annotated[
        float, option("--timeout", "REDISBUS_WAIT_TIMEOUT_S", "s, at most 300.")
    ] = 30.0,
    done: Annotated[
        bool, option("--done", "REDISBUS_DONE", "Also mark what it returns done.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Block until a message for --as NAME that it has not read yet (exit 1 on timeout).

    What it returns becomes read, so the next `wait` returns only newer messages (or ones a
    crashed replica left). They stay undone until `redisbus done` or `wait --done`.
    """
    precheck(timeout=timeout)
    with connect(address) as bus:
        me = acting(existing_channel(bus, channel), agent, bus)
        kind, msgs = _wait_unread(me, timeout)
        if done and msgs:
            me.mark_done(msgs)
        me.flush()
        if as_json:
            write_json({"kind": kind, "messages": [m.as_dict() for m in msgs]})
        else:
            for m in msgs:
                out.print(message_text(m))
        if kind == "timeout":
            raise Exit(f"timeout: no message for {agent} within {timeout:g} s", 1)


def _wait_unread(me: Agent, timeout: float) -> tuple[str, list[Message]]:
    """``me.wait`` without what an earlier command already returned. A new handle's first
    wait hands back its replica's pending entries first (crash recovery); for a one-shot
    command they are mostly messages an earlier `read` or `wait` returned: those already
    read are left out (their marks say so; this wait's own marks are written later)."""
    seen = _read_before(me)
    deadline = time.monotonic() + timeout
    while True:
        result = me.wait(max(0.0, deadline - time.monotonic()))
        fresh = [m for m in result.messages if m.id not in seen]
        if fresh:
            return core.wait_kind(me.name, fresh), fresh
        if result.kind == "timeout" or time.monotonic() >= deadline:
            return "timeout", []


def _read_before(me: Agent) -> set[str]:
    """Ids pending for this command's replica that the agent has read already."""
    pending = me.channel.bus.redis.xpending_range(
        me.channel.keys.stream,
        me.name,
        min="-",
        max="+",
        count=10_000,
        consumername=me.replica,
    )
    seen = set()
    for p in pending:
        entry = p["message_id"]
        if any(r.to == me.name and r.read_at is not None for r in me.receipt(entry)):
            seen.add(entry)
    return seen


@with_address
def done(
    address: BusAddress,
    channel: ChannelArg,
    ids: Annotated[list[str], typer.Argument(help="Message id(s).", show_default=False)],
    agent: AsOpt,
    result: Annotated[str, typer.Option("--result", envvar="REDISBUS_RESULT")] = "ok",
) -> None:
    """Mark messages addressed to --as NAME (an existing member) done."""
    precheck(ids=ids, result=result)
    with connect(address) as bus:
        me = acting(existing_channel(bus, channel), agent, bus)
        changed = me.mark_done(ids, result=result)
        err.print("done" if changed else "already done")


@with_address
def receipt(
    address: BusAddress,
    channel: ChannelArg,
    message_id: Annotated[str, typer.Argument(metavar="ID", help="Message id.")],
    agent: AsOpt,
    as_json: JsonOpt = False,
) -> None:
    """Show the receipts of a message: queued, delivered, read, done per recipient."""
    precheck(ids=[message_id])
    with connect(address) as bus:
        me = member_handle(existing_channel(bus, channel), agent, bus.settings)
        receipts = me.receipt(message_id)
        if as_json:
            write_json([r.as_dict() for r in receipts])
        else:
            out.print(receipt_table(receipts, title=f"message {message_id}"))


@with_address
def discover(
    address: BusAddress,
    channel: ChannelArg,
    agent: AsOpt,
    query: Annotated[str, typer.Argument(help="Words to match against agent cards.")] = "",
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
) -> None:
    """Members --as NAME may reach, ranked by how well their cards (skills, description) match."""
    with connect(address) as bus:
        me = member_handle(existing_channel(bus, channel), agent, bus.settings)
        found = me.discover(query, limit=limit)
        print_items(found, as_json, "no match", _card_lines)


def _card_lines(m: Member) -> list[Text]:
    card = Text.assemble(
        (safe(m.name), "bold"),
        f"  {m.relationship or ''}  ",
        (safe(", ".join(m.skills)), "cyan"),
        f"  {safe(m.description)}",
    )
    return [card]
