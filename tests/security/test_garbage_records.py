"""Garbage in the records a reader parses, not only in the stream (docs/security.md, "no bytes
written to a stream by anyone can stop an agent"): a raw write into the dead-letter stream or
into a member's record in the members hash never makes ``ch.dead_letters()``, ``ch.tree()``,
``ch.members()`` or ``agent.agents()`` raise, and never hides a genuine dead letter or member.
A malformed dead letter is passed over (warned once); ``ch.replay()`` of one is a typed error.
A member whose record is unreadable is listed with what is known: its name and its status."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbus import Bus, InvalidInput
from redisbus._filters import check_entry_id
from tests.conftest import settings as bus_settings

FAST: dict[str, Any] = {"pair_rate_burst": 0, "sender_rate_burst": 0, "inbox_cap": 10**6}
HAMMER = settings(
    max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

# the fields a dead letter carries (sweep.lua's dead_letter) and a message's, and others
DLQ_FIELDS = ["o", "a", "n", "w", "dead_ms", "f", "t", "b", "s", "k", "p", "d", "x", "r", "i"]
DLQ_FIELDS += ["c", "og", "on", "u", "junk"]
junk_value = st.one_of(
    st.sampled_from(["", "0", "1", "-1", "abc", "not-an-id", "1-1", "0-0", "inf", "nan", "1e400"]),
    st.sampled_from(["99999999999999999999-0", "18446744073709551615-0", "253402300800000-0"]),
    st.sampled_from(["w", "boss", "nobody", "w\nboss", "1" * 25, "99999999999999999"]),
    st.text(max_size=30),
    st.binary(max_size=16),
)
junk_entry = st.dictionaries(st.sampled_from(DLQ_FIELDS), junk_value, min_size=1, max_size=8)

json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=6,
)
record_key = st.sampled_from(["id", "parent", "depth", "host", "description", "skills", "x"])
junk_record = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=24),
    json_value.map(json.dumps),
    st.dictionaries(record_key, json_value, max_size=6).map(json.dumps),
)


def dead_channel(bus: Any, name: str, n: int = 2) -> tuple[Any, Any, list[str]]:
    """A channel with ``n`` genuine dead letters (of member ``w``), and their original ids."""
    ch = bus.channel(name, lease_s=0.05, max_deliveries=1, **FAST)
    boss, w = ch.join("boss"), ch.join("w")
    ids = [boss.send("w", f"poison {i}").id for i in range(n)]
    got: list[str] = []
    while len(got) < n:  # taken, never marked done
        got += [m.id for m in w.wait(timeout=2).messages]
    assert sorted(got) == sorted(ids)
    time.sleep(0.12)  # past the lease
    dead = 0
    for _ in range(20):
        dead += ch.sweep().dead_lettered
        if dead >= n:
            break
        time.sleep(0.05)
    assert dead == n
    assert sorted(d.original_id for d in ch.dead_letters()) == sorted(ids)
    return ch, boss, ids


def well_formed(d: Any) -> None:
    check_entry_id(d.original_id)
    check_entry_id(d.id)
    assert d.recipient and d.deliveries >= 0 and d.message.id == d.original_id


@pytest.mark.parametrize(
    "fields",
    [
        {"o": "not-an-id", "t": "b"},  # the tester's repro
        {"junk": "x"},  # was listed as a dead letter of 0-0
        {"o": "1-1", "a": "w", "n": "many", "f": "boss"},
        {"o": "1-1", "n": "1", "f": "boss"},  # no recipient
        {"o": "99999999999999999-0", "a": "w", "n": "1", "f": "boss"},  # past datetime's range
        {"o": "1-1", "a": "w", "n": "1", "f": "boss", "dead_ms": "soon"},
        {"o": "1-1", "a": "w", "n": "1", "f": "boss", "dead_ms": "9" * 19},
        {"o": "1-1", "a": "w", "n": "1", "f": "boss", "p": "urgent"},
        {"o": "1-1", "a": "w", "n": "1", "f": "boss", "on": "yesterday"},
    ],
)
def test_a_malformed_dead_letter_is_passed_over(
    bus: Any, chan_name: str, fields: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    ch, _, ids = dead_channel(bus, chan_name)
    bad = bus.redis.xadd(ch.keys.dlq, fields)
    for _ in range(2):
        letters = ch.dead_letters()
        assert sorted(d.original_id for d in letters) == sorted(ids)
        assert bad not in [d.id for d in letters]
        for d in letters:
            well_formed(d)
    warned = [r for r in caplog.records if bad in r.getMessage()]
    assert len(warned) == 1, warned  # said once, not on every listing
    assert warned[0].levelname == "WARNING"


@pytest.mark.parametrize(
    "fields",
    [
        {"o": "not-an-id", "a": "w", "n": "1", "f": "boss", "t": "w"},
        {"a": "w", "f": "boss", "b": "x"},
        {"o": "1-1", "a": "w", "n": "1", "p": "urgent", "f": "boss"},
        {"o": "1-1", "n": "1", "f": "boss"},
        {"junk": "x"},
    ],
)
def test_replaying_a_malformed_dead_letter_is_a_typed_error(
    bus: Any, chan_name: str, fields: dict[str, str]
) -> None:
    ch, _, ids = dead_channel(bus, chan_name, n=1)
    bad = bus.redis.xadd(ch.keys.dlq, fields)
    length = ch.length()
    with pytest.raises(InvalidInput):
        ch.replay(bad)
    assert ch.length() == length  # nothing was written to the stream
    (good,) = ch.dead_letters()
    assert ch.replay(good.id)  # a genuine one still replays
    assert ch.dead_letters() == []


@HAMMER
@given(junk=st.lists(junk_entry, min_size=1, max_size=4))
def test_no_raw_dead_letter_entry_stops_the_listing(bus: Any, junk: list[dict[str, Any]]) -> None:
    ch, ids = _dlq_state(bus)
    raw = bus.redis
    written = [raw.xadd(ch.keys.dlq, f) for f in junk]
    try:
        letters = ch.dead_letters(limit=10_000)
        listed = [d.original_id for d in letters]
        assert set(ids) <= set(listed), (ids, listed)
        for d in letters:
            well_formed(d)
    finally:
        raw.xdel(ch.keys.dlq, *written)


_state: dict[int, tuple[Any, list[str]]] = {}


def _dlq_state(bus: Any) -> tuple[Any, list[str]]:
    """One channel with genuine dead letters per bus (hypothesis calls the test body many times
    with the same function-scoped fixture)."""
    key = id(bus)
    if key not in _state:
        _state.clear()
        ch, _, ids = dead_channel(bus, f"ch-dlq-{key:x}")
        _state[key] = (ch, ids)
    return _state[key]


# -- members ------------------------------------------------------------------------------------


def family(bus: Any, name: str) -> tuple[Any, dict[str, Any]]:
    ch = bus.channel(name, routing="open", **FAST)
    boss = ch.join("boss", description="the boss", skills=["lead"])
    handles = {"boss": boss, "w": ch.join("w", "boss", description="a worker")}
    handles["x"] = ch.join("x", "boss")
    return ch, handles


@pytest.mark.parametrize(
    "record", ["{not json", "[1, 2]", "null", "7", '"text"', '{"depth": "deep", "skills": 5}']
)
def test_a_member_with_an_unreadable_record_is_listed_with_what_is_known(
    bus: Any, chan_name: str, record: str, caplog: pytest.LogCaptureFixture
) -> None:
    ch, h = family(bus, chan_name)
    bus.redis.hset(ch.keys.members, "w", record)
    bus.redis.hset(ch.keys.status, "w", "completed")
    for _ in range(2):
        tree = ch.tree()
        assert sorted(m.name for m in tree) == ["boss", "w", "x"]
        w = ch.members()["w"]
        assert w.status == "completed"
        assert (w.host, w.description, w.skills, w.depth) == ("", "", (), 0)
        boss = ch.members()["boss"]
        assert (boss.description, boss.skills) == ("the boss", ("lead",))
        assert "w" in [m.name for m in h["boss"].agents().family]
        assert [m.name for m in h["boss"].discover("worker")] in ([], ["w"])
        assert "w" in [m.name for m in h["x"].agents().family]
    warned = [r.getMessage() for r in caplog.records if "record of member" in r.getMessage()]
    assert len(warned) == 1 and "'w'" in warned[0], warned  # once, and of w's record only
    ch.join("y", "boss")  # another member still joins
    assert "y" in ch.members()


@HAMMER
@given(records=st.lists(junk_record, min_size=1, max_size=3))
def test_no_raw_member_record_stops_a_roster_read(bus: Any, records: list[Any]) -> None:
    ch, h = _family_state(bus)
    raw = bus.redis
    kept = raw.hget(ch.keys.members, "w")
    try:
        for rec in records:
            raw.hset(ch.keys.members, "w", rec)
            assert sorted(m.name for m in ch.tree()) == ["boss", "w", "x"]
            members = ch.members()
            assert members["w"].status == "running"
            assert isinstance(members["w"].description, str)
            assert all(isinstance(s, str) for s in members["w"].skills)
            assert all(isinstance(m.depth, int) for m in members.values())
            for m in members.values():
                json.dumps(m.as_dict())
            assert "w" in [m.name for m in h["x"].agents().family]
            h["boss"].agents()
            h["boss"].discover("worker")
    finally:
        raw.hset(ch.keys.members, "w", kept)


_fam: dict[int, tuple[Any, dict[str, Any]]] = {}


def _family_state(bus: Any) -> tuple[Any, dict[str, Any]]:
    key = id(bus)
    if key not in _fam:
        _fam.clear()
        _fam[key] = family(bus, f"ch-fam-{key:x}")
    return _fam[key]


@pytest.mark.parametrize("record", ["{not json", "[1, 2]", "null", '{"id": 5, "depth": 0}'])
def test_joining_as_or_under_a_member_with_a_junk_record_says_so(
    bus: Any, chan_name: str, record: str
) -> None:
    """Joining as (or under) a member whose record a raw write replaced: InvalidInput that
    says what to do, and nothing else changes."""
    ch, _ = family(bus, chan_name)
    bus.redis.hset(ch.keys.members, "w", record)
    before = bus.redis.hgetall(ch.keys.members)
    with pytest.raises(InvalidInput, match="unreadable"):
        ch.join("w")
    with pytest.raises(InvalidInput, match="unreadable"):
        ch.join("kid", "w")
    assert bus.redis.hgetall(ch.keys.members) == before
    assert {"boss", "w", "x"} <= set(ch.members())


def test_the_cli_lists_dead_letters_and_the_tree_past_garbage(redis_url: str) -> None:
    """``redisbus dlq list``, ``dlq replay`` and ``tree`` with a raw dead letter and an
    unreadable member record: they answer, and a refused replay is one line, no traceback."""
    from tests.cli.test_cli import BIN, clean_env

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN, *args], capture_output=True, text=True, timeout=60, env=clean_env(redis_url)
        )

    bus = Bus.from_url(redis_url, settings=bus_settings())
    try:
        ch, _, ids = dead_channel(bus, "garbage-cli", n=1)
        raw = bus.redis
        bad = raw.xadd(ch.keys.dlq, {"o": "not-an-id", "t": "b", "a": "w", "f": "boss"})
        raw.xadd(ch.keys.dlq, {"junk": "x"})
        raw.hset(ch.keys.members, "w", "{not json")
    finally:
        bus.close()
    listed = cli("dlq", "list", "garbage-cli", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [d["original_id"] for d in json.loads(listed.stdout)] == ids
    refused = cli("dlq", "replay", "garbage-cli", bad)
    assert refused.returncode != 0 and "malformed" in refused.stderr + refused.stdout
    assert "Traceback" not in refused.stderr
    tree = cli("agents", "garbage-cli", "--json")  # (the tree command)
    assert tree.returncode == 0, tree.stderr
    assert sorted(m["name"] for m in json.loads(tree.stdout)) == ["boss", "w"]
