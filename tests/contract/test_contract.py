"""The core contract (docs/concepts.md), run against Bus and AsyncBus on Redis 7 and Redis 6.2."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from redisbus import (
    BudgetExceeded,
    ChainTooDeep,
    ChannelMismatch,
    ChannelPaused,
    InboxFull,
    InvalidInput,
    LoopRefused,
    RateLimited,
    Receipt,
    RecipientClosed,
    RedisbusError,
    TooLarge,
    UnknownAgent,
)
from tests.support.helpers import channel_state

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def team(bus: Any, name: str, **limits: Any) -> tuple[Any, Any, Any, Any]:
    ch = bus.channel(name, **{**FAST, **limits})
    director = ch.join("director")
    writer = ch.join("writer", parent="director")
    designer = ch.join("designer", parent="director")
    return ch, director, writer, designer


# -- lifecycle -----------------------------------------------------------------------------------


def test_message_lifecycle_queued_delivered_read_done(bus: Any, chan_name: str) -> None:
    _, _, writer, designer = team(bus, chan_name)
    r = writer.send("designer", "Script draft v1 ready", subject="draft")
    assert r.status == "queued" and r.to == "designer" and r.id and r.queued_at

    assert [x.status for x in writer.receipt(r.id)] == ["queued"]
    got = designer.wait(timeout=5)
    assert got.kind == "message"
    (msg,) = got.messages
    assert (msg.sender, msg.to, msg.subject, msg.body) == (
        "writer",
        ("designer",),
        "draft",
        "Script draft v1 ready",
    )
    assert msg.created_at == r.queued_at
    # wait() returned it in full: it is read at once, for every observer
    # (docs/concepts.md#lifecycle-and-receipts)
    rec = writer.receipt(r.id)[0]
    assert rec.status == "read" and rec.delivered_at and rec.read_at
    assert designer.list(filter_by="unread") == []

    assert designer.mark_done(msg.id, result="ok") is True
    rec = writer.receipt(r.id)[0]
    assert rec.status == "done" and rec.done_at and rec.done_at >= rec.queued_at
    assert designer.mark_done(msg.id) is False  # already done: no change
    assert designer.channel.counts()["designer"] == 0


def test_messages_marked_done_together_keep_when_each_was_delivered(
    bus: Any, chan_name: str
) -> None:
    # given: two messages the designer read, then worked on for a while
    _, _, writer, designer = team(bus, chan_name)
    sent = [writer.send("designer", f"part {i}") for i in range(2)]
    got = designer.read()
    read = [writer.receipt(r)[0] for r in sent]
    time.sleep(0.3)
    # when: both are marked done in one call
    assert designer.mark_done(got) is True
    # then: each receipt keeps when it was delivered and read (the read, not the done)
    for before, r in zip(read, sent, strict=True):
        rec = writer.receipt(r)[0]
        assert rec.status == "done" and rec.read_at == before.read_at
        assert rec.delivered_at is not None and rec.done_at is not None
        assert rec.delivered_at <= rec.read_at + timedelta(milliseconds=50)
        assert rec.done_at - rec.delivered_at >= timedelta(milliseconds=250)


def test_a_receipt_is_looked_up_by_the_receipt_send_returned(bus: Any, chan_name: str) -> None:
    _, _, writer, designer = team(bus, chan_name)
    r = writer.send("designer", "hello")
    msg = designer.wait(timeout=5).messages[0]
    by_id, by_receipt, by_message = writer.receipt(r.id), writer.receipt(r), writer.receipt(msg)
    assert [x.status for x in by_receipt] == ["read"]
    # (delivered_at is the clock less the entry's idle time: a millisecond apart between calls)
    same = [[(x.id, x.to, x.status, x.read_at) for x in got] for got in (by_id, by_message)]
    assert same == [[(x.id, x.to, x.status, x.read_at) for x in by_receipt]] * 2
    refused = Receipt(id=None, to="designer", status="rejected")
    with pytest.raises(InvalidInput, match="refused"):
        writer.receipt(refused)


def test_read_marks_read_and_list_changes_nothing(bus: Any, chan_name: str) -> None:
    ch, _, writer, designer = team(bus, chan_name)
    r = writer.send("designer", "hello", subject="hi")
    before = channel_state(bus.redis, ch.target if hasattr(ch, "target") else ch)
    listed = designer.list(filter_by="unread")
    assert [m.id for m in listed] == [r.id] and listed[0].read is False
    assert channel_state(bus.redis, ch.target if hasattr(ch, "target") else ch) == before
    assert writer.receipt(r.id)[0].status == "queued"

    read = designer.read()
    assert [m.id for m in read] == [r.id]
    assert designer.list(filter_by="unread") == []
    assert designer.list(filter_by="all")[0].read is True
    assert writer.receipt(r.id)[0].status == "read"


def test_list_previews_long_bodies_and_says_so(bus: Any, chan_name: str) -> None:
    _, _, writer, designer = team(bus, chan_name)
    writer.send("designer", "x" * 1000)
    (m,) = designer.list(preview_chars=50)
    assert len(m.body) == 50 and m.truncated
    (full,) = designer.read()
    assert len(full.body) == 1000 and not full.truncated


def test_filters_and_since(bus: Any, chan_name: str) -> None:
    _, director, writer, designer = team(bus, chan_name)
    a = writer.send("designer", "outfit?", subject="Question about scene 3")
    b = director.send("designer", "neo-80s", subject="notes")
    c = director.send("writer", "revise", subject="notes")
    assert [m.id for m in designer.list(filter_by="from:director")] == [b.id, c.id]  # open board
    assert [m.id for m in designer.read(filter_by="from:director to:me")] == [b.id]
    assert [m.id for m in designer.list(filter_by="to:me")] == [a.id, b.id]
    assert [m.id for m in designer.list(filter_by="to:writer")] == [c.id]  # open board
    assert [m.id for m in designer.list(filter_by='subject:"scene 3"')] == [a.id]
    assert [m.id for m in designer.list(filter_by=f"after:{a.id}")] == [b.id, c.id]
    assert [m.id for m in designer.list(since=a.id)] == [b.id, c.id]
    assert [m.id for m in designer.list(filter_by="from:director to:me")] == [b.id]
    assert [m.read for m in designer.list(filter_by="to:me")] == [False, True]
    assert len(designer.list(since="2000-01-01T00:00:00Z")) == 3
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert designer.list(since=future) == []


@pytest.mark.parametrize(
    "bad", ["unread bogus", "from:", "to", "after:nope", 'subject:"open', "from:a from:b", "\x00"]
)
def test_malformed_filter_is_a_typed_error(bus: Any, chan_name: str, bad: str) -> None:
    _, _, _, designer = team(bus, chan_name)
    with pytest.raises(InvalidInput):
        designer.read(filter_by=bad)
    with pytest.raises(InvalidInput):
        designer.list(filter_by=bad)


@pytest.mark.parametrize("bad", ["yesterday", "2025-13-01", "1-2-3", 12])
def test_malformed_since_is_a_typed_error(bus: Any, chan_name: str, bad: Any) -> None:
    _, _, _, designer = team(bus, chan_name)
    with pytest.raises(InvalidInput):
        designer.read(since=bad)


# -- broadcast and addressing ----------------------------------------------------------------


def test_broadcast_reaches_everyone_in_roster_order(bus: Any, chan_name: str) -> None:
    ch, director, writer, designer = team(bus, chan_name)
    ch.join("artist", parent="director")
    rs = director.send("all", "Let's go with neo-80s", subject="notes")
    assert [r.to for r in rs] == ["artist", "designer", "writer"]
    assert len({r.id for r in rs}) == 1 and all(r.status == "queued" for r in rs)
    rs2 = writer.send("all", "v2")
    assert [r.to for r in rs2] == ["director", "artist", "designer"]  # parent, then siblings
    assert [m.body for m in designer.read()] == ["Let's go with neo-80s", "v2"]


def test_broadcast_partial_refusal_delivers_to_the_others(bus: Any, chan_name: str) -> None:
    ch, director, writer, designer = team(bus, chan_name, inbox_cap=1)
    writer.send("designer", "fill")
    rs = director.send("all", "notes")
    by = {r.to: r for r in rs}
    assert by["writer"].status == "queued" and by["writer"].id
    assert by["designer"].status == "rejected" and isinstance(by["designer"].error, InboxFull)
    assert [m.body for m in writer.read()] == ["notes"]


def test_send_to_list_and_parent(bus: Any, chan_name: str) -> None:
    _, director, writer, designer = team(bus, chan_name)
    rs = director.send(["writer", "designer"], "both")
    assert [r.to for r in rs] == ["writer", "designer"]
    r = writer.send("parent", "up")
    assert r.to == "director"
    assert director.read()[0].body == "up"


def test_send_by_agent_id(bus: Any, chan_name: str) -> None:
    _, _, writer, designer = team(bus, chan_name)
    r = writer.send(designer.id, "by id")
    assert r.to == "designer"


def test_unknown_self_and_closed_recipients_are_refused(bus: Any, chan_name: str) -> None:
    ch, _, writer, _ = team(bus, chan_name)
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    with pytest.raises(UnknownAgent):
        writer.send("nobody", "hi")
    with pytest.raises(InvalidInput):
        writer.send("writer", "me")
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before
    bus.redis.hset(ch.keys.status, "designer", "failed")
    with pytest.raises(RecipientClosed):
        writer.send("designer", "hi")


def test_sender_identity_is_the_handle(bus: Any, chan_name: str) -> None:
    _, director, writer, _ = team(bus, chan_name)
    with pytest.raises(TypeError):
        writer.send("director", "x", sender="director")  # no such argument
    writer.send("director", "x")
    assert director.read()[0].sender == "writer"


# -- limits ------------------------------------------------------------------------------------


def test_body_one_byte_over_the_limit_is_refused_and_nothing_changes(
    bus: Any, chan_name: str
) -> None:
    ch, _, writer, designer = team(bus, chan_name, max_body_bytes=100)
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    with pytest.raises(TooLarge) as e:
        writer.send("designer", "é" * 50 + "x")  # 101 bytes
    assert e.value.limit == 100 and e.value.current == 101
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before
    writer.send("designer", "é" * 50)  # exactly 100 bytes


def test_default_body_limit_is_32_kib(bus: Any, chan_name: str) -> None:
    _, _, writer, _ = team(bus, chan_name)
    writer.send("designer", "x" * 32768)
    with pytest.raises(TooLarge):
        writer.send("designer", "x" * 32769)


def test_subject_rules(bus: Any, chan_name: str) -> None:
    ch, _, writer, _ = team(bus, chan_name)
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    with pytest.raises(InvalidInput):
        writer.send("designer", "x", subject="bad\x07bell")
    with pytest.raises(TooLarge):
        writer.send("designer", "x", subject="s" * 129)
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before


def test_inbox_cap_refuses_with_limit_and_current(bus: Any, chan_name: str) -> None:
    ch, _, writer, designer = team(bus, chan_name, inbox_cap=3)
    for i in range(3):
        writer.send("designer", f"m{i}")
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    with pytest.raises(InboxFull) as e:
        writer.send("designer", "one too many")
    assert (e.value.limit, e.value.current) == (3, 3)
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before
    msgs = designer.read()
    designer.mark_done(msgs[0])
    writer.send("designer", "room again")


def test_pair_rate_limit_uses_a_token_bucket(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name)  # defaults: 3 burst, 1/s
    a, b = ch.join("a"), ch.join("b")
    ch.join("c")
    for i in range(3):
        a.send("b", f"{i}")
    with pytest.raises(RateLimited) as e:
        a.send("b", "fourth")
    assert e.value.retry_after_s is not None
    assert e.value.limit == 3 and 0 < e.value.retry_after_s <= 1.0
    a.send("c", "other pair is independent")
    time.sleep(e.value.retry_after_s + 0.05)
    a.send("b", "refilled")
    assert len(b.read()) == 4


def test_sender_rate_limit(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name, sender_rate_burst=2, sender_rate_per_s=0.5, **FAST)
    a = ch.join("a")
    ch.join("b")
    ch.join("c")
    a.send("b", "1")
    a.send("c", "2")
    with pytest.raises(RateLimited) as e:
        a.send("b", "3")
    assert e.value.retry_after_s and e.value.retry_after_s > 1


def test_chain_depth_and_auto_reply_rule(bus: Any, chan_name: str) -> None:
    _, _, a, b = team(bus, chan_name, max_chain_depth=2)
    r0 = a.send("designer", "q")
    r1 = b.send("writer", "a1", reply_to=r0.id)
    r2 = a.send("designer", "a2", reply_to=r1.id)
    with pytest.raises(ChainTooDeep) as e:
        b.send("writer", "a3", reply_to=r2.id)
    assert (e.value.limit, e.value.current) == (2, 3)
    auto = b.send("writer", "ack", type="auto_reply", reply_to=r0.id)
    with pytest.raises(LoopRefused):
        a.send("designer", "ack of ack", type="auto_reply", reply_to=auto.id)
    a.send("designer", "a human answer to an auto reply is fine", reply_to=auto.id)


def test_an_auto_reply_is_never_sent_while_handling_an_auto_reply(bus: Any, chan_name: str) -> None:
    # given: the designer handling an auto_reply (fetched, not done yet)
    ch, director, writer, designer = team(bus, chan_name)
    writer.send("designer", "ack", type="auto_reply")
    (got,) = designer.wait(5).messages
    # when: it sends an automatic message of its own, answering or not, to anyone
    # then: refused, as an answer (reply_to) is; a message of another type goes
    for to in ("writer", "director"):
        with pytest.raises(LoopRefused):
            designer.send(to, "auto of auto", type="auto_reply")
    designer.send("writer", "a human note while handling it")
    # and once it is done with it, its automatic messages go again
    designer.mark_done(got)
    designer.send("writer", "a later auto_reply", type="auto_reply")


def test_pause_refuses_every_send_until_resumed(bus: Any, chan_name: str) -> None:
    ch, _, writer, _ = team(bus, chan_name)
    ch.pause()
    with pytest.raises(ChannelPaused):
        writer.send("designer", "x")
    with pytest.raises(ChannelPaused):
        writer.send("all", "x")
    ch.resume()
    writer.send("designer", "x")


def test_pause_and_resume_reach_sends_on_every_host_at_once(make_bus: Any, chan_name: str) -> None:
    # given: a channel whose sends went through (send.lua keeps limits and pause packed)
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, routing="open")
    a = ch.join("a")
    two.channel(chan_name).join("b")
    a.send("b", "before")
    # when: another host pauses the channel, then resumes it
    two.channel(chan_name).pause()
    # then: the very next send is refused, and the one after the resume goes through
    with pytest.raises(ChannelPaused):
        a.send("b", "while paused")
    two.channel(chan_name).resume()
    assert a.send("b", "after").status == "queued"


def test_channel_limits_live_in_redis(make_bus: Any, chan_name: str) -> None:
    one, two = make_bus(), make_bus(inbox_cap=5)
    ch = one.channel(chan_name, inbox_cap=2)
    again = two.channel(chan_name)  # attaches as stored, whatever its own settings say
    assert again.config.inbox_cap == 2
    with pytest.raises(ChannelMismatch):
        two.channel(chan_name, inbox_cap=3)
    with pytest.raises(ChannelMismatch):
        two.channel(chan_name, routing="family")
    ch.configure(inbox_cap=4)
    assert two.channel(chan_name, inbox_cap=4).config.inbox_cap == 4


def test_configure_applies_to_the_next_send_on_every_host(make_bus: Any, chan_name: str) -> None:
    # given: a channel whose sends went through (send.lua keeps its limits packed)
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, routing="open", inbox_cap=100, pair_rate_burst=0)
    a = ch.join("a")
    b = two.channel(chan_name).join("b")
    for _ in range(3):
        a.send("b", "before")
    # when: another host lowers the inbox cap and the budget
    two.channel(chan_name).configure(inbox_cap=4, max_messages=5)
    # then: the next sends obey the new limits at once
    a.send("b", "fourth")
    with pytest.raises(InboxFull):
        a.send("b", "fifth")
    b.mark_done(b.read(limit=10))
    a.send("b", "the fifth message of the channel")
    with pytest.raises(BudgetExceeded):
        a.send("b", "over budget")


def test_ttl_expires_undelivered_messages(bus: Any, chan_name: str) -> None:
    ch, _, writer, designer = team(bus, chan_name)
    r = writer.send("designer", "soon stale", ttl_s=0.05)
    time.sleep(0.15)
    assert writer.receipt(r.id)[0].status == "expired"
    assert designer.wait(timeout=0.2).kind == "timeout"
    designer.flush()
    assert ch.counts()["designer"] == 0


def test_idempotency_key_returns_the_first_send(bus: Any, chan_name: str) -> None:
    ch, _, writer, _ = team(bus, chan_name)
    r1 = writer.send("designer", "once", idempotency_key="k-1")
    r2 = writer.send("designer", "once", idempotency_key="k-1")
    assert r1.id == r2.id and ch.length() == 1


# -- waiting -----------------------------------------------------------------------------------


def test_wait_times_out_and_refuses_bad_timeouts(bus: Any, chan_name: str) -> None:
    ch, _, _, designer = team(bus, chan_name)
    t0 = time.monotonic()
    assert designer.wait(timeout=0.3).kind == "timeout"
    assert 0.25 <= time.monotonic() - t0 < 1.5
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    for bad in (301, -1, float("nan"), "5", True):
        with pytest.raises(InvalidInput):
            designer.wait(timeout=bad)
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before
    assert designer.wait(timeout=0).kind == "timeout"


def test_wait_wakes_promptly_on_a_message_from_another_client(
    make_bus: Any, chan_name: str
) -> None:
    bus1 = make_bus()
    _, _, writer, designer = team(bus1, chan_name)
    sender_bus = make_bus()
    ch2 = sender_bus.channel(chan_name)
    w2 = ch2.join("writer")
    sent_at: list[float] = []

    def later() -> None:
        time.sleep(0.3)
        sent_at.append(time.monotonic())
        w2.send("designer", "wake up")

    if hasattr(sender_bus, "target"):  # the async adapter is not thread-safe: use a sync bus
        w2 = make_bus(sync=True).channel(chan_name).join("writer")
    t = threading.Thread(target=later)
    t.start()
    got = designer.wait(timeout=10)
    woke = time.monotonic()
    t.join()
    assert got.kind == "message" and got.messages[0].body == "wake up"
    assert woke - sent_at[0] < 0.5


def test_wait_marks_read_at_once_for_other_hosts(make_bus: Any, chan_name: str) -> None:
    # given: a recipient on one bus, the sender and an observer on another
    bus, observer = make_bus(), make_bus()
    _, _, writer, designer = team(bus, chan_name)
    mine = writer.send("designer", "for you")
    theirs = writer.send("director", "not for you")
    short = writer.send("designer", "stale", ttl_s=0.05)
    time.sleep(0.1)
    # when: the recipient's wait() returns, and nothing else is called on its handle
    got = designer.wait(timeout=5)
    # then: what it returned is read already, seen from another host; what it skipped is not
    assert [m.id for m in got.messages] == [mine.id]
    seen = observer.channel(chan_name)
    (rec,) = [x for x in seen.join("writer").receipt(mine.id) if x.to == "designer"]
    assert rec.status == "read" and rec.read_at
    assert seen.join("writer").receipt(theirs.id)[0].status == "queued"
    assert seen.join("writer").receipt(short.id)[0].status == "expired"
    # and the roster shows the woken agent at work, not still waiting
    members = seen.members()
    assert members["designer"].status == "running"


def test_await_delivery_returns_once_fetched(make_bus: Any, chan_name: str) -> None:
    bus = make_bus()
    _, _, writer, _ = team(bus, chan_name)
    other = make_bus(sync=True)
    designer = other.channel(chan_name).join("designer")
    t = threading.Thread(target=lambda: designer.wait(timeout=5))
    t.start()
    r = writer.send("designer", "are you there", await_delivery=5)
    t.join()
    assert r.status in ("delivered", "read") and r.delivered_at
    r2 = writer.send("designer", "nobody waits", await_delivery=0.2)
    assert r2.status == "queued"


def test_restarted_replica_rereads_its_pending_entries_first(make_bus: Any, chan_name: str) -> None:
    bus1 = make_bus()
    _, _, writer, designer = team(bus1, chan_name)
    r = writer.send("designer", "in flight")
    assert designer.wait(timeout=2).messages[0].id == r.id  # fetched, never marked done
    bus2 = make_bus()
    again = bus2.channel(chan_name).join("designer", replica=designer.replica)
    got = again.wait(timeout=1)
    assert [m.id for m in got.messages] == [r.id]
    again.mark_done(r.id)
    assert writer.receipt(r.id)[0].status == "done"


# -- roster ------------------------------------------------------------------------------------


def test_roster_and_tree(bus: Any, chan_name: str) -> None:
    ch, director, writer, designer = team(bus, chan_name)
    roster = writer.agents()
    assert roster.self.name == "writer" and roster.self.depth == 1
    assert [(m.relationship, m.name) for m in roster.family] == [
        ("parent", "director"),
        ("sibling", "designer"),
    ]
    tree = ch.tree()
    assert [(m.name, m.parent, m.depth) for m in tree] == [
        ("director", None, 0),
        ("designer", "director", 1),
        ("writer", "director", 1),
    ]
    assert {m.status for m in tree} == {"running"}


def test_join_validates_names_and_parents(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name)
    for bad in ("", "all", "a\nb", "x" * 129, 5):
        with pytest.raises(InvalidInput):
            ch.join(bad)
    with pytest.raises(UnknownAgent):
        ch.join("orphan", parent="nobody")
    ch.join("root")
    ch.join("kid", parent="root")
    ch.join("other")
    with pytest.raises(InvalidInput):  # a member keeps its parent: no re-parenting by join
        ch.join("kid", parent="other")


def test_errors_form_one_tree(bus: Any, chan_name: str) -> None:
    _, _, writer, _ = team(bus, chan_name)
    with pytest.raises(RedisbusError):
        writer.send("nobody", "x")
    with pytest.raises(ValueError):
        writer.read(filter_by="nonsense")
