"""``Channel.leave(agent)`` undoes a join that nothing has used (``leave.lua``, one script),
on both faces and every server: the member, its group and its heartbeat go, and the name is
free. When anything happened since the join (a message to it, a child, another replica, a
removal and a new join, a status change), it removes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from redisbus import InvalidInput
from tests.conftest import Synced


def handle(agent: Any) -> Any:
    """The agent handle itself (the async face's handle behind the tests' sync adapter)."""
    return agent.target if isinstance(agent, Synced) else agent


def roster(bus: Any, ch: Any, name: str) -> dict[str, Any]:
    """What of ``name`` is stored on ``ch``'s keys."""
    r, k = bus.redis, ch.keys
    groups = [g["name"] for g in r.xinfo_groups(k.stream)] if r.exists(k.stream) else []
    return {
        "member": r.hget(k.members, name) is not None,
        "parent": r.hexists(k.parents, name),
        "status": r.hget(k.status, name),
        "inbox": r.hexists(k.inbox, name),
        "ids": name in r.hvals(k.ids),
        "beat": [f for f in r.hkeys(k.beat) if f.startswith(f"{name}\n")],
        "group": name in groups,
    }


GONE: dict[str, Any] = {
    "member": False,
    "parent": False,
    "status": None,
    "inbox": False,
    "ids": False,
    "beat": [],
    "group": False,
}


def test_leave_undoes_a_join_nothing_used(bus: Any, chan_name: str) -> None:
    # given a channel with a member, and an agent that just joined it
    ch = bus.channel(chan_name)
    ch.join("lead")
    me = ch.join("tryout")
    # when it leaves again
    left = ch.leave(handle(me))
    # then nothing of it is stored, and its name joins afresh as a new member
    assert left is True
    assert roster(bus, ch, "tryout") == GONE
    assert set(ch.members()) == {"lead"}
    again = ch.join("tryout")
    assert again.id != me.id
    assert roster(bus, ch, "tryout")["member"]


def test_leave_keeps_a_member_a_message_arrived_for(bus: Any, chan_name: str) -> None:
    # given an agent that joined, and a message sent to it since
    ch = bus.channel(chan_name)
    other = ch.join("lead")
    me = ch.join("tryout")
    other.send("tryout", "are you there?")
    # when it leaves, then nothing is removed: the message waits for it
    assert ch.leave(handle(me)) is False
    assert roster(bus, ch, "tryout")["member"]
    assert roster(bus, ch, "tryout")["group"]
    assert ch.counts()["tryout"] == 1


def test_leave_keeps_a_member_that_has_a_child(bus: Any, chan_name: str) -> None:
    # given an agent that joined, and a child that joined under it since
    ch = bus.channel(chan_name, routing="family")
    me = ch.join("tryout")
    ch.join("kid", parent="tryout")
    # when it leaves, then nothing is removed
    assert ch.leave(handle(me)) is False
    assert {"tryout", "kid"} <= set(ch.members())
    assert ch.members()["kid"].parent == "tryout"


def test_leave_keeps_a_member_another_process_attached_to(make_bus: Any, chan_name: str) -> None:
    # given an agent that joined, and another process that joined the same name since (one
    # more replica of it)
    bus, elsewhere = make_bus(), make_bus()
    ch = bus.channel(chan_name)
    me = ch.join("tryout", replica="cli-1")
    theirs = elsewhere.channel(chan_name).join("tryout", replica="worker-1")
    # when the first leaves, then nothing is removed: the other replica keeps its member
    assert ch.leave(handle(me)) is False
    stored = roster(bus, ch, "tryout")
    assert stored["member"] and stored["group"]
    assert stored["beat"] == ["tryout\nworker-1"]
    assert ch.members()["tryout"].id == theirs.id == me.id


def test_leave_keeps_a_member_removed_and_joined_anew(make_bus: Any, chan_name: str) -> None:
    # given an agent that joined, then was removed and joined again by another process
    bus, elsewhere = make_bus(), make_bus()
    ch = bus.channel(chan_name)
    me = ch.join("tryout")
    theirs = elsewhere.channel(chan_name)
    theirs.remove("tryout", force=True)
    new = theirs.join("tryout")
    # when the first handle leaves, then the new member stays
    assert ch.leave(handle(me)) is False
    assert ch.members()["tryout"].id == new.id != me.id
    assert roster(bus, ch, "tryout")["group"]


def test_leave_keeps_a_member_that_ended(bus: Any, chan_name: str) -> None:
    # given an agent that joined and completed
    ch = bus.channel(chan_name)
    me = ch.join("tryout")
    me.complete("done already")
    # when it leaves, then nothing is removed: its status says something happened
    assert ch.leave(handle(me)) is False
    assert roster(bus, ch, "tryout")["status"] == "completed"


def test_leave_takes_only_a_handle_of_this_channel(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name)
    other = bus.channel(chan_name + "-other")
    me = other.join("tryout")
    with pytest.raises(InvalidInput):
        ch.leave(handle(me))
    with pytest.raises(InvalidInput):
        ch.leave("tryout")
    assert "tryout" in other.members()
