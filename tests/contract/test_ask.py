"""agent.ask(): a request and its reply, on both faces, Redis 7, Redis 6.2 and the double."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from redisbus import AskTimeout, InvalidInput, RedisbusError, UnknownAgent

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def responder(bus: Any, chan: str, *, unrelated_first: bool = True) -> threading.Thread:
    """In a thread of its own (a sync bus): the helper answers the first request; before it
    does, a third agent writes to the asker, so that message arrives during ask()."""
    ch = bus.channel(chan)
    helper, third = ch.join("helper"), ch.join("third")

    def run() -> None:
        got = helper.wait(timeout=10)
        [request] = got.messages
        if unrelated_first:
            third.send("asker", "unrelated news", subject="fyi")
        helper.send("asker", f"answer to {request.body}", reply_to=request.id)
        helper.mark_done(request)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_ask_returns_the_reply_and_leaves_other_messages_unread(
    make_bus: Any, chan_name: str
) -> None:
    # given an asker, a helper that answers and a third agent that writes meanwhile
    bus = make_bus()
    asker = bus.channel(chan_name, **FAST).join("asker")
    t = responder(make_bus(sync=True), chan_name)
    # when the asker asks
    reply = asker.ask("helper", "2+2?", timeout=10)
    t.join(10)
    # then it gets the reply, read, with reply_to set to its request
    assert reply.body == "answer to 2+2?" and reply.sender == "helper" and reply.read
    [request] = asker.list("from:asker")
    assert request.type == "request" and reply.reply_to == request.id
    # and the third agent's message is still unread: the next wait() returns it, once
    assert [m.body for m in asker.list("unread")] == ["unrelated news"]
    got = asker.wait(timeout=5)
    assert got.kind == "message" and [m.body for m in got.messages] == ["unrelated news"]
    assert asker.wait(timeout=0).kind == "timeout"


def test_a_message_arriving_during_ask_is_returned_by_a_later_read(
    make_bus: Any, chan_name: str
) -> None:
    bus = make_bus()
    asker = bus.channel(chan_name, **FAST).join("asker")
    t = responder(make_bus(sync=True), chan_name)
    asker.ask("helper", "ping", timeout=10)
    t.join(10)
    assert [m.body for m in asker.read("unread")] == ["unrelated news"]
    assert asker.read("unread") == []


def test_ask_without_a_reply_raises_a_typed_timeout(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    asker, silent = ch.join("asker"), ch.join("silent")
    t0 = time.monotonic()
    with pytest.raises(AskTimeout) as e:
        asker.ask("silent", "anyone?", timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 5
    assert isinstance(e.value, TimeoutError) and isinstance(e.value, RedisbusError)
    # the request was sent: the error names it, and the recipient has it
    [request] = silent.read("unread")
    assert e.value.request_id == request.id and request.type == "request"


def test_a_refused_ask_raises_as_send_does(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    asker = ch.join("asker")
    with pytest.raises(UnknownAgent):
        asker.ask("nobody", "hello?", timeout=1)
    with pytest.raises(InvalidInput):
        asker.ask("all", "hello?", timeout=1)
    with pytest.raises(InvalidInput):
        asker.ask("asker", "hello?", timeout=1000)
    assert asker.list("all") == []  # nothing was sent
