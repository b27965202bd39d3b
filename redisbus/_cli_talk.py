"""``redisbus`` commands that talk on a channel as one agent: join, send, read, list, wait,
done, receipt, discover."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from ._cli_base import (
    AsOpt,
    ChannelArg,
    ClusterOpt,
    Exit,
    FilterOpt,
    JsonOpt,
    LimitOpt,
    ParentOpt,
    PrefixOpt,
    RoutingOpt,
    SinceOpt,
    UrlOpt,
    app,
    attach,
    connect,
    err,
    existing_channel,
    out,
    precheck,
    write_json,
)
from ._cli_view import message_text, print_messages, receipt_table, refusal_text, safe
from ._errors import UnknownAgent

# -- talking ----------------------------------------------------------------------------------


def recipients(to: str) -> str | list[str]:
    if "," in to:
        return [n.strip() for n in to.split(",") if n.strip()]
    return to


@app.command()
def join(
    channel: ChannelArg,
    agent: AsOpt,
    parent: ParentOpt = None,
    description: Annotated[
        str, typer.Option("--description", envvar="REDISBUS_DESCRIPTION", help="Agent card.")
    ] = "",
    skills: Annotated[
        list[str] | None,
        typer.Option("--skill", envvar="REDISBUS_SKILLS", help="Agent card skill (repeatable)."),
    ] = None,
    routing: RoutingOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Join --as NAME to a channel (creating the channel if needed), so others can address it."""
    with connect(url, prefix, cluster) as bus:
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


@app.command()
def send(
    channel: ChannelArg,
    to: Annotated[
        str,
        typer.Argument(help="Recipient: a name, 'parent', 'all', or a,b,c.", show_default=False),
    ],
    body: Annotated[str, typer.Argument(help="Message body; '-' reads stdin.", show_default=False)],
    agent: AsOpt,
    parent: ParentOpt = None,
    subject: Annotated[str, typer.Option("--subject", "-s", envvar="REDISBUS_SUBJECT")] = "",
    type_: Annotated[
        str, typer.Option("--type", "-t", envvar="REDISBUS_TYPE", help="message, request, ...")
    ] = "message",
    priority: Annotated[int, typer.Option("--priority", envvar="REDISBUS_PRIORITY")] = 0,
    reply_to: Annotated[str | None, typer.Option("--reply-to", envvar="REDISBUS_REPLY_TO")] = None,
    ttl: Annotated[float | None, typer.Option("--ttl", envvar="REDISBUS_TTL_S", help="s")] = None,
    key: Annotated[
        str | None, typer.Option("--idempotency-key", envvar="REDISBUS_IDEMPOTENCY_KEY")
    ] = None,
    await_delivery: Annotated[
        float | None,
        typer.Option(
            "--await-delivery",
            envvar="REDISBUS_AWAIT_DELIVERY_S",
            help="Wait up to this many seconds for the recipient to fetch it.",
        ),
    ] = None,
    routing: RoutingOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Send a message as --as NAME (creating the channel and joining the agent if needed)."""
    text = sys.stdin.read() if body == "-" else body
    with connect(url, prefix, cluster) as bus:
        ch = bus.channel(channel, routing=routing)
        me = attach(ch, agent, parent, bus.settings)
        result = me.send(
            recipients(to),
            text,
            subject=subject,
            type=type_,
            priority=priority,
            reply_to=reply_to,
            ttl_s=ttl,
            idempotency_key=key,
            await_delivery=await_delivery,
        )
        receipts = result if isinstance(result, list) else [result]
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
        refused = [r for r in receipts if r.error is not None]
        if refused:
            raise Exit(f"refused for {len(refused)} of {len(receipts)} recipient(s)", 1)


@app.command()
def read(
    channel: ChannelArg,
    agent: AsOpt,
    filter_by: FilterOpt = "unread",
    since: SinceOpt = None,
    limit: LimitOpt = 100,
    done: Annotated[
        bool,
        typer.Option(
            "--done", envvar="REDISBUS_DONE", help="Also mark the messages addressed to you done."
        ),
    ] = False,
    parent: ParentOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Read messages in full; those addressed to you become read (default filter: unread)."""
    precheck(filter_by=filter_by, since=since, limit=limit)
    with connect(url, prefix, cluster) as bus:
        me = attach(existing_channel(bus, channel), agent, parent, bus.settings)
        msgs = me.read(filter_by=filter_by, since=since, limit=limit)
        mine = [m for m in msgs if me.name in m.to]
        if done and mine:
            me.mark_done(mine)
        print_messages(msgs, as_json, show_read=False)


@app.command("list")
def list_(
    channel: ChannelArg,
    agent: AsOpt,
    filter_by: FilterOpt = "all",
    since: SinceOpt = None,
    limit: LimitOpt = 100,
    preview: Annotated[
        int, typer.Option("--preview", envvar="REDISBUS_PREVIEW_CHARS", help="Body chars shown.")
    ] = 200,
    parent: ParentOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """List message headers and read flags; changes nothing (default filter: all)."""
    precheck(filter_by=filter_by, since=since, limit=limit, preview=preview)
    with connect(url, prefix, cluster) as bus:
        me = attach(existing_channel(bus, channel), agent, parent, bus.settings)
        print_messages(
            me.list(filter_by=filter_by, since=since, limit=limit, preview_chars=preview),
            as_json,
            show_read=True,
        )


@app.command()
def wait(
    channel: ChannelArg,
    agent: AsOpt,
    timeout: Annotated[
        float, typer.Option("--timeout", envvar="REDISBUS_WAIT_TIMEOUT_S", help="s, at most 300.")
    ] = 30.0,
    parent: ParentOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Block until a message for --as NAME arrives (exit 1 on timeout)."""
    precheck(timeout=timeout)
    with connect(url, prefix, cluster) as bus:
        me = attach(existing_channel(bus, channel), agent, parent, bus.settings)
        result = me.wait(timeout=timeout)
        me.flush()
        if as_json:
            write_json({"kind": result.kind, "messages": [m.as_dict() for m in result.messages]})
        else:
            for m in result.messages:
                out.print(message_text(m))
        if result.kind == "timeout":
            raise Exit(f"timeout: no message for {agent} within {timeout:g} s", 1)


@app.command()
def done(
    channel: ChannelArg,
    ids: Annotated[list[str], typer.Argument(help="Message id(s).", show_default=False)],
    agent: AsOpt,
    result: Annotated[str, typer.Option("--result", envvar="REDISBUS_RESULT")] = "ok",
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Mark messages addressed to --as NAME done."""
    precheck(ids=ids, result=result)
    with connect(url, prefix, cluster) as bus:
        me = attach(existing_channel(bus, channel), agent, None, bus.settings)
        changed = me.mark_done(ids, result=result)
        err.print("done" if changed else "already done")


@app.command()
def receipt(
    channel: ChannelArg,
    message_id: Annotated[str, typer.Argument(metavar="ID", help="Message id.")],
    agent: AsOpt,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Show the receipts of a message: queued, delivered, read, done per recipient."""
    with connect(url, prefix, cluster) as bus:
        ch = existing_channel(bus, channel)
        if agent not in ch.members():
            raise UnknownAgent(f"{agent!r} is not a member of channel {ch.name!r}")
        receipts = attach(ch, agent, None, bus.settings).receipt(message_id)
        if as_json:
            write_json([r.as_dict() for r in receipts])
        else:
            out.print(receipt_table(receipts, title=f"message {message_id}"))


@app.command()
def discover(
    channel: ChannelArg,
    agent: AsOpt,
    query: Annotated[str, typer.Argument(help="Words to match against agent cards.")] = "",
    limit: LimitOpt = 20,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Members --as NAME may reach, ranked by how well their cards (skills, description) match."""
    with connect(url, prefix, cluster) as bus:
        ch = existing_channel(bus, channel)
        if agent not in ch.members():
            raise UnknownAgent(f"{agent!r} is not a member of channel {ch.name!r}")
        found = attach(ch, agent, None, bus.settings).discover(query, limit=limit)
        if as_json:
            write_json([m.as_dict() for m in found])
            return
        if not found:
            err.print("no match")
        for m in found:
            out.print(
                Text.assemble(
                    (safe(m.name), "bold"),
                    f"  {m.relationship or ''}  ",
                    (safe(", ".join(m.skills)), "cyan"),
                    f"  {safe(m.description)}",
                )
            )
