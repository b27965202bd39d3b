"""Where send.lua keeps the channel's limits: packed in the rate hash's '#lim' field, read with
the buckets (no command of its own), text like the rest of the hash, dropped by configure()
together with the string key older versions cached them in, which a send ignores and drops."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from redisbus import Bus, ChannelPaused, InboxFull
from tests.conftest import settings
from tests.support.servers import Server

OPEN: dict[str, Any] = {"routing": "open", "inbox_cap": 1_000, "pair_rate_burst": 1_000}


def _cached(bus: Any, ch: Any) -> str | None:
    value = bus.redis.hget(ch.keys.rate, "#lim")
    return None if value is None else str(value)


def test_a_send_caches_the_limits_as_text_in_the_rate_hash(bus: Any, chan_name: str) -> None:
    # given a channel, after one send
    ch = bus.channel(chan_name, **OPEN)
    a, _ = ch.join("a"), ch.join("b")
    a.send("b", "hi")
    # then the limits are in the rate hash, readable by a client that decodes replies, and
    # the string older versions cached them in is not written
    rate = bus.redis.hgetall(ch.keys.rate)
    assert "#lim" in rate and "#table" in rate
    assert bus.redis.exists(ch.keys.limits) == 0


def test_the_cached_limits_read_back_as_the_very_numbers_meta_holds(redis7: Server) -> None:
    # given limits that are not whole numbers (JSON numbers written short would round them)
    with Bus.from_url(redis7.url, settings=settings()) as bus:
        ch = bus.channel("lim-exact", routing="open", pair_rate_per_s=1 / 3, sender_rate_per_s=0.1)
        a, _ = ch.join("a"), ch.join("b")
        a.send("b", "hi")
        packed = json.loads(_cached(bus, ch) or "")
        meta = bus.redis.hgetall(ch.keys.meta)
    # then each reads back exactly (fields 7 and 9: pair and sender refill per second)
    assert packed[6] == float(meta["pair_rate_per_s"])
    assert packed[8] == float(meta["sender_rate_per_s"])
    assert packed[0] == "open"


def test_an_older_versions_limits_key_is_ignored_and_dropped(bus: Any, chan_name: str) -> None:
    # given a channel upgraded from a version that cached its limits in a string key, which
    # still says "paused" (a cache the older version filled before the channel was resumed)
    ch = bus.channel(chan_name, **OPEN)
    a, _ = ch.join("a"), ch.join("b")
    if bus.redis.eval("return cmsgpack and 1 or 0", 0):  # a real Redis: MessagePack, as
        # those versions wrote it
        bus.redis.eval(
            "redis.call('SET', KEYS[1], cmsgpack.pack('open', '', 1000, 32768, 128, 1000, 1, "
            "10, 1, 10, 0, 10, 10000, '', 1, 0))",
            1,
            ch.keys.limits,
        )
    else:  # the in-memory double: tab-separated
        stale = "open\t\t1000\t32768\t128\t1000\t1\t10\t1\t10\t0\t10\t10000\t\t1\t0"
        bus.redis.set(ch.keys.limits, stale)
    # when a send runs, then it goes by meta (not paused), and the old key is gone
    assert a.send("b", "hi").status == "queued"
    assert bus.redis.exists(ch.keys.limits) == 0
    assert _cached(bus, ch) is not None


def test_configure_drops_the_cache_and_an_older_versions_copy(bus: Any, chan_name: str) -> None:
    # given a channel whose limits a send has cached, and an older version's copy beside it
    ch = bus.channel(chan_name, **OPEN)
    a, _ = ch.join("a"), ch.join("b")
    a.send("b", "hi")
    bus.redis.set(ch.keys.limits, "an older version's cache")
    # when the channel is paused, then both copies are gone and the next send sees the pause
    ch.pause()
    assert _cached(bus, ch) is None
    assert bus.redis.exists(ch.keys.limits) == 0
    with pytest.raises(ChannelPaused):
        a.send("b", "hi")
    # and when it is resumed, sends go again and cache the limits anew
    ch.resume()
    assert a.send("b", "again").status == "queued"
    assert _cached(bus, ch) is not None


@pytest.mark.parametrize("srv", ["redis7", "valkey", "redis62"])
def test_each_channel_is_held_to_its_own_limits_by_sends_that_alternate(
    srv: str, request: pytest.FixtureRequest
) -> None:
    # given more channels than the Functions library keeps parsed limits for (64), each with
    # its own inbox cap, sent to in turn (one message to each channel, round after round)
    server: Server = request.getfixturevalue(srv)
    n = 70
    with Bus.from_url(server.url, settings=settings()) as bus:
        chans = [
            bus.channel(f"own-{srv}-{i}", **{**OPEN, "inbox_cap": 1 + i % 7}) for i in range(n)
        ]
        senders = []
        for ch in chans:
            senders.append(ch.join("a"))
            ch.join("b")
        refused: dict[int, list[float | None]] = {i: [] for i in range(n)}
        for _ in range(8):
            for i, a in enumerate(senders):
                try:
                    a.send("b", "hi")
                except InboxFull as e:
                    refused[i].append(e.limit)
        # and one channel's cap changed in the middle of it
        chans[3].configure(inbox_cap=2)
        for i, a in enumerate(senders[:10]):
            try:
                a.send("b", "after")
            except InboxFull as e:
                refused[i].append(e.limit)
    # then each was refused at its own cap, and channel 3 at its new one
    for i in range(n):
        cap = 1 + i % 7
        want = [cap] * (8 - cap) + ([cap] if i < 10 and i != 3 else [])
        if i == 3:
            want = [cap] * (8 - cap) + [2]
        assert refused[i] == want, (i, refused[i])


def _commands(r: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = r.info("commandstats")
    out = {k.removeprefix("cmdstat_").upper(): int(v["calls"]) for k, v in stats.items()}
    return {k: n for k, n in out.items() if k not in ("INFO", "CONFIG|RESETSTAT", "CONFIG")}


@pytest.mark.parametrize("srv", ["redis7", "valkey", "redis62"])
def test_a_plain_send_runs_nine_commands(srv: str, request: pytest.FixtureRequest) -> None:
    # given a channel whose limits are cached (an earlier send)
    server: Server = request.getfixturevalue(srv)
    r = server.client()
    with Bus.from_url(server.url, settings=settings()) as bus:
        ch = bus.channel(f"cmds-{srv}", **OPEN)
        a, _ = ch.join("a"), ch.join("b")
        a.send("b", "warm up")
        r.config_resetstat()
        # when one message goes to one recipient
        a.send("b", "hi")
        seen = _commands(r)
    # then: the clock, the rate fields with the limits, statuses, inbox depths, the entry,
    # its id on the recipient's doorbell (still ringing from the warm-up, so no second wakeup),
    # and one write per counter hash; no read of its own for the limits
    verb = bus._io.verb  # FCALL, or EVALSHA on 6.2 (or with REDISBUS_FUNCTIONS=false)
    assert seen == {verb: 1, "TIME": 1, "HMGET": 3, "XADD": 1, "RPUSH": 1, "HSET": 2}, seen
    assert r.llen(ch.keys.bell("b")) == 2 and r.llen(ch.keys.wakeup("b")) == 1


def _now_ms(r: Any) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def test_bucket_values_are_the_tokens_left_and_the_clock_of_each_send(
    bus: Any, chan_name: str
) -> None:
    # given a pair bucket and a sender bucket that refill slowly, so each send leaves a count
    # of tokens not seen before: more than the 64 counts whose text the library keeps
    ch = bus.channel(
        chan_name,
        routing="open",
        inbox_cap=1_000,
        pair_rate_burst=500,
        pair_rate_per_s=0.01,
        sender_rate_burst=400,
        sender_rate_per_s=0.01,
    )
    a, _ = ch.join("a"), ch.join("b")
    r = bus.redis
    for i in range(80):
        # when a sends one more message to b
        before = _now_ms(r)
        a.send("b", f"{i}")
        after = _now_ms(r)
        # then each bucket holds the tokens it was left with, as Lua writes the number, and
        # this send's clock: its own value, never another count's or another send's
        for field, burst in (("p\na\nb", 500), ("s\na", 400)):
            tokens, at = r.hget(ch.keys.rate, field).split(" ")
            assert burst - i - 1 <= float(tokens) < burst - i, (i, field, tokens)
            assert tokens == f"{float(tokens):.14g}", tokens
            assert before <= int(at) <= after, (i, field, at)
    # and buckets refilled to their burst at every send leave one count, 999, whose text
    # each send reuses with its own clock
    full = bus.channel(chan_name + "-full", **{**OPEN, "pair_rate_per_s": 1_000_000})
    c, _ = full.join("a"), full.join("b")
    seen = set()
    for i in range(30):
        before = _now_ms(r)
        c.send("b", f"{i}")
        after = _now_ms(r)
        tokens, at = r.hget(full.keys.rate, "p\na\nb").split(" ")
        assert tokens == "999" and before <= int(at) <= after, (i, tokens, at)
        seen.add(at)
        time.sleep(0.002)
    assert len(seen) > 1
