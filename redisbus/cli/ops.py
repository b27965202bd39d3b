"""``redisbus`` commands that watch and run the bus: tail, agents, stats, pause, resume, dlq,
redis, demo."""

from __future__ import annotations

import socket
import sys
import time
from typing import Annotated, Any

import typer
from rich.console import RenderableType
from rich.progress import track
from rich.table import Table
from rich.text import Text

from .._commands import BusAddress, Exit, Typer, err, option, port_option, with_address
from .._core import message_from_fields
from .._demo_script import DemoError
from .._keys import ChannelKeys
from .._model import DeadLetter
from .._show import clock, member_tree, message_text, safe
from .._validate import channel_name
from ..bus import Channel
from ..demo import run_demo
from ..embedded import EmbeddedRedis, running_url, shared
from ._shared import (
    ChannelArg,
    JsonOpt,
    LimitOpt,
    connect,
    existing_channel,
    on_signals,
    out,
    print_items,
    write_json,
)


@with_address
def tail(
    address: BusAddress,
    channel: ChannelArg,
    from_start: Annotated[
        bool, option("--from-start", "REDISBUS_FROM_START", "Print the channel's history first.")
    ] = False,
    count: Annotated[
        int | None,
        option("--count", "REDISBUS_COUNT", "Stop after this many messages.", "-c", min=1),
    ] = None,
    timeout: Annotated[
        float | None,
        option(
            "--timeout",
            "REDISBUS_TAIL_TIMEOUT_S",
            "Stop after this many seconds (exit 1 if --count was not reached).",
            min=0,
        ),
    ] = None,
    as_json: Annotated[
        bool, option("--json", "REDISBUS_JSON", "One JSON object per line.")
    ] = False,
) -> None:
    """Follow a channel live (every message, whoever it is for) until Ctrl-C.

    Tail is read-only: it does not join, so it changes no read marks and no roster.
    """
    with connect(address) as bus:
        keys = ChannelKeys.build(bus.settings.prefix, channel_name(channel))
        r = bus.redis
        last = "0-0"
        if not from_start:
            newest = r.xrevrange(keys.stream, count=1)
            last = newest[0][0] if newest else "0-0"
        where = "from the start" if from_start else "new messages"
        if channel not in bus.channels():
            where += "; the channel does not exist yet"
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = 0
        # Ctrl-C (or SIGTERM) sets a flag, seen between blocks: no KeyboardInterrupt is thrown
        # into redis-py mid-read, and a tail started with SIGINT ignored (a background job of
        # a script) still stops on it, as `redisbus redis` and the daemons do
        stopped = on_signals()
        err.print(f"tailing {channel} ({where}); Ctrl-C to stop")
        while not stopped() and (count is None or seen < count):
            block_ms = 500  # short blocks: the deadline and Ctrl-C are noticed promptly
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                block_ms = max(1, min(block_ms, int(left * 1000)))
            batch = r.xread({keys.stream: last}, count=100, block=block_ms)
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
        if stopped() and count is not None and seen < count:
            raise Exit(f"interrupted: {seen} of {count} messages", 130)
        if count is not None and seen < count:
            raise Exit(f"timeout: {seen} of {count} messages within {timeout:g} s", 1)


@with_address
def agents(address: BusAddress, channel: ChannelArg, as_json: JsonOpt = False) -> None:
    """The channel's members as a tree: status, host, undone messages."""
    with connect(address) as bus:
        ch = existing_channel(bus, channel)
        members = ch.tree()
        counts = ch.counts()
        if as_json:
            write_json([dict(m.as_dict(), undone=counts.get(m.name, 0)) for m in members])
            return
        out.print(member_tree(ch, members, counts))


@with_address
def stats(
    address: BusAddress,
    channels: Annotated[
        list[str] | None, typer.Argument(help="Channels (default: all).", show_default=False)
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Channels with their length, members, undone messages per agent, and pause state."""
    with connect(address) as bus:
        names = channels or bus.channels()
        rows = []
        for name in track(names, console=err, transient=True, disable=len(names) < 50):
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


@with_address
def pause(address: BusAddress, channel: ChannelArg) -> None:
    """Refuse every send on the channel until `resume`."""
    _switch(address, channel, "pause")


@with_address
def resume(address: BusAddress, channel: ChannelArg) -> None:
    """Accept sends on a paused channel again."""
    _switch(address, channel, "resume")


def _switch(address: BusAddress, channel: str, how: str) -> None:
    """``Channel.pause()`` or ``Channel.resume()``."""
    with connect(address) as bus:
        getattr(existing_channel(bus, channel), how)()
        err.print(f"{channel}: {how.removesuffix('e')}ed")


dlq = Typer(help="Dead letters: messages delivered too many times without being done.")


@dlq.callback(invoke_without_command=True)
def _dlq_help(ctx: typer.Context) -> None:
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")


def _dlq_of(ch: Channel) -> Any:
    if not hasattr(ch, "dead_letters"):  # the core's dead-letter API arrived after this CLI
        raise Exit("`redisbus dlq` is not available yet: this core has no dead letters", 1)
    return ch


@dlq.command("list")
@with_address
def dlq_list(
    address: BusAddress, channel: ChannelArg, limit: LimitOpt = 100, as_json: JsonOpt = False
) -> None:
    """The channel's dead letters, oldest first."""
    with connect(address) as bus:
        letters = _dlq_of(existing_channel(bus, channel)).dead_letters(limit=limit)
        print_items(letters, as_json, "no dead letters", _dead_letter_lines)


def _dead_letter_lines(d: DeadLetter) -> list[RenderableType]:
    head = Text.assemble(
        (f"{d.id}  ", "bold red"),
        f"for {safe(d.recipient)} after {d.deliveries} "
        f"deliveries ({safe(d.reason)}), dead at {clock(d.dead_at)}",
    )
    return [head, message_text(d.message)]


@dlq.command("replay")
@with_address
def dlq_replay(
    address: BusAddress,
    channel: ChannelArg,
    ids: Annotated[list[str], typer.Argument(help="Dead letter id(s).", show_default=False)],
) -> None:
    """Give dead letters back to their recipients as new messages (prints the new ids)."""
    with connect(address) as bus:
        ch = _dlq_of(existing_channel(bus, channel))
        for dead_id in ids:
            sys.stdout.write(f"{dead_id} -> {ch.replay(dead_id)}\n")


# -- running ----------------------------------------------------------------------------------


def _data_dir(text: str) -> Any:
    """``--data DIR``: where a private Redis keeps its data."""
    return option("--data", "REDISBUS_DATA_DIR", text)


def redis_server(
    port: Annotated[
        int | None, port_option("REDISBUS_REDIS_PORT", "Port [default: a free one].", "-p")
    ] = None,
    data: Annotated[str | None, _data_dir("Keep data here (AOF on) [default: temporary].")] = None,
) -> None:
    """Run a private Redis in the foreground until Ctrl-C; prints the URL to export."""
    if data and (running := running_url(data)):
        raise Exit(f"a server already keeps {data}: REDISBUS_URL={running}", 1)
    if port is not None:
        # checked before starting: redis-server would exit, but whatever already listens
        # there would answer the readiness ping and get its URL printed as ours
        _port_is_free(port)
    if data:
        url, owned = shared(data, port=port)
        if owned is None:
            raise Exit(f"a server already keeps {data}: REDISBUS_URL={url}", 1)
        server = owned
    else:
        server = EmbeddedRedis.start(port=port)
    stop = on_signals()
    try:
        where = server.directory if data else "temporary, removed on exit"
        err.print(
            f"redis-server {server.binary} on 127.0.0.1:{server.port} (data: {where}); "
            "Ctrl-C to stop"
        )
        sys.stdout.write(f"REDISBUS_URL={server.url}\n")
        sys.stdout.flush()
        err.print(f"in other shells: export REDISBUS_URL={server.url}")
        while not stop() and server.process.poll() is None:
            time.sleep(0.2)
        if server.process.poll() is not None and not stop():
            raise Exit(f"redis-server exited with status {server.process.returncode}", 1)
    finally:
        server.stop()


def _port_is_free(port: int) -> None:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as e:
            raise Exit(
                f"port {port} on 127.0.0.1 is in use ({e.strerror or e}): choose another "
                "--port, or leave it out for a free one",
                1,
            ) from e


def demo(
    agents_procs: Annotated[
        int,
        option(
            "--agents-procs",
            "REDISBUS_DEMO_PROCS",
            "OS processes for the three child agents (the director runs in this one).",
            min=1,
            max=3,
        ),
    ] = 3,
    data: Annotated[str | None, _data_dir("Embedded Redis keeps its data here (AOF on).")] = None,
    fast: Annotated[
        bool, option("--fast", "REDISBUS_DEMO_FAST", "No pauses between turns.")
    ] = False,
    url: Annotated[
        str | None,
        option("--url", "REDISBUS_URL", "Use this Redis [default: start a private one]."),
    ] = None,
) -> None:
    """An anime production team ('Neon Dreams') talking over the bus, live."""
    try:
        run_demo(procs=agents_procs, data_dir=data, fast=fast, url=url)
    except DemoError as e:
        raise Exit(f"demo failed: {e}", 1) from e
    except KeyboardInterrupt:  # typer would turn it into a silent 130
        raise Exit("interrupted", 130) from None
