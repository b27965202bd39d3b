"""Bugs the model-based test (tests/faults/test_model_based.py) found, each pinned by a plain
test."""

from __future__ import annotations

import time
from typing import Any, cast

from redisbus import Bus, BusSettings
from tests.support.servers import Server

FAST: dict[str, Any] = {
    "pair_rate_burst": 1e6,
    "pair_rate_per_s": 1e6,
    "sender_rate_burst": 0,
    "inbox_cap": 10**6,
}


def test_a_joined_replica_has_the_agent_lease_not_the_message_lease(redis7: Server) -> None:
    # given a channel whose messages lease for 1 s, on a bus whose agents lease for an hour
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, agent_lease_s=3600))
    ch = bus.channel("beat-lease", lease_s=1.0, **FAST)
    # when an agent joins
    ana = ch.join("ana")
    # then its replica's heartbeat deadline is the agent lease away: a process killed right
    # after joining is not reported lost a second later
    raw = redis7.client()
    beats = cast(dict[str, str], raw.hgetall(ch.keys.beat))  # the client decodes replies
    (deadline,) = [int(v) for k, v in beats.items() if k.startswith("ana\n")]
    now_ms = int(raw.time()[0]) * 1000
    assert deadline - now_ms > 3000 * 1000, (deadline, now_ms)
    assert ana.agents().self.name == "ana"
    bus.close()


def test_a_dead_lettered_broadcast_names_its_recipient_and_replays(redis7: Server) -> None:
    # given a broadcast that one recipient fetched and never finished
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("dlq-broadcast", lease_s=0.1, max_deliveries=1, **FAST)
    ana, ben = ch.join("ana"), ch.join("ben")
    ch.join("cy")
    ben.send("all", "hello")
    assert [m.body for m in ana.wait(timeout=1).messages] == ["hello"]
    time.sleep(0.3)
    # when the janitor dead-letters it
    ch.sweep()
    # then the dead letter names the recipient, not the broadcast flag, and replays to it
    (dead,) = ch.dead_letters()
    assert dead.recipient == "ana"
    ch.replay(dead.id)
    assert [m.body for m in ana.wait(timeout=1).messages] == ["hello"]
    bus.close()
