"""The receipts the hot path builds quickly are ordinary Receipts in every way a user can see."""

from __future__ import annotations

import dataclasses
import pickle
from datetime import UTC, datetime

import pytest

from redisbus import Receipt
from redisbus._model import ms_to_dt, queued_receipt


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
