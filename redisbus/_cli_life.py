"""``redisbus`` commands that end agents and clear channels: complete, fail, cancel, remove,
delete. What ``Agent.complete/fail/cancel``, ``Channel.remove`` and ``Channel.delete`` do, from
a shell: an agent a script joined with ``redisbus join`` can end (and its name be freed) the
same way."""

from __future__ import annotations

from typing import Annotated

import typer

from ._cli_base import (
    AsOpt,
    ChannelArg,
    ClusterOpt,
    PrefixOpt,
    UrlOpt,
    agent_option,
    app,
    connect,
    err,
    existing_channel,
    existing_member,
    precheck,
)
from ._cli_talk import _acting

TextArg = Annotated[str, typer.Argument(help="Text for the parent's outcome message.")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Even while it holds work (undone messages, pending entries, live agents)."
    ),
]


@app.command()
def complete(
    channel: ChannelArg,
    agent: AsOpt,
    summary: TextArg = "",
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Finish --as NAME (an existing member): status completed; its parent gets the summary
    as an outcome message. A completed agent still takes follow-up messages."""
    precheck(result=summary or None)
    with connect(url, prefix, cluster) as bus:
        me = _acting(existing_channel(bus, channel), agent, bus)
        me.complete(summary)
        err.print(f"{agent}: completed")


@app.command()
def fail(
    channel: ChannelArg,
    agent: AsOpt,
    error: TextArg = "",
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """End --as NAME (an existing member) with an error: its parent gets a failed outcome and
    its descendants are cancelled."""
    precheck(result=error or None)
    with connect(url, prefix, cluster) as bus:
        me = _acting(existing_channel(bus, channel), agent, bus)
        me.fail(error)
        err.print(f"{agent}: failed")


@app.command()
def cancel(
    channel: ChannelArg,
    child: Annotated[str, typer.Argument(help="The child to cancel.", show_default=False)],
    agent: AsOpt,
    reason: Annotated[str, typer.Option("--reason", help="Why (the child's parent sees it).")] = "",
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Cancel CHILD and its whole subtree, on every host, as its parent --as NAME. A cancelled
    name cannot join again until `redisbus remove` frees it."""
    agent_option(child, "child")
    precheck(result=reason or None)
    with connect(url, prefix, cluster) as bus:
        me = _acting(existing_channel(bus, channel), agent, bus)
        me.cancel(child, reason)
        err.print(f"{child}: cancelled")


@app.command()
def remove(
    channel: ChannelArg,
    name: Annotated[str, typer.Argument(help="The agent to remove.", show_default=False)],
    force: ForceOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Take an agent off the channel and free its name (a later join makes a new member).
    Refused while it holds work (undone messages, pending entries, open children, a live
    replica) unless --force; an ended agent's undone messages do not count."""
    with connect(url, prefix, cluster) as bus:
        ch = existing_channel(bus, channel)
        existing_member(ch, name)
        ch.remove(name, force=force)
        err.print(f"{name}: removed from {channel}")


@app.command()
def delete(
    channel: ChannelArg,
    force: ForceOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Delete a channel and everything in it (messages, members, dead letters). Refused while
    a message is undone or an open agent is live, unless --force."""
    with connect(url, prefix, cluster) as bus:
        existing_channel(bus, channel).delete(force=force)
        err.print(f"{channel}: deleted")
