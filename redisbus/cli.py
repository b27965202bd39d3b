"""The ``redisbus`` command: talk on the bus, watch it, and run it, from a shell.

Every option can also be set by a ``REDISBUS_*`` environment variable (shown in ``--help``).
Every failure is one line on stderr and a non-zero exit status, never a traceback:

    0  success
    1  refused or failed (a limit, routing, an unknown agent, a paused channel, a timeout)
    2  bad input (usage, a malformed filter or time, an out-of-range value)
    3  no Redis (REDISBUS_URL unset or unreachable)

Other modules add subcommands by defining ``register_cli(app: typer.Typer) -> None``; the
modules named in ``PLUGINS`` are imported when present (see ``_load_plugins``).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
import unicodedata
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Annotated, Any, NoReturn, cast

import click
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from . import __version__
from ._core import message_from_fields
from ._errors import (
    BusConnectionError,
    InvalidInput,
    LimitExceeded,
    RedisbusError,
    UnknownAgent,
)
from ._keys import ChannelKeys
from ._model import Member, Message, Receipt
from ._settings import BusSettings
from ._validate import channel_name
from .bus import Agent, Bus, Channel

__all__ = ["PLUGINS", "app", "main", "message_text", "receipt_table"]

CONNECT_HELP = (
    "Redis URL (redis://, rediss://, redis+sentinel://). Required by every command except "
    "`demo` and `redis`: a private server per command would lose the board when it exits, so "
    "start one with `redisbus redis` and export the URL it prints."
)

app = typer.Typer(
    name="redisbus",
    help=(
        "A message bus on Redis Streams for fleets of AI agents.\n\n"
        "Start with `redisbus demo`. To talk on a bus: `redisbus redis` in one shell, then "
        "`export REDISBUS_URL=...` and `redisbus send/read/tail ...` in others.\n\n"
        "Exit status: 0 ok, 1 refused or failed, 2 bad input, 3 no Redis."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# -- shared options ---------------------------------------------------------------------------

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="REDISBUS_URL", help=CONNECT_HELP)]
PrefixOpt = Annotated[
    str | None,
    typer.Option("--prefix", envvar="REDISBUS_PREFIX", help="Key prefix of the bus [default: rb]."),
]
ClusterOpt = Annotated[
    bool,
    typer.Option("--cluster", envvar="REDISBUS_CLUSTER", help="The URL is a Redis Cluster node."),
]
ChannelArg = Annotated[str, typer.Argument(help="Channel name.", show_default=False)]
AsOpt = Annotated[
    str,
    typer.Option(
        "--as",
        envvar="REDISBUS_AS",
        show_default=False,
        help="Agent name to act as (joins the channel under this name if not yet a member).",
    ),
]
ParentOpt = Annotated[
    str | None,
    typer.Option("--parent", envvar="REDISBUS_PARENT", help="Parent agent, when joining."),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", envvar="REDISBUS_JSON", help="Machine-readable JSON output.")
]
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        envvar="REDISBUS_FILTER",
        help="unread | all | to:me | to:NAME | from:NAME | subject:TEXT | after:ID (ANDed).",
    ),
]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", envvar="REDISBUS_SINCE", help="ISO-8601 time or message id."),
]
LimitOpt = Annotated[
    int, typer.Option("--limit", "-n", envvar="REDISBUS_LIMIT", help="At most this many.")
]


class Exit(Exception):
    """A one-line failure with an exit status (raised by commands, printed by ``main``)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def settings_for(url: str | None, prefix: str | None = None, cluster: bool = False) -> BusSettings:
    """BusSettings from the environment, with the options given on the command line on top."""
    kw: dict[str, Any] = {"metrics": False}  # a one-shot command has nobody scraping it
    if url:
        kw["url"] = url
    if prefix:
        kw["prefix"] = prefix
    if cluster:
        kw["cluster"] = True
    return BusSettings(**kw)


@contextmanager
def connect(url: str | None, prefix: str | None = None, cluster: bool = False) -> Iterator[Bus]:
    s = settings_for(url, prefix, cluster)
    if not s.url:
        raise Exit(
            "no Redis configured: set REDISBUS_URL (or --url), or start one with "
            "`redisbus redis` and export the URL it prints",
            3,
        )
    bus = Bus.from_url(s.url, settings=s)
    try:
        yield bus
    finally:
        bus.close()


def existing_channel(bus: Bus, name: str) -> Channel:
    """Attach to a channel that exists; a typo must not create an empty channel."""
    cname = channel_name(name)
    known = bus.channels()
    if cname not in known:
        hint = f" (channels: {', '.join(known[:10])})" if known else " (there are no channels)"
        raise UnknownAgent(f"no such channel {cname!r}{hint}")
    return bus.channel(cname)


def attach(ch: Channel, name: str, parent: str | None, settings: BusSettings) -> Agent:
    """Join as ``name`` (re-attaching when it is already a member) with a CLI replica name."""
    replica = settings.replica or f"{settings.host}/cli"
    return ch.join(name, parent=parent, replica=replica)


def write_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


# -- rendering --------------------------------------------------------------------------------


def safe(text: str) -> str:
    """Message text is data: show control characters (e.g. ESC) instead of obeying them."""
    if text.isprintable():
        return text
    return "".join(
        c if c in "\n\t" or unicodedata.category(c) != "Cc" else f"\\x{ord(c):02x}" for c in text
    )


def clock(d: datetime | None) -> str:
    return "-" if d is None else d.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def message_text(m: Message, *, show_read: bool = False, body_chars: int | None = None) -> Text:
    """One message as rich text: header line, then the body indented. Never parses markup."""
    t = Text()
    t.append(clock(m.created_at), style="dim")
    t.append("  ")
    t.append(safe(m.sender), style="bold cyan")
    t.append(" → ")
    t.append(safe(", ".join(m.to)), style="bold magenta")
    if m.type != "message":
        t.append(f"  [{m.type}]", style="yellow")
    if m.priority:
        t.append(f"  priority {m.priority}", style="red")
    if m.subject:
        t.append("  ")
        t.append(safe(m.subject), style="bold")
    if show_read and not m.read:
        t.append("  (unread)", style="green")
    t.append(f"  {m.id}", style="dim")
    body = m.body if body_chars is None or len(m.body) <= body_chars else m.body[:body_chars] + "…"
    if m.truncated and not body.endswith("…"):
        body += "…"
    for line in safe(body).splitlines() or [""]:
        t.append("\n    " + line)
    return t


def receipt_table(receipts: Sequence[Receipt], title: str | None = None) -> Table:
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("to", "status", "queued", "delivered", "read", "done", "note"):
        table.add_column(col)
    for r in receipts:
        note = ""
        if r.error is not None:
            note = refusal_text(r.error)
        elif r.result and r.result != "ok":
            note = r.result
        style = "red" if r.status in ("rejected", "failed", "expired") else None
        table.add_row(
            safe(r.to),
            Text(r.status, style=style or ""),
            clock(r.queued_at),
            clock(r.delivered_at),
            clock(r.read_at),
            clock(r.done_at),
            safe(note),
        )
    return table


def refusal_text(e: RedisbusError) -> str:
    text = f"{e.code}: {e}"
    if isinstance(e, LimitExceeded):
        details = []
        if e.limit is not None:
            details.append(f"limit {e.limit:g}")
        if e.current is not None:
            details.append(f"current {e.current:g}")
        if e.retry_after_s is not None:
            details.append(f"retry after {e.retry_after_s:.2f} s")
        if details:
            text += f" ({', '.join(details)})"
    return text


def print_messages(msgs: Sequence[Message], as_json: bool, *, show_read: bool) -> None:
    if as_json:
        write_json([m.as_dict() for m in msgs])
        return
    if not msgs:
        err.print("no messages")
        return
    for m in msgs:
        out.print(message_text(m, show_read=show_read))


# -- talking ----------------------------------------------------------------------------------


def recipients(to: str) -> str | list[str]:
    if "," in to:
        return [n.strip() for n in to.split(",") if n.strip()]
    return to


RoutingOpt = Annotated[
    str | None,
    typer.Option(
        "--routing",
        envvar="REDISBUS_ROUTING",
        help="open | family: only used when this command creates the channel.",
    ),
]


@app.command()
def join(
    channel: ChannelArg,
    agent: AsOpt,
    parent: ParentOpt = None,
    description: Annotated[
        str, typer.Option("--description", envvar="REDISBUS_DESCRIPTION", help="Agent card.")
    ] = "",
    skills: Annotated[
        list[str] | None, typer.Option("--skill", help="Agent card skill (repeatable).")
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
        replica = bus.settings.replica or f"{bus.settings.host}/cli"
        me = ch.join(
            agent, parent=parent, replica=replica, description=description, skills=skills or ()
        )
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
        bool, typer.Option("--done", help="Also mark the messages addressed to you done.")
    ] = False,
    parent: ParentOpt = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Read messages in full; those addressed to you become read (default filter: unread)."""
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
        # cast: mypy reads bus.Agent's "-> list[Receipt]" as its own .list method
        receipts = cast("list[Receipt]", attach(ch, agent, None, bus.settings).receipt(message_id))
        if as_json:
            write_json([r.as_dict() for r in receipts])
        else:
            out.print(receipt_table(receipts, title=f"message {message_id}"))


# -- watching ---------------------------------------------------------------------------------


@app.command()
def tail(
    channel: ChannelArg,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Print the channel's history first.")
    ] = False,
    count: Annotated[
        int | None, typer.Option("--count", "-c", min=1, help="Stop after this many messages.")
    ] = None,
    timeout: Annotated[
        float | None,
        typer.Option(
            "--timeout",
            min=0,
            help="Stop after this many seconds (exit 1 if --count was not reached).",
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", envvar="REDISBUS_JSON", help="One JSON object per line.")
    ] = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Follow a channel live (every message, whoever it is for) until Ctrl-C.

    Tail is read-only: it does not join, so it changes no read marks and no roster.
    """
    with connect(url, prefix, cluster) as bus:
        keys = ChannelKeys.build(bus.settings.prefix, channel_name(channel))
        r = bus.redis
        last = "0-0"
        if not from_start:
            newest = _redis(r.xrevrange, keys.stream, count=1)
            last = newest[0][0] if newest else "0-0"
        where = "from the start" if from_start else "new messages"
        if channel not in bus.channels():
            where += "; the channel does not exist yet"
        err.print(f"tailing {channel} ({where}); Ctrl-C to stop")
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = 0
        while count is None or seen < count:
            block_ms = 1000
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                block_ms = max(1, min(block_ms, int(left * 1000)))
            batch = _redis(r.xread, {keys.stream: last}, count=100, block=block_ms)
            for entry_id, fields in batch[0][1] if batch else []:
                last = entry_id
                m = message_from_fields(channel, entry_id, fields, read=False)
                if as_json:
                    write_json(m.as_dict())
                else:
                    out.print(message_text(m))
                    out.file.flush()
                seen += 1
                if count is not None and seen >= count:
                    break
        if count is not None and seen < count:
            raise Exit(f"timeout: {seen} of {count} messages within {timeout:g} s", 1)


def _redis(fn: Any, *args: Any, **kw: Any) -> Any:
    """A raw redis-py call from the CLI, with Redis errors turned into the bus's own."""
    import redis

    try:
        return fn(*args, **kw)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise BusConnectionError(f"Redis unreachable: {e}") from e
    except redis.RedisError as e:
        raise RedisbusError(f"Redis error: {e}") from e


@app.command()
def agents(
    channel: ChannelArg,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """The channel's members as a tree: status, host, undone messages."""
    with connect(url, prefix, cluster) as bus:
        ch = existing_channel(bus, channel)
        members = ch.tree()
        counts = ch.counts()
        if as_json:
            write_json([dict(m.as_dict(), undone=counts.get(m.name, 0)) for m in members])
            return
        out.print(member_tree(ch, members, counts))


STATUS_STYLE = {
    "running": "green",
    "waiting": "cyan",
    "idle": "blue",
    "completed": "dim",
    "failed": "red",
    "cancelled": "yellow",
    "lost": "red",
}


def member_tree(ch: Channel, members: Sequence[Member], counts: dict[str, int]) -> Tree:
    cfg = ch.config
    label = Text.assemble((safe(ch.name), "bold"), f"  routing={cfg.routing}")
    if cfg.routing == "family":
        label.append(f" siblings={'on' if cfg.siblings else 'off'}")
    if cfg.paused:
        label.append("  PAUSED", style="bold red")
    root = Tree(label)
    nodes: dict[str, Tree] = {}
    for m in members:  # parents come before their children
        line = Text.assemble(
            (safe(m.name), "bold"),
            "  ",
            (m.status, STATUS_STYLE.get(m.status, "")),
            f"  host={safe(m.host) or '-'}  undone={counts.get(m.name, 0)}",
            (f"  {m.id}", "dim"),
        )
        if m.description:
            line.append(f"  {safe(m.description[:60])}", style="italic")
        parent = nodes.get(m.parent) if m.parent else None
        nodes[m.name] = (parent or root).add(line)
    return root


@app.command()
def stats(
    channels: Annotated[
        list[str] | None, typer.Argument(help="Channels (default: all).", show_default=False)
    ] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Channels with their length, members, undone messages per agent, and pause state."""
    with connect(url, prefix, cluster) as bus:
        names = channels or bus.channels()
        rows = []
        for name in names:
            ch = existing_channel(bus, name)
            counts = ch.counts()
            rows.append(
                {
                    "channel": ch.name,
                    "routing": ch.config.routing,
                    "paused": ch.config.paused,
                    "length": ch.length(),
                    "members": len(ch.members()),
                    "undone": sum(counts.values()),
                    "inbox": counts,
                }
            )
        if as_json:
            write_json(rows)
            return
        if not rows:
            err.print("no channels")
            return
        table = Table(show_edge=False, pad_edge=False)
        for col in ("channel", "routing", "paused", "messages", "members", "undone", "busiest"):
            table.add_column(
                col, justify="right" if col in ("messages", "members", "undone") else "left"
            )
        for row in rows:
            inbox: dict[str, int] = row["inbox"]  # type: ignore[assignment]
            top = sorted(((n, c) for n, c in inbox.items() if c), key=lambda x: -x[1])[:3]
            table.add_row(
                safe(str(row["channel"])),
                str(row["routing"]),
                "yes" if row["paused"] else "",
                str(row["length"]),
                str(row["members"]),
                str(row["undone"]),
                safe(", ".join(f"{n} {c}" for n, c in top)),
            )
        out.print(table)


@app.command()
def pause(
    channel: ChannelArg, url: UrlOpt = None, prefix: PrefixOpt = None, cluster: ClusterOpt = False
) -> None:
    """Refuse every send on the channel until `resume`."""
    with connect(url, prefix, cluster) as bus:
        existing_channel(bus, channel).pause()
        err.print(f"{channel}: paused")


@app.command()
def resume(
    channel: ChannelArg, url: UrlOpt = None, prefix: PrefixOpt = None, cluster: ClusterOpt = False
) -> None:
    """Accept sends on a paused channel again."""
    with connect(url, prefix, cluster) as bus:
        existing_channel(bus, channel).resume()
        err.print(f"{channel}: resumed")


dlq = typer.Typer(
    help="Dead letters: messages delivered too many times without being done.", no_args_is_help=True
)
app.add_typer(dlq, name="dlq")


def _dlq_of(ch: Channel) -> Any:
    if not hasattr(ch, "dead_letters"):  # the core's dead-letter API arrived after this CLI
        raise Exit("`redisbus dlq` is not available yet: this core has no dead letters", 1)
    return ch


@dlq.command("list")
def dlq_list(
    channel: ChannelArg,
    limit: LimitOpt = 100,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """The channel's dead letters, oldest first."""
    with connect(url, prefix, cluster) as bus:
        letters = _dlq_of(existing_channel(bus, channel)).dead_letters(limit=limit)
        if as_json:
            write_json([d.as_dict() for d in letters])
            return
        if not letters:
            err.print("no dead letters")
            return
        for d in letters:
            out.print(
                Text.assemble(
                    (f"{d.id}  ", "bold red"),
                    f"for {safe(d.recipient)} after {d.deliveries} "
                    f"deliveries ({safe(d.reason)}), dead at {clock(d.dead_at)}",
                )
            )
            out.print(message_text(d.message))


@dlq.command("replay")
def dlq_replay(
    channel: ChannelArg,
    ids: Annotated[list[str], typer.Argument(help="Dead letter id(s).", show_default=False)],
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Give dead letters back to their recipients as new messages (prints the new ids)."""
    with connect(url, prefix, cluster) as bus:
        ch = _dlq_of(existing_channel(bus, channel))
        for dead_id in ids:
            sys.stdout.write(f"{dead_id} -> {ch.replay(dead_id)}\n")


# -- running ----------------------------------------------------------------------------------


@app.command("redis")
def redis_server(
    port: Annotated[
        int | None,
        typer.Option(
            "--port",
            "-p",
            envvar="REDISBUS_REDIS_PORT",
            help="Port [default: a free one].",
            min=1,
            max=65535,
        ),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            envvar="REDISBUS_DATA_DIR",
            help="Keep data here (AOF on) [default: temporary].",
        ),
    ] = None,
) -> None:
    """Run a private Redis in the foreground until Ctrl-C; prints the URL to export."""
    from .embedded import EmbeddedRedis

    server = EmbeddedRedis.start(data, port=port)
    stop = _on_signals()
    try:
        where = server.directory if data else "temporary, removed on exit"
        err.print(
            f"redis-server {server.binary} on 127.0.0.1:{server.port} (data: {where}); "
            "Ctrl-C to stop"
        )
        sys.stdout.write(f"REDISBUS_URL={server.url}\n")
        sys.stdout.flush()
        while not stop() and server.process.poll() is None:
            time.sleep(0.2)
        if server.process.poll() is not None and not stop():
            raise Exit(f"redis-server exited with status {server.process.returncode}", 1)
    finally:
        server.stop()


def _on_signals() -> Any:
    """Turn SIGINT/SIGTERM into a flag, so the server is stopped cleanly."""
    flag: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        flag.append(True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return lambda: bool(flag)


@app.command()
def demo(
    agents_procs: Annotated[
        int,
        typer.Option(
            "--agents-procs",
            envvar="REDISBUS_DEMO_PROCS",
            min=1,
            max=3,
            help="OS processes for the three child agents (the director runs in this one).",
        ),
    ] = 3,
    data: Annotated[
        str | None,
        typer.Option(
            "--data",
            envvar="REDISBUS_DATA_DIR",
            help="Embedded Redis keeps its data here (AOF on).",
        ),
    ] = None,
    fast: Annotated[bool, typer.Option("--fast", help="No pauses between turns.")] = False,
    url: Annotated[
        str | None,
        typer.Option(
            "--url", envvar="REDISBUS_URL", help="Use this Redis [default: start a private one]."
        ),
    ] = None,
) -> None:
    """The seed-000 anime production ('Neon Dreams') talking over the bus, live."""
    from .demo import run_demo

    raise typer.Exit(run_demo(procs=agents_procs, data_dir=data, fast=fast, url=url))


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        sys.stdout.write(f"redisbus {__version__}\n")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")
        raise typer.Exit(0)


# -- subcommands from other modules -------------------------------------------------------------

# Commands that live in other modules, each of which provides ``main(argv: list[str]) -> int``.
# They are imported only when their command runs, so a one-shot `redisbus send` stays fast and
# a missing optional dependency (the `mcp` SDK) breaks only its own command.
PLUGINS: dict[str, tuple[str, str]] = {
    "janitor": ("redisbus.janitor", "Reclaim, dead-letter and trim, on its own (no exporter)."),
    "exporter": ("redisbus.exporter", "Fleet exporter: backlog gauges, watchdog and janitor."),
    "mcp": ("redisbus.integrations.mcp", "Serve one agent as MCP tools (stdio or HTTP)."),
}


def _plugin(name: str, module: str, summary: str) -> None:
    def command(ctx: typer.Context) -> None:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            extra = "" if (e.name or "").startswith("redisbus") else f" (missing {e.name})"
            raise Exit(f"`redisbus {name}` is not available yet: no {module}{extra}", 1) from e
        entry = getattr(mod, "main", None)
        if entry is None:
            raise Exit(f"`redisbus {name}` is not available yet: {module} has no main()", 1)
        status = entry(list(ctx.args))
        raise typer.Exit(int(status or 0))

    command.__doc__ = f"{summary} (`redisbus {name} --help` for its options)"
    app.command(
        name,
        context_settings={
            "ignore_unknown_options": True,
            "allow_extra_args": True,
            "help_option_names": [],
        },
    )(command)


for _name, (_module, _summary) in PLUGINS.items():
    _plugin(_name, _module, _summary)


# -- entry point --------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def fail(message: str, status: int) -> NoReturn:
    err.print(Text(f"redisbus: {message}", style="red"), soft_wrap=True)
    sys.exit(status)


# typer >= 0.20 vendors click and raises its own copies of click's exceptions
USAGE_ERRORS: tuple[type[Exception], ...] = (typer.TyperException, click.ClickException)


def _context() -> Any:
    command = typer.main.get_command(app)
    return command.make_context("redisbus", [], resilient_parsing=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``redisbus`` command."""
    import pydantic

    command = typer.main.get_command(app)
    try:
        rv = command.main(
            args=list(argv) if argv is not None else None,
            prog_name="redisbus",
            standalone_mode=False,
        )
    except Exit as e:
        fail(one_line(e), e.status)
    except USAGE_ERRORS as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(typer.main.get_command(app).get_help(_context()) + "\n")
            sys.exit(0)
        text = e.format_message() if hasattr(e, "format_message") else str(e)
        fail(f"{one_line(Exception(text))} (see --help)", 2)
    except (typer.Abort, click.Abort, KeyboardInterrupt):
        fail("interrupted", 130)
    except InvalidInput as e:
        fail(f"{e.code}: {one_line(e)}", 2)
    except BusConnectionError as e:
        fail(f"{e.code}: {one_line(e)}", 3)
    except RedisbusError as e:
        fail(one_line(Exception(refusal_text(e))), 1)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        fail(f"invalid setting {where} (REDISBUS_{where.upper()}): {first.get('msg')}", 2)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as e:  # the promise is one line, never a traceback (REDISBUS_DEBUG=1 shows it)
        if os.environ.get("REDISBUS_DEBUG"):
            raise
        fail(f"unexpected error: {type(e).__name__}: {one_line(e)}", 1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
