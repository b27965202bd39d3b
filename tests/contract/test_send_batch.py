"""send.lua checks and appends several messages in one call (send_many, and the async face's
coalesced sends). Whatever the batch, the outcome must be exactly that of the same sends made
one by one: the same acceptances and refusals, the same stream, the same counters."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, cast

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from redisbus import AsyncBus, Bus, InboxFull, Receipt, RedisbusError
from redisbus.metrics import BusMetrics
from redisbus.testing import memory_bus
from tests.support.helpers import stream_inbox_counts
from tests.support.servers import Server

#: Small limits, so that a batch runs into every one of them; refills too slow to matter. A
#: pair's burst is below the inbox cap (so a pair's bucket runs dry before the recipient's inbox
#: fills), and boss's inbox starts one short of full (so it fills first).
TIGHT: dict[str, Any] = {
    "routing": "family",
    "inbox_cap": 3,
    "pair_rate_burst": 2,
    "pair_rate_per_s": 0.001,
    "sender_rate_burst": 3,
    "sender_rate_per_s": 0.001,
    "max_messages": 12,
}

TARGETS = st.sampled_from(["kid", "sib", "parent", "all", "nobody", "mid", ("kid", "sib")])
ITEM = st.fixed_dictionaries(
    {
        "to": TARGETS,
        "body": st.sampled_from(["hi", "x" * 40, ""]),
        "idempotency_key": st.sampled_from([None, None, "k1", "k2"]),
        "type": st.sampled_from(["message", "request", "auto_reply"]),
        "subject": st.sampled_from(["", "status", "né à Paris"]),
    }
)
_names = itertools.count()


def _family(bus: Bus, name: str, routing: str = "family", siblings: bool = True) -> Any:
    """boss -> mid -> kid; sib is mid's sibling under boss, and has sent boss two messages.
    Returns ``mid``."""
    ch = bus.channel(name, **{**TIGHT, "routing": routing}, siblings=siblings)
    boss = ch.join("boss")
    me = ch.join("mid", parent=boss.name)
    sib = ch.join("sib", parent=boss.name)
    ch.join("kid", parent=me.name)
    sib.send("boss", "one")
    sib.send("boss", "two")
    return me


def _outcome(result: Any) -> list[tuple[str, str, str]]:
    receipts = result if isinstance(result, list) else [result]
    return [(r.to, r.status, r.error.code if r.error else "") for r in receipts]


def _normalize(to: Any) -> Any:
    return list(to) if isinstance(to, tuple) else to


def _state(r: redis.Redis, ch: Any) -> tuple[Any, ...]:
    k = ch.keys
    # the client decodes replies (decode_responses=True)
    stream = cast(list[tuple[str, dict[str, str]]], r.xrange(k.stream))
    entries = [{**f, "t": f.get("t")} for _, f in stream]
    # the buckets' whole tokens (the fraction is refill, which depends on the clock)
    rate: dict[str, int | tuple[str, str] | str] = {}
    for field, value in cast(dict[str, str], r.hgetall(k.rate)).items():
        if field[:1] in ("p", "s"):
            rate[field] = int(float(value.split(" ")[0]))
        elif field[:1] == "d":
            turns, _, last = value.split(" ", 2)
            rate[field] = (turns, last)
        else:
            rate[field] = value
    return entries, r.hgetall(k.inbox), rate, stream_inbox_counts(r, ch)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    items=st.lists(ITEM, min_size=1, max_size=25),
    routing=st.sampled_from(["family", "open"]),
    siblings=st.booleans(),
)
def test_send_many_equals_the_same_sends_one_by_one(
    redis7: Server, items: list[dict[str, Any]], routing: str, siblings: bool
) -> None:
    # A plain message (one member named) reaches send.lua three ways: in a batch (after the
    # batch read up front what all its messages name), alone, and as a list of one name. The
    # same random sends go out all three ways, on three identical families, and must accept,
    # refuse and count alike (routing included: without siblings, "sib" is out of mid's reach
    # on a family channel).
    r = redis.Redis(port=redis7.port, decode_responses=True)
    with Bus.from_url(redis7.url) as bus:
        # given: three identical families
        n = next(_names)
        batch_me = _family(bus, f"batch-{n}", routing, siblings)
        single_me = _family(bus, f"single-{n}", routing, siblings)
        general_me = _family(bus, f"general-{n}", routing, siblings)
        sends = [dict(i, to=_normalize(i["to"])) for i in items]
        # when: one sends the items as one batch, the others one by one, the last naming each
        # plain message's recipient in a list of one
        batched = [_outcome(x) for x in batch_me.send_many(sends)]
        single = _one_by_one(single_me, sends)
        general = _one_by_one(general_me, [_as_list(s) for s in sends])
        # then: the same outcome per item, and the same stream and counters
        for b, s, g in zip(batched, single, general, strict=True):
            if isinstance(g, str):  # the whole send was refused: every receipt says why
                assert b and all(x[1:] == ("rejected", g) for x in b), (sends, batched, general)
            else:
                assert b == g, (sends, batched, general)
            assert s == g or (isinstance(s, str) and b == [(b[0][0], "rejected", s)]), (
                sends,
                single,
                general,
            )
        assert _state(r, batch_me.channel) == _state(r, general_me.channel)
        assert _state(r, single_me.channel) == _state(r, general_me.channel)


def _as_list(item: dict[str, Any]) -> dict[str, Any]:
    """A plain message's recipient named in a list of one (refusals per recipient)."""
    to = item["to"]
    plain = isinstance(to, str) and to not in ("all", "parent")
    return dict(item, to=[to]) if plain and not item.get("idempotency_key") else item


def _one_by_one(me: Any, sends: list[dict[str, Any]]) -> list[Any]:
    out: list[Any] = []
    for item in sends:
        try:
            out.append(_outcome(me.send(**item)))
        except RedisbusError as e:  # what a batch reports as rejected receipts
            out.append(e.code)
    return out


def test_a_batch_larger_than_one_call_keeps_order_and_limits(redis7: Server) -> None:
    with Bus.from_url(redis7.url) as bus:
        ch = bus.channel(
            "batch-large", routing="open", inbox_cap=250, pair_rate_burst=0, sender_rate_burst=0
        )
        a, b = ch.join("a"), ch.join("b")
        r = redis.Redis(port=redis7.port)
        r.config_resetstat()
        # when: 300 messages go out in one send_many
        # one name each: one Receipt each
        out = cast(list[Receipt], a.send_many([("b", f"m{i}") for i in range(300)]))
        verb = f"cmdstat_{bus._io.verb.lower()}"  # fcall, or evalsha
        assert r.info("commandstats")[verb]["calls"] == 3  # 100 per script call
        # then: the first 250 fill the inbox, in order; the rest are refused as full
        assert [r.status for r in out[:250]] == ["queued"] * 250
        assert {type(r.error) for r in out[250:]} == {InboxFull}
        assert [m.body for m in b.read(limit=300)] == [f"m{i}" for i in range(250)]
        assert ch.counts()["b"] == 250


async def test_concurrent_async_sends_are_merged_and_keep_every_limit(redis7: Server) -> None:
    async with AsyncBus.from_url(redis7.url) as bus:
        # given: 40 agents and one recipient that takes 25
        ch = await bus.channel(
            "batch-async", routing="open", inbox_cap=25, pair_rate_burst=0, sender_rate_burst=0
        )
        b = await ch.join("b")
        senders = [await ch.join(f"s{i}") for i in range(40)]
        r = redis.Redis(port=redis7.port)
        r.config_resetstat()
        # when: all send at once
        results = await asyncio.gather(
            *(s.send("b", s.name) for s in senders), return_exceptions=True
        )
        calls = r.info("commandstats")[f"cmdstat_{bus._io.verb.lower()}"]["calls"]
        # then: they went out in far fewer script calls than sends, and the cap held exactly
        assert calls < 10, calls
        ok = [x for x in results if not isinstance(x, BaseException)]
        refused = [x for x in results if isinstance(x, BaseException)]
        assert len(ok) == 25 and all(isinstance(x, InboxFull) for x in refused)
        assert [x.to for x in ok] == ["b"] * 25
        got = sorted(m.body for m in await b.read(limit=100))
        assert got == sorted(f"s{i}" for i in range(25))  # the first 25, in gather order
        assert (await ch.counts())["b"] == 25


async def test_concurrent_async_sends_to_different_agents_are_merged_with_their_doorbells(
    redis7: Server,
) -> None:
    async with AsyncBus.from_url(redis7.url) as bus:
        # given: 30 pairs of agents on one channel
        ch = await bus.channel("batch-bells", routing="open", pair_rate_burst=0)
        senders = [await ch.join(f"s{i}") for i in range(30)]
        targets = [await ch.join(f"t{i}") for i in range(30)]
        r = redis.Redis(port=redis7.port)
        r.config_resetstat()
        # when: each sender sends to its own recipient, all at once
        out = await asyncio.gather(*(s.send(f"t{i}", s.name) for i, s in enumerate(senders)))
        calls = r.info("commandstats")[f"cmdstat_{bus._io.verb.lower()}"]["calls"]
        # then: they went out merged though each names another recipient's doorbell (calls
        # merged only when their KEYS matched would be 30), and each recipient was rung
        assert calls < 10, calls
        assert [x.to for x in out] == [f"t{i}" for i in range(30)]
        for i, t in enumerate(targets):
            got = await t.wait(timeout=1)
            assert [m.body for m in got.messages] == [f"s{i}"]


def test_the_test_double_runs_batches_too() -> None:
    with memory_bus() as bus:
        ch = bus.channel(
            "batch-memory", routing="open", inbox_cap=120, pair_rate_burst=0, sender_rate_burst=0
        )
        a, b = ch.join("a"), ch.join("b")
        out = cast(list[Receipt], a.send_many([("b", f"m{i}") for i in range(150)]))
        assert [r.status for r in out].count("queued") == 120
        assert len(b.read(limit=200)) == 120


# --- a broadcast on a channel of dozens: every hash read whole, every recipient checked ----


@pytest.fixture
def private(tmp_path: Any) -> Any:
    """A server of this test's own, so its command counts are this test's alone."""
    from tests.support.servers import start_server

    srv = start_server("redis7", tmp_path)
    yield srv
    srv.stop()


def _big_channel(bus: Bus, name: str) -> tuple[Any, dict[str, Any]]:
    """40 members and a sender: a00-a09 with full inboxes, a10-a14 with the sender's pair
    bucket spent (their inboxes empty; a direct message to them is refused, a broadcast is
    not), the rest free."""
    ch = bus.channel(
        name,
        routing="open",
        inbox_cap=3,
        pair_rate_burst=3,
        pair_rate_per_s=0.001,
        sender_rate_burst=0,
    )
    s, t = ch.join("s"), ch.join("t")
    agents = {f"a{i:02}": ch.join(f"a{i:02}") for i in range(40)}
    for i in range(10):
        for _ in range(3):
            t.send(f"a{i:02}", "fill")
    for i in range(10, 15):
        for _ in range(3):
            s.send(f"a{i:02}", "spend")
        agents[f"a{i:02}"].mark_done(agents[f"a{i:02}"].read(limit=10))
    return ch, {"s": s, "t": t, **agents}


def test_a_broadcast_to_dozens_checks_each_recipient(private: Server) -> None:
    # given: a channel of 42 whose members are full, rate-limited or free
    r = private.client()
    with Bus.from_url(private.url) as bus:
        ch, members = _big_channel(bus, "bc-big")
        before = ch.counts()
        buckets = {f: v for f, v in r.hgetall(ch.keys.rate).items() if str(f).startswith("p\n")}
        r.config_resetstat()
        # when: the sender broadcasts
        receipts = members["s"].send("all", "to everyone")
        stats = r.info("commandstats")
        # then: each recipient got exactly the outcome its own limits give; a broadcast is the
        # sender's budget, so the pair buckets it spent on a10-a14 do not refuse it, and it
        # neither reads nor writes a bucket per pair
        got = {rc.to: (rc.status, rc.error.code if rc.error else "") for rc in receipts}
        full = {f"a{i:02}" for i in range(10)}
        assert set(got) == set(members) - {"s"}
        for name, outcome in got.items():
            if name in full:
                assert outcome == ("rejected", "inbox_full"), name
            else:
                assert outcome == ("queued", ""), name
        after_buckets = {
            f: v for f, v in r.hgetall(ch.keys.rate).items() if str(f).startswith("p\n")
        }
        assert after_buckets == buckets and len(buckets) == 5 + 10  # s -> a10-a14, t -> a00-a09
        after = ch.counts()
        assert {n: after.get(n, 0) - before.get(n, 0) for n in got} == {
            n: int(got[n][0] == "queued") for n in got
        }
        assert {n: c for n, c in after.items() if c} == stream_inbox_counts(r, ch)
        # and it read the members' hashes whole (one HGETALL each: parents, status, inbox and
        # the rate hash) instead of naming a hundred fields in HMGETs, each a scan of a hash
        # Redis keeps as a list
        assert stats["cmdstat_hgetall"]["calls"] == 4
        assert stats.get("cmdstat_hmget", {"calls": 0})["calls"] <= 2  # the sender alone
        # and the rate hash is a hash table (its '#table' field), not a list to scan
        assert r.object("encoding", ch.keys.rate) == "hashtable"
        # and so is the inbox hash of a channel this size; it holds the members' depths and
        # nothing else
        assert r.object("encoding", ch.keys.inbox) == "hashtable"
        assert set(r.hkeys(ch.keys.inbox)) <= set(members)


@pytest.mark.parametrize("members", [12, 40])
def test_past_16_members_the_inbox_depths_are_a_hash_table_holding_just_the_depths(
    private: Server, members: int
) -> None:
    # given: a channel of a sender and `members` others (Redis keeps a hash of fewer than 512
    # short fields as a list, where every field a command names is a scan of the list)
    r = private.client()
    with Bus.from_url(private.url) as bus:
        ch = bus.channel(f"bc-table-{members}", routing="open", inbox_cap=1000)
        s = ch.join("s")
        names = [f"m{i:02}" for i in range(members)]
        for name in names:
            ch.join(name)
        # then: past 16 members, joining made the inbox depths a hash table (each depth a
        # send, read mark or broadcast writes is one lookup), and so did the statuses every
        # wake-up reads and writes; a few stay lists
        table = members + 1 > 16
        assert r.object("encoding", ch.keys.inbox) == ("hashtable" if table else "listpack")
        assert r.object("encoding", ch.keys.status) == ("hashtable" if table else "listpack")
        statuses = r.hgetall(ch.keys.status)
        assert statuses == {n: "running" for n in ["s", *names]}
        # when: the sender sends one message, then broadcasts
        s.send("m00", "one before")
        receipts = s.send("all", "to everyone")
        # then: every member was counted once more, and the hash holds exactly those depths
        assert [rc.status for rc in receipts] == ["queued"] * members
        depths = {"s": 0} | {name: 1 for name in names} | {"m00": 2}
        assert r.hgetall(ch.keys.inbox) == {k: str(v) for k, v in depths.items()}
        assert ch.counts() == depths and ch.repair() == {}
        assert r.object("encoding", ch.keys.inbox) == ("hashtable" if table else "listpack")
        # and a member who joins again, or reads and marks done, changes only its own depth
        ch.join("m01")
        bus.channel(ch.name).join("m01").mark_done(ch.join("m01").read(limit=5))
        assert ch.counts() == depths | {"m01": 0}


@pytest.mark.parametrize("face", ["sync", "async"])
def test_a_batch_counts_its_messages_by_type_and_its_refusals_per_recipient(
    redis7: Server, face: str
) -> None:
    # send_many updates the sent counter once per message type, with the count
    registry = CollectorRegistry()
    items: list[Any] = [
        ("b", "one"),
        {"to": "b", "body": "two", "type": "request"},
        ("b", "refused: b's inbox holds 2"),
        {"to": ["b", "c"], "body": "b refused, c accepted"},
        {"to": "nobody", "body": "refused: no such agent"},
        ("c", "three"),
    ]

    async def run_async() -> list[Any]:
        async with AsyncBus.from_url(redis7.url, metrics=BusMetrics(registry, host="t")) as bus:
            ch = await bus.channel(f"batch-metrics-{face}", routing="open", inbox_cap=2)
            a = await ch.join("a")
            await ch.join("b")
            await ch.join("c")
            return await a.send_many(items)

    if face == "async":
        out = asyncio.run(run_async())
    else:
        with Bus.from_url(redis7.url, metrics=BusMetrics(registry, host="t")) as bus:
            ch = bus.channel(f"batch-metrics-{face}", routing="open", inbox_cap=2)
            a = ch.join("a")
            ch.join("b")
            ch.join("c")
            out = a.send_many(items)
    assert [r.status for r in (out[0], out[1], out[2], *out[3], out[5])] == [
        "queued",
        "queued",
        "rejected",
        "rejected",
        "queued",
        "queued",
    ]

    def count(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {**labels, "host": "t"})

    assert count("redisbus_messages_sent_total", type="message") == 3
    assert count("redisbus_messages_sent_total", type="request") == 1
    assert count("redisbus_send_rejected_total", reason="inbox_full") == 2
    assert count("redisbus_send_rejected_total", reason="unknown_agent") == 1
