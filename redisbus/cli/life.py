"""``redisbus`` commands that end agents and clear channels: complete, fail, cancel, remove,
delete. What ``Agent.complete/fail/cancel``, ``Channel.remove`` and ``Channel.delete`` do, from
a shell: an agent a script joined with ``redisbus join`` can end (and its name be freed) the
same way."""

from __future__ import annotations

from typing import Annotated

import typer

from .._commands import BusAddress, err, with_address
from ._shared import (
    AsOpt,
    ChannelArg,
    acting,
    agent_option,
    connect,
    existing_channel,
    existing_member,
    precheck,
)

TextArg = Annotated[str, typer.Argument(help="Text for the parent's outcome message.")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force", help="Even while it holds work (undone messages, pending entries, live agents)."
    ),
]


@with_address
def complete(address: BusAddress, channel: ChannelArg, agent: AsOpt, summary: TextArg = "") -> None:
    """Finish --as NAME (an existing member): status completed; its parent gets the summary
    as an outcome message. A completed agent still takes follow-up messages."""
    _end(address, channel, agent, "complete", summary)


@with_address
def fail(address: BusAddress, channel: ChannelArg, agent: AsOpt, error: TextArg = "") -> None:
    """End --as NAME (an existing member) with an error: its parent gets a failed outcome and
    its descendants are cancelled."""
    _end(address, channel, agent, "fail", error)


def _end(address: BusAddress, channel: str, agent: str, how: str, text: str) -> None:
    """``Agent.complete(text)`` or ``Agent.fail(text)`` as an existing member."""
    precheck(result=text or None)
    with connect(address) as bus:
        me = acting(existing_channel(bus, channel), agent, bus)
        getattr(me, how)(text)
        err.print(f"{agent}: {how.removesuffix('e')}ed")


@with_address
def cancel(
    address: BusAddress,
    channel: ChannelArg,
    child: Annotated[str, typer.Argument(help="The child to cancel.", show_default=False)],
    agent: AsOpt,
    reason: Annotated[str, typer.Option("--reason", help="Why (the child's parent sees it).")] = "",
) -> None:
    """Cancel CHILD and its whole subtree, on every host, as its parent --as NAME. A cancelled
    name cannot join again until `redisbus remove` frees it."""
    agent_option(child, "child")
    precheck(result=reason or None)
    with connect(address) as bus:
        me = acting(existing_channel(bus, channel), agent, bus)
        me.cancel(child, reason)
        err.print(f"{child}: cancelled")


@with_address
def remove(
    address: BusAddress,
    channel: ChannelArg,
    name: Annotated[str, typer.Argument(help="The agent to remove.", show_default=False)],
    force: ForceOpt = False,
) -> None:
    """Take an agent off the channel and free its name (a later join makes a new member).
    Refused while it holds work (undone messages, pending entries, open children, a live
    replica) unless --force; an ended agent's undone messages do not count."""
    with connect(address) as bus:
        ch = existing_channel(bus, channel)
        existing_member(ch, name)
        ch.remove(name, force=force)
        err.print(f"{name}: removed from {channel}")


@with_address
def delete(address: BusAddress, channel: ChannelArg, force: ForceOpt = False) -> None:
    """Delete a channel and everything in it (messages, members, dead letters). Refused while
    a message is undone or an open agent is live, unless --force."""
    with connect(address) as bus:
        existing_channel(bus, channel).delete(force=force)
        err.print(f"{channel}: deleted")
