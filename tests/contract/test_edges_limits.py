"""Guarantees at the edges (docs/delivery.md, docs/concepts.md#limits-and-loop-protection):
idempotent retries always get their receipt, a pause is one atomic change, idle agents are never
reaped as lost, rate bookkeeping is bounded by the active pairs, and loops of fresh messages are
stopped.

Every test runs against real Redis servers (7 and 6.2) and the in-memory double, on both faces.
"""

from __future__ import annotations

import inspect
import subprocess
import threading
import time
from typing import Any

import pytest

from redisbus import BudgetExceeded, BusConnectionError, ChannelPaused
from tests.contract.test_contract import FAST, team


def io_of(bus: Any) -> Any:
    """The Redis boundary of a bus (the async face sits behind the sync adapter)."""
    return getattr(bus, "target", bus)._io


def drop_after(io: Any, commands: int) -> None:
    """From now on, the connection drops after ``commands`` more calls: every later call fails
    as a lost connection would, before reaching Redis."""
    real = io.call
    left = [commands]

    def spend() -> None:
        if left[0] <= 0:
            raise BusConnectionError("connection dropped (test)")
        left[0] -= 1

    if inspect.iscoroutinefunction(real):

        async def acall(*args: Any, **kw: Any) -> Any:
            spend()
            return await real(*args, **kw)

        io.call = acall
    else:

        def call(*args: Any, **kw: Any) -> Any:
            spend()
            return real(*args, **kw)

        io.call = call


# -- 7: a retry of an accepted send returns its receipt -----------------------------------------


def test_retry_of_an_accepted_send_returns_its_receipt_when_the_budget_is_spent(
    bus: Any, chan_name: str
) -> None:
    # given: a send accepted under an idempotency key, and the channel's budget spent since
    ch, _, writer, _ = team(bus, chan_name)
    first = writer.send("designer", "once", idempotency_key="k-1")
    ch.configure(max_messages=1)
    with pytest.raises(BudgetExceeded):
        writer.send("designer", "a new message")
    # when: the accepted send is retried
    again = writer.send("designer", "once", idempotency_key="k-1")
    # then: it gets the original receipt, and nothing was written
    assert (again.id, again.to, again.status) == (first.id, "designer", "queued")
    assert ch.length() == 1


def test_retry_of_an_accepted_send_returns_its_receipt_when_the_channel_is_paused(
    bus: Any, chan_name: str
) -> None:
    ch, _, writer, _ = team(bus, chan_name)
    first = writer.send("all", "to everyone once", idempotency_key="k-all")
    ch.pause()
    with pytest.raises(ChannelPaused):
        writer.send("designer", "a new message")
    again = writer.send("all", "to everyone once", idempotency_key="k-all")
    assert [(r.id, r.to) for r in again] == [(r.id, r.to) for r in first]
    assert ch.length() == 1


# -- 6: pausing and reconfiguring is one atomic change --------------------------------------------


def test_pause_is_one_atomic_change_even_when_the_connection_drops(
    make_bus: Any, chan_name: str
) -> None:
    # given: a channel whose sends went through (send.lua keeps limits and pause packed)
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, **FAST)
    a = ch.join("a")
    ch.join("b")
    a.send("b", "before")
    # when: another host pauses it, and its connection drops after the first command
    other = two.channel(chan_name)
    drop_after(io_of(two), 1)
    paused_here = True
    try:
        other.pause()
    except BusConnectionError:
        paused_here = False
    # then: the channel is either paused for every send or not changed at all; never a
    # pause that reads as paused while sends still go through
    shown = ch.refresh().paused
    if shown:
        with pytest.raises(ChannelPaused):
            a.send("b", "while paused")
    else:
        assert not paused_here
        assert a.send("b", "not paused").status == "queued"


def test_configure_from_another_host_stops_the_very_next_send(
    make_bus: Any, chan_name: str
) -> None:
    one, two = make_bus(), make_bus()
    ch = one.channel(chan_name, **FAST)
    a = ch.join("a")
    ch.join("b")
    a.send("b", "before")
    cfg = two.channel(chan_name).configure(max_messages=1)
    assert cfg.max_messages == 1  # the stored configuration, as changed
    with pytest.raises(BudgetExceeded):
        a.send("b", "over budget")
    two.channel(chan_name).pause()
    with pytest.raises(ChannelPaused):
        a.send("b", "paused")


# -- 8: an agent that promised no heartbeat is never lost ------------------------------------------


# join.lua gives a new replica a lease of lease_s; the heartbeat renews it for agent_lease_s
BEAT = {"heartbeat_s": 0.05, "agent_lease_s": 0.3, "lease_s": 0.3}


def test_agents_of_a_closed_bus_or_handle_are_never_reported_lost(
    make_bus: Any, chan_name: str
) -> None:
    # given: alice and bob joined by a process that then exits (as `redisbus join` does),
    # and dave's handle closed by a process that stays
    cli = make_bus(**BEAT)
    ch = cli.channel(chan_name, routing="family", **FAST)
    ch.join("alice")
    ch.join("bob", parent="alice")
    cli.close()
    live = make_bus(**BEAT)
    lch = live.channel(chan_name)
    lch.join("dave", parent="alice").close()
    # when: a live agent heartbeats on the channel for several leases
    lch.join("carol")
    time.sleep(4 * BEAT["agent_lease_s"])
    # then: nobody is lost, nobody was cancelled, and alice can still reach bob
    statuses = {m.name: m.status for m in lch.tree()}
    assert statuses == dict.fromkeys(["alice", "bob", "carol", "dave"], "running")
    again = make_bus(**BEAT).channel(chan_name)
    alice = again.join("alice")
    assert alice.send("bob", "hi").status == "queued"
    assert alice.wait(timeout=0.2).kind == "timeout"  # no "lost" outcome from bob or dave
    bob = again.join("bob")
    assert [(m.sender, m.body) for m in bob.wait(timeout=1).messages] == [("alice", "hi")]


def test_agents_joined_from_the_cli_are_never_reported_lost(redis_url: str) -> None:
    # given alice and bob joined by `redisbus join` (each process exits at once), with
    # leases far shorter than the test
    from redisbus import Bus
    from tests.cli.test_cli import BIN, clean_env
    from tests.conftest import settings

    env = clean_env(
        redis_url, REDISBUS_AGENT_LEASE_S="0.3", REDISBUS_LEASE_S="0.3", REDISBUS_HEARTBEAT_S="0.05"
    )

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [BIN, *args], capture_output=True, text=True, timeout=60, env=env, check=False
        )

    for name in ("alice", "bob"):
        assert cli("join", "c", "--as", name).returncode == 0
    # when an agent that heartbeats is on the channel for several leases
    with Bus.from_url(redis_url, settings=settings(**BEAT)) as bus:
        ch = bus.channel("c")
        ch.join("carol")
        time.sleep(4 * BEAT["agent_lease_s"])
        statuses = {m.name: m.status for m in ch.tree()}
    # then neither is lost, and alice can still reach bob
    assert statuses == dict.fromkeys(["alice", "bob", "carol"], "running")
    sent = cli("send", "c", "bob", "hi", "--as", "alice")
    assert sent.returncode == 0, sent.stderr


# -- 5: rate bookkeeping follows the active pairs ----------------------------------------------


def channel_bytes(r: Any, name: str) -> dict[str, int]:
    """MEMORY USAGE (exact: every field counted) of each key of channel ``name``."""
    return {
        k: int(r.memory_usage(k, samples=0) or 0) for k in r.scan_iter(match=f"rb:{{{name}}}:*")
    }


def sweep_until_clean(ch: Any) -> None:
    while True:
        rep = ch.sweep(batch=100_000)
        if rep.trimmed == 0 and not rep.rate_scanning:
            return


def everyone_broadcasts(url: str, n: int) -> dict[str, int]:
    """``n`` agents each broadcast once, read and mark done everything, and the channel is
    swept; returns the channel's total key memory at the start, at the peak and at the end,
    and the number of rate fields at the peak and at the end."""
    import redis

    from redisbus import Bus
    from tests.conftest import settings

    bus = Bus.from_url(url, settings=settings())
    r = redis.Redis.from_url(url, decode_responses=True)
    name = f"mem-{n}"
    # buckets refill and dampeners pass in 0.1 s; inboxes take a message from everyone
    ch = bus.channel(
        name,
        inbox_cap=n + 10,
        pair_rate_burst=3,
        pair_rate_per_s=30,
        sender_rate_burst=3,
        sender_rate_per_s=30,
        dampen_window_s=0.1,
    )
    agents = [ch.join(f"agent-{i:04d}") for i in range(n)]
    # a first round, one message each to the next agent: what every member holds while it
    # takes part (its consumer, its counters) is there from the start
    for i, a in enumerate(agents):
        a.send(agents[(i + 1) % n].name, "warm")
    for a in agents:
        a.mark_done(a.read(limit=1))
    time.sleep(0.2)  # every bucket refills
    sweep_until_clean(ch)
    start = sum(channel_bytes(r, name).values())
    start_fields = int(r.hlen(f"rb:{{{name}}}:rate"))
    for a in agents:
        assert len(a.send("all", "hello everyone")) == n - 1
    peak = sum(channel_bytes(r, name).values())
    peak_fields = int(r.hlen(f"rb:{{{name}}}:rate"))
    peak_rate = int(r.memory_usage(f"rb:{{{name}}}:rate", samples=0) or 0)
    for a in agents:
        got = a.read(limit=n)
        assert len(got) == n - 1
        a.mark_done(got)
    time.sleep(0.2)
    sweep_until_clean(ch)
    assert ch.length() == 0 and set(ch.counts().values()) == {0}
    end = sum(channel_bytes(r, name).values())
    fields = int(r.hlen(f"rb:{{{name}}}:rate"))
    bus.close()
    r.close()
    return {
        "start": start,
        "peak": peak,
        "end": end,
        "start_fields": start_fields,
        "peak_fields": peak_fields,
        "peak_rate_bytes": peak_rate,
        "fields": fields,
    }


def test_rate_bookkeeping_of_200_broadcasting_agents_is_swept_away(
    redis7: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # given 200 agents on a channel; when each broadcasts once, everything is done and swept
    redis7.client().flushall()
    got = everyone_broadcasts(redis7.url, 200)
    # then at the peak the rate state holds a bucket per sender, none per pair (200 x 199
    # pairs would be 39,800 fields, ~4 MB; 1,000 agents ~110 MB): a broadcast is the sender's
    # budget
    assert got["peak_fields"] <= got["start_fields"] + 200 + 2, got
    assert got["peak_rate_bytes"] * 1000 / 200 <= 10 * 2**20, got  # 1,000 agents: <= 10 MB
    # and the channel's keys take what they took at the start, plus a small constant (the
    # packed limits and the rate hash's own fields), however many pairs were active
    assert got["fields"] <= 3, got
    assert got["end"] - got["start"] < 4096, got
    with capsys.disabled():
        print(f"\n[200 agents each broadcasting] {got}")


@pytest.mark.soak  # about ten minutes here: `make soak` runs it, `make test` runs the 200 above
@pytest.mark.timeout(1200)
def test_rate_bookkeeping_of_1000_broadcasting_agents_is_swept_away(
    redis7: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    redis7.client().flushall()
    got = everyone_broadcasts(redis7.url, 1000)
    assert got["peak_rate_bytes"] <= 10 * 2**20, got
    assert got["fields"] <= 3, got
    assert got["end"] - got["start"] < 4096, got
    with capsys.disabled():
        print(f"\n[1000 agents each broadcasting] {got}")


# -- 12: loops of fresh messages are bounded ---------------------------------------------------

RING = ("ring-a", "ring-b", "ring-c")


def ring_buses(url: str, chan: str, **limits: Any) -> tuple[list[Any], Any]:
    """Three buses (hosts) sharing one metrics registry, each with one agent of the ring."""
    from prometheus_client import CollectorRegistry

    from redisbus import Bus
    from redisbus.metrics import BusMetrics
    from tests.conftest import settings

    registry = CollectorRegistry()
    buses = [
        Bus.from_url(url, settings=settings(), metrics=BusMetrics(registry, host="test"))
        for _ in RING
    ]
    buses[0].channel(chan, pair_rate_burst=1000, pair_rate_per_s=1000, **limits)
    return buses, registry


def refused_in_chains(registry: Any) -> float:
    return float(
        registry.get_sample_value(
            "redisbus_send_rejected_total", {"reason": "chain_too_deep", "host": "test"}
        )
        or 0
    )


def test_a_ring_of_fresh_messages_stops_at_the_chain_depth(redis7: Any) -> None:
    # given three agents, each in a thread of its own, that answer every message they get
    # with a NEW message (no reply_to) to the next agent of the ring, between wait() and
    # mark_done()
    from redisbus import ChainTooDeep

    redis7.client().flushall()
    buses, registry = ring_buses(redis7.url, "ring", max_chain_depth=6)
    agents = [b.channel("ring").join(n) for b, n in zip(buses, RING, strict=True)]
    stop = threading.Event()
    seen: list[tuple[str, int]] = []
    refusals: list[ChainTooDeep] = []

    def forward(i: int) -> None:
        me, nxt = agents[i], RING[(i + 1) % len(RING)]
        while not stop.is_set():
            for m in me.wait(timeout=0.2).messages:
                seen.append((me.name, m.depth))
                try:
                    me.send(nxt, f"passing on {m.id}")
                except ChainTooDeep as e:
                    refusals.append(e)
                    stop.set()
                me.mark_done(m)

    # when the first agent starts the ring
    agents[0].send("ring-b", "round and round")
    threads = [threading.Thread(target=forward, args=(i,)) for i in range(len(RING))]
    for t in threads:
        t.start()
    stopped = stop.wait(20)
    stop.set()
    for t in threads:
        t.join()
    for b in buses:
        b.close()
    # then the ring stops once the chain is as deep as the channel allows: each message one
    # deeper than the one it was sent while handling, the refusal typed and counted
    assert stopped, f"the ring ran on: {len(seen)} messages"
    assert [d for _, d in seen] == list(range(7)), seen
    assert len(refusals) == 1 and refusals[0].limit == 6
    assert refused_in_chains(registry) == 1


def test_a_fan_out_of_fresh_messages_stops_at_the_chain_budget(redis7: Any) -> None:
    # given three agents served by `serve` on three hosts, whose handler sends a new
    # message to both other agents for every message it handles (the chain doubles each
    # turn: its depth alone would allow thousands)
    from redisbus import ChainTooDeep

    redis7.client().flushall()
    buses, registry = ring_buses(
        redis7.url, "fan", max_chain_depth=50, max_chain_messages=20, inbox_cap=1000
    )
    agents = [b.channel("fan").join(n) for b, n in zip(buses, RING, strict=True)]
    stop = threading.Event()
    handled: list[str] = []
    refusals: list[ChainTooDeep] = []

    def handler(agent: Any, m: Any) -> None:
        handled.append(m.id)
        for other in RING:
            if other != agent.name:
                try:
                    agent.send(other, "and again")
                except ChainTooDeep as e:
                    refusals.append(e)

    threads = [
        threading.Thread(target=b.serve, args=({a: handler},), kwargs={"stop": stop, "poll_s": 0.1})
        for b, a in zip(buses, agents, strict=True)
    ]
    # when one message starts it
    agents[0].send("ring-b", "spread the word")
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (refusals and len(handled) >= 20):
        time.sleep(0.05)
    time.sleep(0.3)  # whatever was in flight lands
    stop.set()
    for t in threads:
        t.join()
    for b in buses:
        b.close()
    # then the chain holds exactly its budget of messages, and every send past it was refused
    assert refusals, f"the chain ran on: {len(handled)} messages handled"
    assert {e.limit for e in refusals} == {20}
    client = redis7.client()
    assert client.xlen("rb:{fan}:s") == 20
    assert refused_in_chains(registry) == len(refusals)
