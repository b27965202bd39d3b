"""Guarantees at the edges (issue 16, items 5-8 and 12): idempotent retries always get their
receipt, a pause is one atomic change, idle agents are never reaped as lost, rate bookkeeping
is bounded by the active pairs, and loops of fresh messages are stopped.

Every test runs against real Redis servers (7 and 6.2) and the in-memory double, on both faces.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import pytest

from redisbus import BudgetExceeded, BusConnectionError, ChannelPaused
from tests.test_contract import FAST, team


def io_of(bus: Any) -> Any:
    """The Redis boundary of a bus (the async face sits behind the sync adapter)."""
    return getattr(bus, "target", bus)._io


def drop_after(io: Any, commands: int) -> None:
    """From now on, the connection drops after ``commands`` more calls: every later call fails
    as a lost connection would, before reaching Redis."""
    real = io.call
    left = [commands]

    def spend() -> None:
        if left[0] <= 0:
            raise BusConnectionError("connection dropped (test)")
        left[0] -= 1

    if inspect.iscoroutinefunction(real):

        async def acall(*args: Any, **kw: Any) -> Any:
            spend()
            return await real(*args, **kw)

        io.call = acall
    else:

        def call(*args: Any, **kw: Any) -> Any:
            spend()
            return real(*args, **kw)

        io.call = call


# -- 6: pausing and reconfiguring is one atomic change --------------------------------------------


def test_pause_is_one_atomic_change_even_when_the_connection_drops(
    make_bus: Any, chan_name: str
) -> None:
    # given: a channel whose sends went through (send.lua keeps limits and pause packed)
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, **FAST)
    a = ch.join("a")
    ch.join("b")
    a.send("b", "before")
    # when: another host pauses it, and its connection drops after the first command
    other = two.channel(chan_name)
    drop_after(io_of(two), 1)
    paused_here = True
    try:
        other.pause()
    except BusConnectionError:
        paused_here = False
    # then: the channel is either paused for every send or not changed at all; never a
    # pause that reads as paused while sends still go through
    shown = ch.refresh().paused
    if shown:
        with pytest.raises(ChannelPaused):
            a.send("b", "while paused")
    else:
        assert not paused_here
        assert a.send("b", "not paused").status == "queued"


def test_configure_from_another_host_stops_the_very_next_send(
    make_bus: Any, chan_name: str
) -> None:
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, **FAST)
    a = ch.join("a")
    ch.join("b")
    a.send("b", "before")
    cfg = two.channel(chan_name).configure(max_messages=1)
    assert cfg.max_messages == 1  # the stored configuration, as changed
    with pytest.raises(BudgetExceeded):
        a.send("b", "over budget")
    two.channel(chan_name).pause()
    with pytest.raises(ChannelPaused):
        a.send("b", "paused")


# -- 8: an agent that promised no heartbeat is never lost ------------------------------------------


# join.lua gives a new replica a lease of lease_s; the heartbeat renews it for agent_lease_s
BEAT = {"heartbeat_s": 0.05, "agent_lease_s": 0.3, "lease_s": 0.3}


def test_agents_of_a_closed_bus_or_handle_are_never_reported_lost(
    make_bus: Any, chan_name: str
) -> None:
    # given: alice and bob joined by a process that then exits (as `redisbus join` does),
    # and dave's handle closed by a process that stays
    cli = make_bus(**BEAT)
    ch = cli.channel(chan_name, routing="family", **FAST)
    ch.join("alice")
    ch.join("bob", parent="alice")
    cli.close()
    live = make_bus(**BEAT)
    lch = live.channel(chan_name)
    lch.join("dave", parent="alice").close()
    # when: a live agent heartbeats on the channel for several leases
    lch.join("carol")
    time.sleep(4 * BEAT["agent_lease_s"])
    # then: nobody is lost, nobody was cancelled, and alice can still reach bob
    statuses = {m.name: m.status for m in lch.tree()}
    assert statuses == dict.fromkeys(["alice", "bob", "carol", "dave"], "running")
    again = make_bus(**BEAT).channel(chan_name)
    alice = again.join("alice")
    assert alice.send("bob", "hi").status == "queued"
    assert alice.wait(timeout=0.2).kind == "timeout"  # no "lost" outcome from bob or dave
    bob = again.join("bob")
    assert [(m.sender, m.body) for m in bob.wait(timeout=1).messages] == [("alice", "hi")]
