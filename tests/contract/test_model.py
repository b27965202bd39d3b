"""What the hot paths build quickly (receipts, fetched messages, the wait kind) is what the plain
form builds, in every way a user can see."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from redisbus import Message, Receipt
from redisbus._core import message_from_fields, wait_kind
from redisbus._model import id_ms, ms_to_dt, queued_receipt


def test_a_quickly_built_receipt_is_an_ordinary_frozen_receipt() -> None:
    at = ms_to_dt(1_796_039_944_673)
    fast = queued_receipt("1796039944673-0", "bob", at)
    slow = Receipt("1796039944673-0", "bob", "queued", None, at)
    assert type(fast) is Receipt and dataclasses.is_dataclass(fast)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    assert fast.as_dict() == slow.as_dict() and fast.ok
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.status = "done"  # type: ignore[misc]
    assert dataclasses.replace(fast, status="done").status == "done"
    assert pickle.loads(pickle.dumps(fast)) == slow


def test_ms_to_dt_is_exact_and_utc() -> None:
    for ms in (0, 1, 999, 1_796_039_944_673, 253_402_300_799_999):
        dt = ms_to_dt(ms)
        assert dt is not None and dt.tzinfo is UTC
        delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
        assert delta.days * 86_400_000 + delta.seconds * 1000 + delta.microseconds // 1000 == ms
        assert delta.microseconds % 1000 == 0


# -- messages as a wake-up builds them ---------------------------------------------------------

_names = st.text(alphabet="abcdefgh-_", min_size=1, max_size=8)
_texts = st.text(max_size=20)


@st.composite
def _entries(draw: st.DrawFn) -> tuple[str, dict[str, str]]:
    """A stream entry as send.lua writes it (optional fields only when set), or damaged."""
    entry_id = f"{draw(st.integers(0, 253_402_300_799_999))}-{draw(st.integers(0, 9))}"
    f = {"f": draw(_names), "b": draw(_texts)}
    optional = {
        "t": st.lists(_names, min_size=1, max_size=3).map("\n".join),
        "s": _texts,
        "k": st.sampled_from(["request", "outcome", "control", "auto_reply"]),
        "p": st.sampled_from(["1", "2", "x", ""]),
        "r": st.sampled_from(["1-0", ""]),
        "d": st.sampled_from(["3", "-1", ""]),
        "x": st.sampled_from(["0.5", "30"]),
        "i": _texts,
        "c": _texts,
    }
    for key, values in optional.items():
        if draw(st.booleans()):
            f[key] = draw(values)
    return entry_id, f


def _message_by_keyword(
    channel: str, entry_id: str, f: dict[str, str], read: bool, verified: bool | None
) -> Message:
    """message_from_fields as it was written before it passed its arguments by position."""
    ttl = f.get("x")
    return Message(
        id=entry_id,
        channel=channel,
        sender=f.get("f", ""),
        to=tuple(f.get("t", "").split("\n")) if f.get("t") else (),
        subject=f.get("s", ""),
        body=f.get("b", ""),
        type=f.get("k", "message"),
        priority=int(f.get("p", "0")) if f.get("p", "0").isdigit() else 0,
        reply_to=f.get("r") or None,
        depth=int(f.get("d", "0")) if f.get("d", "0").isdigit() else 0,
        created_at=ms_to_dt(id_ms(entry_id)),  # type: ignore[arg-type]
        ttl_s=float(ttl) if ttl else None,
        read=read,
        idempotency_key=f.get("i") or None,
        trace=f.get("c") or None,
        verified=verified,
    )


@settings(max_examples=300, deadline=None)
@given(_entries(), st.booleans(), st.sampled_from([None, True, False]))
def test_a_fetched_message_has_every_field_in_its_place(
    entry: tuple[str, dict[str, str]], read: bool, verified: bool | None
) -> None:
    # message_from_fields sets Message's eighteen slots on an unfrozen twin and hands it over
    # as a Message (a wake-up makes one per message): any field misplaced or left unset, or
    # anything that makes it less than an ordinary frozen Message, shows here
    entry_id, f = entry
    got = message_from_fields("ch", entry_id, f, read=read, verified=verified)
    slow = _message_by_keyword("ch", entry_id, f, read, verified)
    assert type(got) is Message and got == slow and repr(got) == repr(slow)
    assert hash(got) == hash(slow) and dataclasses.asdict(got) == dataclasses.asdict(slow)
    assert pickle.loads(pickle.dumps(got)) == slow
    assert not got.truncated and got.deliveries == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.body = "changed"  # type: ignore[misc]
    assert dataclasses.replace(got, body="changed").body == "changed"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["message", "outcome", "control"]), _texts), max_size=4))
def test_wait_kind_is_cancelled_then_outcome_then_message(kinds: list[tuple[str, str]]) -> None:
    msgs = [
        Message("1-0", "ch", "a", ("b",), "cancel" if i % 2 else subject, "", type_)
        for i, (type_, subject) in enumerate(kinds)
    ]
    if any(m.type == "control" and m.subject == "cancel" for m in msgs):
        expected = "cancelled"
    elif msgs and all(m.type == "outcome" for m in msgs):
        expected = "outcome"
    else:
        expected = "message"
    assert wait_kind("b", msgs) == expected


@pytest.mark.parametrize(
    "made",
    [
        pytest.param(lambda: queued_receipt("1-0", "writer", None), id="queued_receipt"),
        pytest.param(
            lambda: message_from_fields("c", "1-0", {"f": "a", "t": "b", "b": "hi"}, read=True),
            id="message_from_fields",
        ),
    ],
)
def test_the_fast_constructors_set_every_dataclass_field(made: Any) -> None:
    # given an instance built without its dataclass __init__ (see _model.frozen_as)
    obj = made()
    # then every field of dataclasses.fields() was set: a field added to the class but not
    # to the fast constructor raises AttributeError here
    unset = [f.name for f in dataclasses.fields(obj) if not hasattr(obj, f.name)]
    assert not unset, f"{type(obj).__name__} fields left unset by the fast constructor: {unset}"
    assert dataclasses.replace(obj) == obj
