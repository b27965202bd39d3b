"""A script that rings doorbells is given them in KEYS: a call that lacks some writes nothing
and says which, and the bus makes it again with them. Checked with members the caller could
not know (joined on another bus, named by id, a broadcast's, a cascade's) and by raw calls that
leave doorbells out at random."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from redisbus import Bus, BusSettings, RedisbusError
from redisbus import _bindings as bind
from redisbus import _core as core
from redisbus._keys import doorbells
from tests.support.servers import Server, start_server

OPEN: dict[str, Any] = {
    "routing": "family",
    "pair_rate_burst": 0,
    "sender_rate_burst": 0,
    "inbox_cap": 100_000,
}


def _state(r: redis.Redis, ch: Any, names: list[str]) -> tuple[Any, ...]:
    k = ch.keys
    return (
        r.xlen(k.stream),
        r.hgetall(k.inbox),
        {f: v for f, v in r.hgetall(k.rate).items() if f != "#lim"},
        r.hgetall(k.idem),
        [(r.lrange(k.bell(n), 0, -1), r.llen(k.wakeup(n))) for n in names],
    )


@contextmanager
def _buses(server: Server) -> Iterator[tuple[Bus, Bus]]:
    """Two buses on ``server``: one a sender's, the other's members joined where it cannot see."""
    with (
        Bus.from_url(server.url, settings=BusSettings(heartbeat_s=600)) as here,
        Bus.from_url(server.url, settings=BusSettings(heartbeat_s=600)) as there,
    ):
        yield here, there


def test_a_broadcast_reaches_members_joined_on_another_bus_since_it_last_met_them(
    redis7: Server,
) -> None:
    # given: a sender on one bus, and members it never met, joined on another bus
    r = redis7.client()
    with _buses(redis7) as (here, there):
        ch = here.channel("dk-bc", **{**OPEN, "routing": "open"})
        s = ch.join("s")
        theirs = {n: there.channel("dk-bc").join(n) for n in ("a", "b", "c")}
        for turn in range(3):
            before = r.xlen(ch.keys.stream)
            # when: it broadcasts (the second time, after one more joined over there)
            got = s.send("all", f"to everyone {turn}")
            # then: every member got it, from one entry: the call that lacked their doorbells
            # wrote nothing
            assert sorted(x.to for x in got) == sorted(theirs)
            assert r.xlen(ch.keys.stream) == before + 1
            for agent in theirs.values():
                (m,) = agent.wait(timeout=2).messages
                assert m.body == f"to everyone {turn}"
                agent.mark_done(m)
            new = f"late{turn}"
            theirs[new] = there.channel("dk-bc").join(new)
        # and a message to an agent id (a name the sender's bus could not map) rings it too
        late = theirs["late2"]
        assert s.send(late.id, "by id").to == "late2"
        assert [m.body for m in late.wait(timeout=2).messages] == ["by id"]


def test_a_cancel_wakes_descendants_joined_on_another_bus(redis7: Server) -> None:
    # given: a parent whose child's subtree joined on another bus
    with _buses(redis7) as (here, there):
        ch = here.channel("dk-cancel", **OPEN)
        boss = ch.join("boss")
        other = there.channel("dk-cancel")
        kid = other.join("kid", parent="boss")
        grandkids = [other.join(f"g{i}", parent="kid") for i in range(3)]
        # when: the parent cancels the child
        boss.cancel("kid", "stop")
        # then: the child and every descendant is woken by the control message
        for agent in (kid, *grandkids):
            got = agent.wait(timeout=2)
            assert got.kind == "cancelled", (agent.name, got)


def test_a_call_that_keeps_lacking_doorbells_is_a_clear_error_and_writes_nothing(
    redis7: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given: a bus whose every remade call would still lack the doorbells (as when members
    # join between each try)
    r = redis7.client()
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as here:
        ch = here.channel("dk-stale", **{**OPEN, "routing": "open"})
        s = ch.join("s")
        with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as there:
            there.channel("dk-stale").join("far")
        before = _state(r, ch, ["far"])
        monkeypatch.setattr("redisbus._sync.io.with_bells", lambda call, names: call)
        # when: it broadcasts
        with pytest.raises(RedisbusError, match="kept asking for more doorbells"):
            s.send("all", "never")
        # then: nothing was written
        assert _state(r, ch, ["far"]) == before


NAMES = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def raw(redis7: Server) -> Any:
    r = redis7.client()
    bus = Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600))
    ch = bus.channel("dk-raw", **OPEN)
    agents = {n: ch.join(n, parent="a" if n != "a" else None) for n in NAMES}
    yield bus, ch, agents, r
    bus.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sender=st.sampled_from(NAMES),
    to=st.one_of(
        st.just("all"),
        st.sampled_from([*NAMES, "parent", "id:b", "nobody"]),
        st.lists(st.sampled_from([*NAMES, "parent", "id:c"]), min_size=1, max_size=4),
    ),
    given_bells=st.sets(st.sampled_from(NAMES)),
    batch=st.booleans(),
    known=st.sampled_from(["", "known", "known\n", "a", "\xff"]),
)
def test_a_raw_call_without_a_doorbell_it_needs_writes_nothing_and_names_what_it_lacks(
    raw: Any, sender: str, to: Any, given_bells: set[str], batch: bool, known: str
) -> None:
    bus, ch, agents, r = raw
    ids = {f"id:{n}": agents[n].id for n in NAMES}
    to = [ids.get(t, t) for t in to] if isinstance(to, list) else ids.get(to, to)
    plan = core.plan_send(sender, to, "raw", parent=agents[sender].parent)
    argv = list(plan.argv)
    if argv[1] == "all":  # a broadcast's recipients field: "" or "known", or junk an attacker
        argv[2] = known  # wrote (read as "")
    keys = [*bind.send_keys(ch.keys), *doorbells(ch.keys.stream, sorted(given_bells))]
    call = bind.send(keys, [argv, argv] if batch else [argv])
    before = _state(r, ch, NAMES)
    reply = r.execute_command(*_command(bus, call))
    names = bind.unrung(call, reply)
    event("lacked doorbells" if names is not None else f"ran: {type(reply).__name__}")
    if names is not None:
        # it lacked doorbells: it wrote nothing, and named only agents it lacked (a broadcast
        # "known" never lacks any: it goes to those it was given)
        assert _state(r, ch, NAMES) == before
        assert names and not set(names) & given_bells and set(names) <= set(NAMES)
        assert not (to == "all" and known == "known"), names
    else:
        # it had them all: what it wrote rang only agents it was given
        after = _state(r, ch, NAMES)
        for n, (b0, b1) in zip(NAMES, zip(before[-1], after[-1], strict=True), strict=True):
            if b0 != b1:
                assert n in given_bells, (n, to)
        if to == "all" and isinstance(reply, list) and reply and reply[0] == 1:
            # a broadcast "known" went to members it was given only (the others it may reach)
            given = given_bells if known == "known" else set(NAMES)
            assert set(reply[2]) <= given - {sender}, (reply, given_bells, known)
        for agent in agents.values():  # drain, so each example starts from empty bells
            taken = agent.wait(timeout=0).messages
            if taken:
                agent.mark_done(taken)


def _command(bus: Bus, call: bind.Call) -> tuple[Any, ...]:
    """The FCALL (or EVALSHA) of ``call``, loaded, as the bus would send it."""
    return bus._io.command(*call)


def test_a_send_by_agent_id_asks_for_the_doorbell_once(tmp_path: Any) -> None:
    # given: a server of this test's own (its command counts are this test's alone)
    srv = start_server("redis7", tmp_path)
    try:
        r = srv.client()
        with Bus.from_url(srv.url, settings=BusSettings(heartbeat_s=600)) as bus:
            ch = bus.channel("dk-id", **{**OPEN, "routing": "open"})
            s, z = ch.join("s"), ch.join("z")

            def script_calls() -> int:
                stats = r.info("commandstats")
                return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in SCRIPTS)

            # when: it sends to the agent's id twice
            r.config_resetstat()
            assert s.send(z.id, "first").to == "z"
            first = script_calls()
            r.config_resetstat()
            assert s.send(z.id, "second").to == "z"
            # then: the first call lacked z's doorbell (the id is no name) and was made again;
            # the second was given it at once
            assert (first, script_calls()) == (2, 1)
            assert [m.body for m in z.wait(timeout=1).messages] == ["first", "second"]
    finally:
        srv.stop()


SCRIPTS = ("fcall", "evalsha", "eval")


def test_a_batch_that_names_an_id_and_broadcasts_routes_the_id_by_its_own_parent(
    redis7: Server,
) -> None:
    # given: family routing with siblings: boss -> mid -> leaf, and boss's sibling peer
    with Bus.from_url(redis7.url, settings=BusSettings(heartbeat_s=600)) as bus:
        ch = bus.channel("dk-route", **{**OPEN, "siblings": True})
        boss = ch.join("boss")
        mid = ch.join("mid", parent="boss")
        leaf = ch.join("leaf", parent="mid")
        ch.join("peer")
        # when: boss sends a batch: a message to its grandchild named by id, then a broadcast
        # (the call reads every member's status whole before its first message)
        out = boss.send_many([(leaf.id, "x"), ("all", "hi")])
        # then: the grandchild is out of its reach (a root and leaf are not siblings: leaf's
        # parent is mid); the broadcast reached its child and its sibling
        (to_leaf,) = out[0] if isinstance(out[0], list) else [out[0]]
        assert to_leaf.error is not None and to_leaf.error.code == "routing_refused"
        broadcast = out[1]
        assert isinstance(broadcast, list)
        assert sorted(r.to for r in broadcast if r.error is None) == ["mid", "peer"]
        assert not leaf.wait(timeout=0).messages
        assert [m.body for m in mid.wait(timeout=1).messages] == ["hi"]


def test_a_cancel_made_again_ends_a_descendant_it_was_not_given_which_learns_from_its_status(
    redis7: Server,
) -> None:
    # given: a parent's child, and a grandchild joined on another bus (its doorbell unknown to
    # the parent's bus)
    r = redis7.client()
    with _buses(redis7) as (here, there):
        ch = here.channel("dk-known", **OPEN)
        boss = ch.join("boss")
        ch.join("mid", parent="boss")
        late = there.channel("dk-known").join("late", parent="mid")
        # when: the cancel of the child is made as a call made again ("known"), without the
        # grandchild's doorbell (as when it joined after the cancel's first try)
        call = bind.outcome(ch.keys, "cancel", "boss", "mid", "stop", ["", "", ""], ["mid"])
        call = bind.with_bells(call, ["boss"])
        assert call.args[-1] == "known"
        reply = r.execute_command(*_command(here, call))
        # then: it went without asking; the whole subtree is cancelled; only the child was rung
        assert reply[0] == 1 and reply[3] == 1, reply
        assert r.hmget(ch.keys.status, ["mid", "late"]) == ["cancelled", "cancelled"]
        assert r.llen(ch.keys.bell("mid")) == 1 and r.llen(ch.keys.bell("late")) == 0
        # and the grandchild's next wait says it was cancelled (from its status)
        assert late.wait(timeout=2).kind == "cancelled"
        assert boss.wait(timeout=2).kind == "outcome"  # (the child's, rung as ever)
