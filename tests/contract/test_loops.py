"""Loop and runaway protection (docs/concepts.md#limits-and-loop-protection): dampener, deny-list,
circuit breaker."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from redisbus import Bus, BusSettings, CircuitOpen, LoopRefused
from tests.support.servers import Server

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def fresh(server: Server) -> Bus:
    server.client().flushall()
    return Bus.from_url(server.url, settings=BusSettings(metrics=False))


def test_a_two_agent_echo_loop_is_stopped_before_20_messages(redis7: Server) -> None:
    # given two scripted agents that answer every message they get, forever
    bus = fresh(redis7)
    ch = bus.channel("echo", **FAST)
    a, b = ch.join("alice"), ch.join("bob")
    refusals: list[LoopRefused] = []
    stop = threading.Event()

    def echo(me: object, other: str) -> None:
        while not stop.is_set():
            got = me.wait(timeout=0.5)  # type: ignore[attr-defined]
            for m in got.messages:
                me.mark_done(m)  # type: ignore[attr-defined]
                try:
                    me.send(other, f"re: {m.body}"[:200], reply_to=None)  # type: ignore[attr-defined]
                except LoopRefused as e:
                    refusals.append(e)
                    stop.set()

    threads = [
        threading.Thread(target=echo, args=(a, "bob")),
        threading.Thread(target=echo, args=(b, "alice")),
    ]
    for t in threads:
        t.start()
    # when one of them starts the conversation
    a.send("bob", "hello")
    stop.wait(15)
    stop.set()
    for t in threads:
        t.join(5)
    # then the dampener stops the loop before 20 messages
    assert refusals, "the echo loop was never stopped"
    assert ch.length() < 20
    assert refusals[0].limit == 10 and refusals[0].retry_after_s
    bus.close()


def test_dampener_forgets_after_a_quiet_window(redis7: Server) -> None:
    bus = fresh(redis7)
    ch = bus.channel("quiet", dampen_turns=3, dampen_window_s=0.2, **FAST)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "1")
    b.send("a", "2")
    a.send("b", "3")
    b.send("a", "4")
    with pytest.raises(LoopRefused):
        a.send("b", "5")
    time.sleep(0.25)
    a.send("b", "after a pause the pair may talk again")
    a.send("b", "and one-way messages never count as turns")
    bus.close()


def test_auto_replies_never_answer_deny_listed_senders(redis7: Server) -> None:
    bus = fresh(redis7)
    ch = bus.channel("deny", **FAST)
    router, agent = ch.join("message-router"), ch.join("agent")
    ch.join("human")
    r = router.send("agent", "new task routed")
    with pytest.raises(LoopRefused):
        agent.send("message-router", "ack", type="auto_reply", reply_to=r.id)
    agent.send("message-router", "a deliberate answer is fine", reply_to=r.id)
    custom = bus.channel("deny2", auto_reply_deny=["human"], **FAST)
    h, x = custom.join("human"), custom.join("x")
    r2 = h.send("x", "hi")
    with pytest.raises(LoopRefused):
        x.send("human", "auto", type="auto_reply", reply_to=r2.id)
    bus.close()


def test_circuit_breaker_stops_delivery_to_an_agent_that_keeps_failing(redis7: Server) -> None:
    # given an agent whose every delivery dies (two replicas that never finish a message)
    bus = fresh(redis7)
    ch = bus.channel(
        "breaker",
        lease_s=0.05,
        max_deliveries=1,
        breaker_failures=2,
        breaker_cooldown_s=0.5,
        **FAST,
    )
    boss = ch.join("boss")
    w1 = ch.join("worker", replica="r1")
    other = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    w2 = other.channel("breaker").join("worker", replica="r2")
    for i in range(2):
        boss.send("worker", f"job {i}")
        assert w1.wait(timeout=1).messages  # taken by r1, never done
        time.sleep(0.08)
        w2._last_claim = float("-inf")
        w2.wait(timeout=0.1)  # r2 finds it past its lease and delivered once: dead letter
    assert len(ch.dead_letters()) == 2
    # then further sends are refused until the cool-down passes
    with pytest.raises(CircuitOpen) as e:
        boss.send("worker", "job 3")
    assert e.value.retry_after_s and e.value.retry_after_s <= 0.5
    time.sleep(e.value.retry_after_s + 0.05)
    boss.send("worker", "job 3, after the cool-down")
    other.close()
    bus.close()
