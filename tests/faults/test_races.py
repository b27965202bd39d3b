"""Concurrency: several OS processes race against one server; limits are never exceeded."""

from __future__ import annotations

import time
from typing import Any, cast

from redisbus import Bus, BusSettings
from tests.support import race_workers
from tests.support.helpers import stream_inbox_counts
from tests.support.servers import Server


def test_eight_processes_never_exceed_the_inbox_cap(redis7: Server) -> None:
    # given a recipient with inbox_cap=128 and eight senders with rates out of the way
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel(
        "race",
        inbox_cap=128,
        pair_rate_burst=10_000,
        pair_rate_per_s=10_000,
        sender_rate_burst=10_000,
        sender_rate_per_s=10_000,
    )
    ch.join("inbox")
    senders = [f"s{i}" for i in range(8)]
    for s in senders:
        ch.join(s)
    # when eight processes send 500 messages each at the same moment
    results = race_workers.run_all(
        race_workers.send_many, [(redis7.url, "race", s, "inbox", 500) for s in senders]
    )
    # then exactly 128 were accepted, the rest refused as InboxFull, counters match the stream
    assert sum(r["ok"] for r in results) == 128
    assert sum(r["inbox_full"] for r in results) == 8 * 500 - 128
    assert ch.length() == 128
    assert ch.counts()["inbox"] == 128
    assert stream_inbox_counts(bus.redis, ch) == {"inbox": 128}
    bus.close()


def test_replicas_of_one_sender_share_the_pair_bucket(redis7: Server) -> None:
    # given a pair bucket of 10 burst refilling at 20/s, and six replicas of one sender
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel(
        "bucket",
        inbox_cap=100_000,
        pair_rate_burst=10,
        pair_rate_per_s=20,
        sender_rate_burst=0,
        sender_rate_per_s=0,
    )
    ch.join("a")
    ch.join("b")
    seconds = 1.5
    # when all six send as fast as they can for 1.5 s
    results: list[dict[str, Any]] = race_workers.run_all(
        race_workers.send_for, [(redis7.url, "bucket", "a", "b", seconds)] * 6
    )
    ok = sum(int(r["ok"]) for r in results)
    # then no more than burst + rate x elapsed got through (one token of slack for the window edge)
    assert ok <= 10 + 20 * seconds + 1, ok
    assert ok >= 20 * seconds * 0.5  # and the bucket did let the refill through
    assert sum(int(r["refused"]) for r in results) > 0
    assert ch.length() == ok == ch.counts()["b"]
    assert stream_inbox_counts(bus.redis, ch) == {"b": ok}
    bus.close()


def test_concurrent_mark_done_keeps_counters_exact(redis7: Server) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("done-race", pair_rate_burst=1000, pair_rate_per_s=1000)
    a, b = ch.join("a"), ch.join("b")
    # one name each, none refused (a refusal raises): every receipt carries its entry id
    ids = cast(list[str], [a.send("b", str(i)).id for i in range(50)])
    b.read(limit=100)
    b2 = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, replica="other"))
    other = b2.channel("done-race").join("b")
    # both replicas mark every message done; each id is counted down exactly once
    import threading

    t = threading.Thread(target=lambda: [other.mark_done(i) for i in ids])
    t.start()
    for i in ids:
        b.mark_done(i)
    t.join()
    time.sleep(0.05)
    assert ch.counts()["b"] == 0
    assert stream_inbox_counts(bus.redis, ch) == {}
    bus.close()
    b2.close()


def test_replicas_racing_in_a_busy_channel_take_each_message_once_and_leave_no_residue(
    redis7: Server,
) -> None:
    # given: an agent served by three replica processes, in a channel where half the traffic
    # is for another member (every fetch of the agent's group carries those entries too)
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("replica-race", inbox_cap=100_000, pair_rate_burst=0, sender_rate_burst=0)
    ch.join("worker")
    ch.join("bystander")
    senders = [f"s{i}" for i in range(3)]
    for s in senders:
        ch.join(s)
    # when: three senders send 200 messages each, alternating between the two, while the
    # three replicas wait and mark done
    work = [(redis7.url, "replica-race", s, ["worker", "bystander"], 200) for s in senders]
    serve = [(redis7.url, "replica-race", "worker", 2.0)] * 3
    roles = [(w, None) for w in work] + [(None, r) for r in serve]
    results = race_workers.run_all(race_workers.role, roles)
    sent = [i for r in results if "worker" in r for i in r["worker"]]
    got = [i for r in results if r.get("replica") for i in r["got"]]
    # then: every message for the worker was handed out exactly once over the replicas, and
    # nothing of it or of the bystander's traffic is left in the worker's group
    assert len(sent) == 300
    assert sorted(got) == sorted(sent)
    assert bus.redis.xpending(ch.keys.stream, "worker")["pending"] == 0
    assert ch.counts()["worker"] == 0
    assert stream_inbox_counts(bus.redis, ch) == {"bystander": 300}
    bus.close()


def test_a_broadcast_made_while_members_keep_joining_goes_out_to_everyone_there_before_it(
    redis7: Server,
) -> None:
    # given: a channel that two processes fill with 150 members each, as fast as they can,
    # while a third broadcasts over and over (each broadcast is given the doorbells of the
    # members its bus knows; those who joined since make it ask for theirs and go again)
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, heartbeat_s=600))
    ch = bus.channel(
        "joining", routing="open", inbox_cap=100_000, pair_rate_burst=0, sender_rate_burst=0
    )
    n = 150
    # when: they race
    results = race_workers.run_all(
        race_workers.role_of_joining,
        [
            ("join", (redis7.url, "joining", "a", n)),
            ("join", (redis7.url, "joining", "b", n)),
            ("broadcast", (redis7.url, "joining", "s", 2 * n + 1)),
        ],
    )
    (report,) = [x for x in results if "made" in x]
    # then: no broadcast failed (members joining between its tries never made it give up)
    assert report["errors"] == []
    made = report["made"]
    assert sum(len(before) < 2 * n + 1 for before, _, _, _ in made) >= 3  # (during the race)
    r = redis7.client()
    rung = {name: set(r.lrange(ch.keys.bell(name), 0, -1)) for name in made[-1][2]}
    for before, to, after, entry in made:
        # each went to every member there before the call began, and to no one who was not
        # a member once it returned (one who joined meanwhile may or may not have it)
        assert set(before) - {"s"} <= set(to) <= set(after) - {"s"}
        # and rang each recipient's doorbell with its entry
        assert all(entry in rung[name] for name in to), entry
    bus.close()


def test_a_cancel_made_while_children_keep_joining_ends_the_whole_subtree(
    redis7: Server,
) -> None:
    # given: twelve agents under one parent, and three processes that give the first still
    # open of them children as fast as they can while the parent cancels the twelve in turn
    # (each cancel is given the doorbells of the descendants its bus knows; those who joined
    # since make it ask for theirs and go again)
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, heartbeat_s=600))
    ch = bus.channel("spawning", routing="family", inbox_cap=100_000)
    ch.join("boss")
    mids = [f"mid{i}" for i in range(12)]
    with Bus.from_url(redis7.url, settings=BusSettings(metrics=False, heartbeat_s=600)) as b:
        for m in mids:
            b.channel("spawning").join(m, parent="boss")
    url = redis7.url
    # when: they race
    results = race_workers.run_all(
        race_workers.role_of_joining,
        [
            ("spawn", (url, "spawning", "a", mids, 400)),
            ("spawn", (url, "spawning", "b", mids, 400)),
            ("spawn", (url, "spawning", "c", mids, 400)),
            ("cancel", (url, "spawning", "boss", mids)),
        ],
    )
    # then: no cancel failed (children joining between its tries never made it give up)
    (report,) = [x for x in results if "errors" in x]
    assert report["errors"] == []
    assert sum(x.get("refused", 0) for x in results) > 0  # (some joins came after a cancel)
    # and every agent under the twelve ended: cancelled (its status), none left open
    r = redis7.client()
    parents = r.hgetall(ch.keys.parents)
    status = r.hgetall(ch.keys.status)
    under = [n for n, p in parents.items() if p in mids]
    assert under
    assert {status[n] for n in [*mids, *under]} == {"cancelled"}
    bus.close()
