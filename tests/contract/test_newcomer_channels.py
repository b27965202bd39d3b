"""Channels between hosts (docs/getting-started.md#two-hosts-one-bus): a worker attaches without
creating, a channel can be deleted and an agent removed (freeing its name), and wait_children says
whether every child ended. Run on both faces, on Redis 7, 6.2 and the in-memory double."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from redisbus import (
    AgentClosed,
    ChildrenResult,
    NotPermitted,
    UnknownAgent,
    UnknownChannel,
    WaitResult,
)
from redisbus._keys import ChannelKeys


def keys_of(bus: Any, name: str) -> list[str]:
    return sorted(bus.redis.keys(f"{bus.settings.prefix}:{{{name}}}:*"))


def test_attach_refuses_a_missing_channel_and_creates_nothing(bus: Any, chan_name: str) -> None:
    with pytest.raises(UnknownChannel):
        bus.attach(chan_name)
    with pytest.raises(UnknownChannel):
        bus.channel(chan_name, create=False)
    assert chan_name not in bus.channels()
    assert keys_of(bus, chan_name) == []


def test_a_worker_attaching_first_leaves_the_creator_free_to_choose(
    make_bus: Any, chan_name: str
) -> None:
    worker, creator = make_bus(), make_bus()
    with pytest.raises(UnknownChannel):  # the worker came first: nothing is made
        worker.attach(chan_name)
    creator.channel(chan_name, routing="family", max_members=7)  # no ChannelMismatch
    ch = worker.attach(chan_name)
    assert ch.config.routing == "family"
    assert ch.config.max_members == 7
    assert worker.channel(chan_name, routing="family", create=False).config.routing == "family"


def test_an_unused_channel_is_deleted_with_every_key_and_can_be_made_anew(
    bus: Any, chan_name: str
) -> None:
    ch = bus.channel(chan_name)  # the worker's accidental routing=open channel
    a = ch.join("a")
    a.close()  # it went away: no lease, nothing undone
    assert keys_of(bus, chan_name)
    ch.delete()
    assert keys_of(bus, chan_name) == []
    assert chan_name not in bus.channels()
    with pytest.raises(UnknownChannel):
        ch.delete()
    again = bus.channel(chan_name, routing="family")  # the intended creator's call now works
    assert again.config.routing == "family"
    assert again.members() == {}


def test_a_channel_in_use_is_deleted_only_when_forced(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "undone")
    with pytest.raises(NotPermitted, match="in use"):
        ch.delete()
    assert b.wait(timeout=2).messages[0].body == "undone"  # refused: nothing was touched
    ch.delete(force=True)
    assert chan_name not in bus.channels()
    assert ChannelKeys.build(bus.settings.prefix, chan_name).stream not in bus.redis.keys("*")


def test_removing_a_cancelled_agent_frees_its_name(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name, routing="family")
    root = ch.join("root")
    kid = ch.join("kid", parent="root")
    old_id = kid.id
    root.cancel("kid", reason="first run over")
    with pytest.raises(AgentClosed):  # statuses go one way: the name does not come back
        ch.join("kid", parent="root")
    # its undone cancel message will never be done by it: not work it holds, no force needed
    ch.remove("kid")
    assert "kid" not in ch.members()
    again = ch.join("kid", parent="root")  # the second run of the docs' example
    assert again.id != old_id
    assert ch.members()["kid"].status == "running"
    again.send("root", "second run")
    got = root.wait(timeout=2).messages
    assert [(m.type, m.body) for m in got] == [
        ("outcome", "first run over"),
        ("message", "second run"),
    ]


def test_an_agent_holding_work_is_removed_only_when_forced(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name, routing="family")
    lead = ch.join("lead")
    ch.join("helper", parent="lead")
    lead.close()
    with pytest.raises(NotPermitted, match="open children: helper"):
        ch.remove("lead")
    ch = bus.channel(chan_name + "-open")
    w = ch.join("w")
    w.close()
    ch.join("x").send("w", "for w")
    with pytest.raises(NotPermitted, match="undone"):
        ch.remove("w")
    assert "w" in ch.members()
    ch.remove("w", force=True)
    assert "w" not in ch.members()
    with pytest.raises(UnknownAgent):
        ch.join("x").send("w", "gone")
    with pytest.raises(UnknownAgent):
        ch.remove("w")


def test_a_live_agent_is_removed_only_when_forced(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name)
    ch.join("busy")  # its handle beats: a process is working as it
    with pytest.raises(NotPermitted, match="live replica"):
        ch.remove("busy")
    ch.remove("busy", force=True)
    assert "busy" not in ch.members()


def test_wait_children_is_a_wait_result_naming_the_unfinished(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name, routing="family")
    lead = ch.join("lead")
    done, slow = ch.join("done", parent="lead"), ch.join("slow", parent="lead")
    done.complete("finished")
    got = lead.wait_children(timeout=0.3)
    assert isinstance(got, WaitResult) and isinstance(got, ChildrenResult)
    assert got.kind == "timeout" and not got
    assert got.unfinished == ("slow",)
    assert [m.sender for m in got.messages] == ["done"]
    assert [m.sender for m in got] == ["done"] and len(got) == 1  # as the list it was
    slow.fail("gave up")
    final = lead.wait_children(timeout=5)
    assert (final.kind, final.unfinished, bool(final)) == ("outcome", (), True)
    assert [(m.sender, m.subject) for m in final.messages] == [("slow", "failed")]


def test_wait_children_returns_as_soon_as_the_last_child_ends(
    make_bus: Any, chan_name: str
) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, routing="family")
    lead = ch.join("lead")
    ch.join("kid", parent="lead")
    other = make_bus(sync=True).channel(chan_name)
    kid = other.join("kid", parent="lead")
    ender = threading.Timer(0.3, kid.complete, args=("done",))
    t0 = time.monotonic()
    ender.start()
    try:
        got = lead.wait_children(timeout=30)
    finally:
        ender.join()
    assert got.kind == "outcome"
    assert [m.sender for m in got] == ["kid"]
    assert time.monotonic() - t0 < 5
