"""Signing at its edges (docs/security.md#clocks): a host whose clock is off refuses to
sign with a typed error instead of having every message dropped as stale; trust-file changes
about the host's own key apply without a restart, both ways; ``keygen`` into a missing
directory says what to do."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from redisbus import Bus, ClockSkew, NotPermitted
from redisbus._clock import measure_skew, skew_check, skew_limit_s, wall_ms
from redisbus._trust import generate_key
from redisbus.metrics import NOOP, BusMetrics
from tests.cli.test_cli import BIN, clean_env, one_line_failure
from tests.conftest import settings

_turn = itertools.count(1)


def channel_name() -> str:
    return "edge-" + uuid.uuid4().hex[:8]


def skew_clock(bus: Any, seconds: float) -> None:
    """Make the bus's signer read a clock ``seconds`` off, and measure it against Redis TIME
    as join and the heartbeat do."""
    signer = (bus.target if hasattr(bus, "target") else bus)._signer
    signer.clock_ms = lambda: wall_ms() + int(seconds * 1000)
    sent = signer.clock_ms()
    reply = bus.redis.time()
    signer.observe_time(reply, sent, signer.clock_ms())


def state(bus: Bus, ch: Any) -> dict[str, Any]:
    r = bus.redis
    return {"xlen": r.xlen(ch.keys.stream), "inbox": r.hgetall(ch.keys.inbox)}


# -- item 7: clocks ---------------------------------------------------------------------------


def test_a_host_two_minutes_off_refuses_to_sign_and_writes_nothing(redis_url: str) -> None:
    registry = CollectorRegistry()
    metrics = BusMetrics(registry, host="h")
    with Bus.from_url(
        redis_url, settings=settings(signing_keys={"k1": "fleet"}), metrics=metrics
    ) as bus:
        ch = bus.channel(channel_name())
        reader, writer = ch.join("reader"), ch.join("writer")
        skew_clock(bus, 120)
        before = state(bus, ch)
        sent_before = registry.get_sample_value(
            "redisbus_messages_sent_total", {"type": "message", "host": "h"}
        )

        with pytest.raises(ClockSkew) as refused:
            writer.send("reader", "hello")
        with pytest.raises(ClockSkew):
            writer.complete("done")  # outcomes are signed too

        e = refused.value
        assert 119 < e.skew_s < 121 and e.limit_s == 30
        assert "120 s ahead" in str(e) and "NTP" in str(e) and e.code == "clock_skew"
        assert state(bus, ch) == before
        assert reader.wait(timeout=0.2).kind == "timeout"
        after = registry.get_sample_value(
            "redisbus_messages_sent_total", {"type": "message", "host": "h"}
        )
        assert after == sent_before


def test_a_clock_behind_is_refused_too_and_fixing_it_lets_sends_through(redis_url: str) -> None:
    with Bus.from_url(redis_url, settings=settings(signing_keys={"k1": "fleet"})) as bus:
        ch = bus.channel(channel_name())
        reader, writer = ch.join("reader"), ch.join("writer")
        skew_clock(bus, -45)
        with pytest.raises(ClockSkew, match="45 s behind"):
            writer.send("reader", "too early")

        skew_clock(bus, 0)  # NTP fixed it; the next heartbeat measures again
        writer.send("reader", "on time")

        (msg,) = reader.wait(timeout=5).messages
        assert (msg.body, msg.verified) == ("on time", True)


def test_a_host_one_second_off_signs_and_is_accepted(redis_url: str) -> None:
    with Bus.from_url(redis_url, settings=settings(signing_keys={"k1": "fleet"})) as bus:
        ch = bus.channel(channel_name())
        reader, writer = ch.join("reader"), ch.join("writer")
        skew_clock(bus, 1)

        writer.send("reader", "close enough")

        (msg,) = reader.wait(timeout=5).messages
        assert (msg.body, msg.verified) == ("close enough", True)


def test_the_skew_is_measured_around_time_with_half_the_round_trip_taken_off() -> None:
    # Redis read 1000.5 s; the call left at 1000.4 s and came back at 1000.6 s (host clock)
    assert measure_skew((1000, 500_000), 1_000_400, 1_000_600) == pytest.approx(0.0)
    assert measure_skew([b"1000", b"500000"], 1_120_400, 1_120_600) == pytest.approx(120.0)
    assert measure_skew(("1000", "0"), 999_000, 999_000) == pytest.approx(-1.0)


def test_the_limit_is_half_the_signing_window_unless_set() -> None:
    assert skew_limit_s(settings()) == 30
    assert skew_limit_s(settings(signing_window_s=10)) == 5
    assert skew_limit_s(settings(clock_skew_max_s=2.5)) == 2.5
    with pytest.raises(ValueError, match="clock_skew_max_s"):
        settings(signing_window_s=10, clock_skew_max_s=10)


def test_doctor_check_names_the_skew_and_the_fix(redis_url: str) -> None:
    with Bus.from_url(redis_url, settings=settings()) as bus:
        r = bus.redis
    signing = settings(signing_keys={"k1": "fleet"})
    ok, text = skew_check(r, signing, clock_ms=lambda: wall_ms() + 120_000)
    assert not ok and re.search(r"\b(119\.9\d*|120(\.0\d*)?) s\b", text) and "NTP" in text
    assert skew_check(r, signing)[0]
    ok, text = skew_check(r, settings(), clock_ms=lambda: wall_ms() + 120_000)
    assert ok and "signing is off" in text


def test_the_skew_gauge_is_in_seconds_and_signed() -> None:
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="h")
    m.clock_skew(-2.5)
    assert registry.get_sample_value("redisbus_clock_skew_seconds", {"host": "h"}) == -2.5
    NOOP.clock_skew(3.0)


# -- item 8: the host's own key in the trust file --------------------------------------------


class Trust:
    """A trust file with host-a and host-b keys, rewritten on disk like an operator would."""

    def __init__(self, tmp: Path) -> None:
        self.path = tmp / "trust.json"
        self.keys = {h: str(tmp / f"{h}.pem") for h in ("host-a", "host-b")}
        self.entries = {
            h: {"public": generate_key(p), "channels": ["edge-*"], "agents": [f"{h[-1]}-*"]}
            for h, p in self.keys.items()
        }
        self.doc: dict[str, Any] = {"keys": dict(self.entries), "revoked": []}

    def write(self) -> None:
        self.path.write_text(json.dumps(self.doc))
        st = self.path.stat()  # a rewrite within one mtime tick must still be seen
        os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns + next(_turn) * 10_000_000))

    def settings(self, host: str) -> dict[str, Any]:
        return {"trust_file": str(self.path), "signing_key_file": self.keys[host], "host": host}


def eventually(call: Callable[[], Any], within_s: float = 3.0) -> Any:
    """``call()``'s result once it stops raising NotPermitted (the trust file is looked at
    once a second)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return call()
        except NotPermitted:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


REDIS7 = pytest.mark.parametrize("server", ["redis7"], indirect=True)


@REDIS7
def test_adding_the_hosts_own_key_lets_it_join_without_a_new_bus(
    make_bus: Any, tmp_path: Path
) -> None:
    trust = Trust(tmp_path)
    del trust.doc["keys"]["host-a"]
    trust.write()
    a, b = make_bus(**trust.settings("host-a")), make_bus(**trust.settings("host-b"))
    name = channel_name()
    reader = b.channel(name).join("b-reader")
    with pytest.raises(NotPermitted):
        a.channel(name).join("a-writer")

    trust.doc["keys"]["host-a"] = trust.entries["host-a"]
    trust.write()
    writer = eventually(lambda: a.channel(name).join("a-writer"))
    writer.send("b-reader", "now trusted")

    (msg,) = reader.wait(timeout=5).messages
    assert (msg.body, msg.verified) == ("now trusted", True)


@REDIS7
def test_revoking_the_hosts_own_key_refuses_its_joins_and_sends(
    make_bus: Any, tmp_path: Path
) -> None:
    trust = Trust(tmp_path)
    trust.write()
    a, b = make_bus(**trust.settings("host-a")), make_bus(**trust.settings("host-b"))
    name = channel_name()
    b.channel(name).join("b-reader")
    writer = a.channel(name).join("a-writer")

    trust.doc["revoked"] = ["host-a"]
    trust.write()
    time.sleep(1.1)  # the trust file is looked at once a second
    before = a.redis.xlen(writer.channel.keys.stream)

    with pytest.raises(NotPermitted):
        a.channel(name).join("a-other")
    with pytest.raises(NotPermitted, match="revoked"):
        writer.send("b-reader", "while revoked")  # refused, not sent unsigned to be dropped
    assert a.redis.xlen(writer.channel.keys.stream) == before


@REDIS7
def test_restoring_the_hosts_own_key_lets_it_join_and_sign_again(
    make_bus: Any, tmp_path: Path
) -> None:
    trust = Trust(tmp_path)
    trust.write()
    a, b = make_bus(**trust.settings("host-a")), make_bus(**trust.settings("host-b"))
    name = channel_name()
    reader = b.channel(name).join("b-reader")
    writer = a.channel(name).join("a-writer")
    trust.doc["revoked"] = ["host-a"]
    trust.write()
    time.sleep(1.1)
    with pytest.raises(NotPermitted):
        a.channel(name).join("a-other")

    trust.doc["revoked"] = []
    trust.write()
    eventually(lambda: a.channel(name).join("a-other"))
    writer.send("b-reader", "restored")

    (msg,) = reader.wait(timeout=5).messages
    assert (msg.body, msg.verified) == ("restored", True)


# -- item 9: keygen ---------------------------------------------------------------------------


def test_keygen_into_a_missing_directory_says_to_create_it(tmp_path: Path) -> None:
    where = tmp_path / "etc" / "redisbus"
    p = subprocess.run(
        [BIN, "keygen", str(where / "host.pem")],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(None),
    )
    text = one_line_failure(p, 2)
    assert str(where) in text and "mkdir -m 700 -p" in text
    assert "unexpected" not in text
    assert not where.exists()


def test_join_and_the_heartbeat_measure_the_clock_themselves(redis_url: str, face: str) -> None:
    # given: a signing host whose clock is two minutes ahead, never measured by hand
    from redisbus import AsyncBus
    from tests.conftest import Synced

    registry = CollectorRegistry()
    s = settings(signing_keys={"k1": "fleet"}, heartbeat_s=0.2)
    metrics = BusMetrics(registry, host="h")
    bus: Any
    if face == "sync":
        bus = Bus.from_url(redis_url, settings=s, metrics=metrics)
    else:
        import asyncio

        bus = Synced(
            AsyncBus.from_url(redis_url, settings=s, metrics=metrics), asyncio.new_event_loop()
        )
    try:
        signer = (bus.target if hasattr(bus, "target") else bus)._signer
        signer.clock_ms = lambda: wall_ms() + 120_000
        ch = bus.channel(channel_name())

        # when: an agent joins (join measures), then sends
        reader, writer = ch.join("reader"), ch.join("writer")
        with pytest.raises(ClockSkew, match="120"):
            writer.send("reader", "late")
        skew = registry.get_sample_value("redisbus_clock_skew_seconds", {"host": "h"})
        assert skew is not None and 119 < skew < 121

        # when: the clock is fixed: the next heartbeat measures it again and sends go through
        signer.clock_ms = wall_ms
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                writer.send("reader", "on time")
                break
            except ClockSkew:
                time.sleep(0.1)
        assert [m.body for m in reader.wait(timeout=5).messages] == ["on time"]
    finally:
        bus.close()


def test_doctor_fails_a_skewed_clock_and_a_full_server(redis_url: str, tmp_path: Path) -> None:
    from redisbus.cli.doctor import clock_check, eviction_check

    r = Bus.from_url(redis_url, settings=settings()).redis
    signing = settings(signing_keys={"k1": "fleet"})
    assert clock_check(r, signing).verdict == "ok"
    full = {"maxmemory_policy": "noeviction", "used_memory": 2000, "maxmemory": 1000}
    check = eviction_check(full)
    assert check.verdict == "fail" and "at its limit" in check.detail
    assert eviction_check({**full, "used_memory": 500}).verdict == "ok"
