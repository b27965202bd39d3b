"""A receipt's times keep their order (queued, then delivered, then read, then done) and the
first hand-out stays the delivery time, whatever re-reads and rounding do to the pending list
(docs/concepts.md#lifecycle-and-receipts). Both faces, real servers and the in-memory double."""

from __future__ import annotations

import time
from typing import Any

from tests.contract.test_contract import FAST


def _in_order(r: Any) -> None:
    times = [t for t in (r.queued_at, r.delivered_at, r.read_at, r.done_at) if t is not None]
    assert times == sorted(times), r


def test_receipt_times_keep_their_order_and_delivery_holds_across_re_reads(
    bus: Any, chan_name: str
) -> None:
    ch = bus.channel(chan_name, **FAST)
    a, b = ch.join("a"), ch.join("b")
    for i in range(40):
        sent = a.send("b", f"m{i}")
        got = b.wait(5).messages if i % 2 else b.read()
        assert [m.id for m in got] == [sent.id]
        first = a.receipt(sent.id)[0]
        assert first.status == "read" and first.delivered_at is not None
        _in_order(first)
        if i % 4 < 2:
            time.sleep(0.003)
            b.read("all")  # read again: the pending list's hand-out time moves
        again = a.receipt(sent.id)[0]
        _in_order(again)
        assert again.delivered_at == first.delivered_at
        b.mark_done(got)
        done = a.receipt(sent.id)[0]
        assert done.status == "done"
        _in_order(done)
        assert done.delivered_at == first.delivered_at
