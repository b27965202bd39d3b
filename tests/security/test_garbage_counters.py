"""A raw write that leaves an inbox counter no integer stops no one: sends to the agent, its
waits and its mark_done go on, and the counter is written anew
(docs/security.md#counters-and-repair). Both faces, real servers and the in-memory double."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.test_contract import FAST

GARBAGE = ["lots", "", "1.5", "-", "0x10", "nan", "inf", " 3", "\x00", "\uff11"]


@pytest.mark.parametrize("junk", GARBAGE)
def test_an_inbox_counter_that_is_no_integer_stops_no_send_wait_or_done(
    bus: Any, chan_name: str, junk: str
) -> None:
    ch = bus.channel(chan_name, **FAST)
    a, b = ch.join("a"), ch.join("b")
    bus.redis.hset(ch.keys.inbox, "b", junk)
    r = a.send("b", "one")
    assert r.status == "queued"
    assert [m.id for m in b.wait(5).messages] == [r.id]
    assert b.mark_done(r.id) is True
    again = a.send("b", "two")
    assert [m.id for m in b.wait(5).messages] == [again.id]
    bus.redis.hset(ch.keys.inbox, "b", junk)  # again, while the message is pending
    assert b.mark_done(again.id) is True
    assert int(bus.redis.hget(ch.keys.inbox, "b")) >= 0
    assert a.receipt(again.id)[0].status == "done"
