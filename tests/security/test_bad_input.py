"""Bad input, hammered: thousands of malformed calls get typed errors and change nothing."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbus import Bus, BusSettings, InvalidInput, RedisbusError
from redisbus._core import SENDABLE_TYPES
from tests.support.helpers import channel_state
from tests.support.servers import Server

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.binary(max_size=20),
    st.text(max_size=40),
)
junk = st.one_of(
    scalars,
    st.text(alphabet=st.characters(max_codepoint=0x9F), max_size=10),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
ids = st.one_of(junk, st.from_regex(r"\A\d{1,25}-\d{1,25}\Z"), st.just("0-0"))


@pytest.fixture(scope="module")
def board(redis7: Server) -> Iterator[tuple[Any, Any, Any]]:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel(
        "fuzz", inbox_cap=5, max_body_bytes=64, pair_rate_burst=2, pair_rate_per_s=0.001
    )
    a = ch.join("a")
    ch.join("b")
    a.send("b", "seed")
    yield bus, ch, a
    bus.close()


def refused_without_a_trace(bus: Any, ch: Any, call: Any, valid: bool) -> None:
    """Refused: a typed error and no trace. Accepted: only when the oracle says it was valid."""
    before = channel_state(bus.redis, ch)
    try:
        call()
    except RedisbusError:
        assert channel_state(bus.redis, ch) == before
        return
    except TypeError as e:  # only from Python itself: wrong keyword or arity, never our values
        raise AssertionError(f"TypeError escaped: {e}") from e
    assert valid, "junk was accepted"


def a_name(v: Any) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 128 and v.isprintable() and v != "all"


def a_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def valid_send(to: Any, body: Any, subject: Any, type_: Any, priority: Any, ttl: Any) -> bool:
    names = [to] if isinstance(to, str) and to != "all" else to if isinstance(to, list) else None
    return (
        (to == "all" or (names is not None and bool(names) and all(a_name(n) for n in names)))
        and isinstance(body, str)
        and isinstance(subject, str)
        and subject.isprintable()
        and len(subject) <= 128
        and isinstance(type_, str)
        and type_ in SENDABLE_TYPES
        and type(priority) is int
        and 0 <= priority <= 2
        and (ttl is None or (a_number(ttl) and ttl > 0))
    )


fuzz = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def an_entry_id(v: Any) -> bool:
    m = re.fullmatch(r"(\d+)-(\d+)", v) if isinstance(v, str) else None
    return m is not None and all(int(part) < 2**64 for part in m.groups())


def or_good(*good: Any) -> Any:
    """Junk or a valid value: each argument is sometimes fine, so each check is reached alone."""
    return st.one_of(junk, st.sampled_from(good))


@fuzz
@given(
    to=or_good("b", "all", ["b"]),
    body=or_good("hi", ""),
    subject=or_good("", "s"),
    type_=or_good("message", "request"),
    priority=or_good(0, 2),
    ttl=or_good(None, 30),
)
def test_send_with_junk(
    board: Any, to: Any, body: Any, subject: Any, type_: Any, priority: Any, ttl: Any
) -> None:
    bus, ch, a = board
    refused_without_a_trace(
        bus,
        ch,
        lambda: a.send(to, body, subject=subject, type=type_, priority=priority, ttl_s=ttl),
        valid_send(to, body, subject, type_, priority, ttl),
    )


@fuzz
@given(reply_to=ids)
def test_send_with_junk_reply_to(board: Any, reply_to: Any) -> None:
    # only None or an entry id of the form ms-seq passes; it need not exist
    bus, ch, a = board
    shaped = reply_to is None or an_entry_id(reply_to)
    refused_without_a_trace(bus, ch, lambda: a.send("b", "x", reply_to=reply_to), shaped)


@fuzz
@given(
    filter_by=or_good(None, "all", "unread", "from:b subject:x"),
    since=or_good(None, "2025-01-01T00:00:00Z"),
    limit=or_good(1, 100),
)
def test_read_and_list_with_junk(board: Any, filter_by: Any, since: Any, limit: Any) -> None:
    bus, ch, a = board
    shaped = (
        (filter_by is None or isinstance(filter_by, str))
        and (since is None or isinstance(since, str))
        and type(limit) is int
        and limit > 0
    )
    call = {"filter_by": filter_by, "since": since, "limit": limit}
    refused_without_a_trace(bus, ch, lambda: a.list(**call), shaped)
    refused_without_a_trace(bus, ch, lambda: a.read(**call), shaped)


@fuzz
@given(
    timeout=st.one_of(
        junk.filter(lambda v: v is not None and not (isinstance(v, int | float) and 0 <= v <= 300)),
        st.floats(min_value=300.0001, max_value=1e300),
    )
)
def test_wait_with_bad_timeouts(board: Any, timeout: Any) -> None:
    bus, ch, a = board
    refused_without_a_trace(bus, ch, lambda: a.wait(timeout=timeout), valid=False)


@fuzz
@given(message=ids, result=junk)
def test_mark_done_and_receipt_with_junk(board: Any, message: Any, result: Any) -> None:
    bus, ch, a = board
    shaped = an_entry_id(message)
    refused_without_a_trace(bus, ch, lambda: a.receipt(message), shaped)
    if result is not None:
        fine = shaped and isinstance(result, str)
        refused_without_a_trace(bus, ch, lambda: a.mark_done(message, result=result), fine)


@fuzz
@given(name=junk, parent=junk, replica=junk)
def test_join_with_junk(board: Any, name: Any, parent: Any, replica: Any) -> None:
    bus, ch, a = board
    before = channel_state(bus.redis, ch)
    try:
        ch.join(name, parent=parent, replica=replica)
    except RedisbusError:
        assert channel_state(bus.redis, ch) == before


@fuzz
@given(name=junk, routing=junk, cap=junk)
def test_channel_with_junk(board: Any, name: Any, routing: Any, cap: Any) -> None:
    bus, ch, a = board
    before = channel_state(bus.redis, ch)
    with contextlib.suppress(RedisbusError):
        bus.channel(name, routing=routing, inbox_cap=cap)
    assert channel_state(bus.redis, ch) == before


# an item send_many can never take: not a (to, body) pair or a mapping of send() arguments
bad_items = st.one_of(
    scalars,
    st.lists(st.text(max_size=3), max_size=1).map(tuple),
    st.lists(st.text(max_size=3), min_size=3, max_size=4).map(tuple),
    st.fixed_dictionaries({"body": st.text(max_size=8)}),
    st.fixed_dictionaries({"to": st.just("b")}),
    st.fixed_dictionaries({"to": st.just("b"), "body": st.just("x"), "durable": st.booleans()}),
    st.tuples(st.one_of(st.none(), st.integers(), st.binary(max_size=4)), st.text(max_size=8)),
    st.tuples(st.just("b"), st.one_of(st.none(), st.integers(), st.binary(max_size=4))),
)
good_items = st.sampled_from([("b", "fine"), {"to": "b", "body": "fine", "subject": "s"}])


@fuzz
@given(
    before=st.lists(good_items, max_size=3),
    bad=bad_items,
    after=st.lists(good_items, max_size=3),
)
def test_a_batch_with_one_bad_item_sends_nothing(
    board: Any, before: list[Any], bad: Any, after: list[Any]
) -> None:
    # every item is checked before any is sent: the good ones around a bad one are not sent
    bus, ch, a = board
    state = channel_state(bus.redis, ch)
    with pytest.raises(InvalidInput):
        a.send_many([*before, bad, *after])
    assert channel_state(bus.redis, ch) == state


@fuzz
@given(items=junk)
def test_send_many_with_junk(board: Any, items: Any) -> None:
    bus, ch, a = board
    # junk holds no (to, body) pair of valid values, so nothing of it may be accepted but []
    refused_without_a_trace(bus, ch, lambda: a.send_many(items), valid=items == [])
