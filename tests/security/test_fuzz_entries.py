"""No bytes written to a stream stop an agent (docs/security.md#what-a-receiver-refuses): arbitrary
raw entries — missing, extra, huge, non-numeric and non-UTF-8 fields, any type, recipients and
sender — written into a live channel, then a genuine message. Every reader (list, read, wait, the
re-read of a replica's pending list, dead letters, the janitor) keeps working; with signing
on every raw entry is rejected and counted down; the genuine message always arrives; no
inbox count goes below what its agent holds pending (signing on: signing off, a raw write
that looks like a message is one, uncounted)."""

from __future__ import annotations

import itertools
import os
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.typing import EncodableT, FieldT

from redisbus import Bus
from tests.conftest import settings as bus_settings
from tests.support.servers import Server

FIELDS = ["f", "t", "b", "s", "k", "p", "d", "x", "r", "u", "a", "n", "g", "i", "c", "h", "zz"]
NAMES = ["reader", "writer", "nobody", "reader\nwriter", ""]
_turn = itertools.count()

value = st.one_of(
    st.sampled_from(["", "0", "1", "2", "7", "-1", "abc", "inf", "nan", "1e400", "0x10", "1-1"]),
    st.sampled_from(NAMES),
    st.sampled_from(["message", "control", "outcome", "request", "auto_reply"]),
    st.text(max_size=40),
    st.binary(max_size=24),  # not UTF-8, often
    st.just("x" * 40_000),  # huge: over the body limit
)
entry = st.dictionaries(st.sampled_from(FIELDS), value, max_size=10).map(
    lambda d: {**d, "t": d.get("t", "reader")} if len(d) % 3 else d
)


def counts_hold(raw: Any, ch: Any) -> None:
    pending = {g["name"]: int(g["pending"]) for g in raw.xinfo_groups(ch.keys.stream)}
    for name, n in raw.hgetall(ch.keys.inbox).items():
        assert int(n) >= max(0, pending.get(name, 0)), (name, n, pending)


@pytest.mark.parametrize("signing", ["off", "on"])
def test_no_raw_entry_stops_a_reader(redis7: Server, signing: str) -> None:
    redis7.client().flushall()
    extra: dict[str, Any] = {"signing_keys": {"k1": "fleet"}} if signing == "on" else {}
    bus = Bus.from_url(redis7.url, settings=bus_settings(**extra))
    raw = redis7.client()
    raw_bytes = redis.Redis(port=redis7.port)  # writes bytes as they are

    @settings(
        max_examples=int(os.environ.get("REDISBUS_FUZZ_EXAMPLES", "25")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(entry, min_size=1, max_size=3), st.sampled_from(["wait", "read", "list"]))
    def one(entries: list[dict[FieldT, EncodableT]], path: str) -> None:
        ch = bus.channel(f"fuzz-{next(_turn)}", pair_rate_burst=0, sender_rate_burst=0)
        reader, writer = ch.join("reader"), ch.join("writer")
        raw_ids = [
            cast(bytes, raw_bytes.xadd(ch.keys.stream, dict(e) if e else {"zz": ""})).decode()
            for e in entries
        ]

        # every reading path, in the order the case chose, then the others
        for step in [path, "list", "read", "wait"]:
            if step == "list":
                reader.list(filter_by="all")
            elif step == "read":
                got = reader.read()
                if got:
                    reader.mark_done(got)
            else:
                res = reader.wait(timeout=0.05)
                if res.messages:
                    reader.mark_done(
                        [m for m in res.messages if m.type != "control"] or res.messages
                    )
        ch.dead_letters()
        ch.sweep()

        # the genuine message after them always arrives
        sent = writer.send("reader", "genuine")
        got_ids: list[str] = []
        for _ in range(5):
            res = reader.wait(timeout=2)
            got_ids += [m.id for m in res.messages]
            if sent.id in got_ids:
                break
        assert sent.id in got_ids
        reader.flush()
        if signing == "on":  # nothing a raw write made was handed over, counts hold
            assert not set(raw_ids) & set(got_ids)
            counts_hold(raw, ch)
        # (signing off, a raw write that looks like a message is one, and nobody counted it
        # in: the trust model says raw writers corrupt counters then; repair fixes them)

    try:
        one()
    finally:
        bus.close()
