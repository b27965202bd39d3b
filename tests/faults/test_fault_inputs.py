"""Numbers that overflow, hammered: every number that ends up in milliseconds or in Redis is
refused at the call, with nothing written, and a channel whose stored numbers are poisoned
still works on every host; the janitor sweeps past a channel that fails."""

from __future__ import annotations

import logging
import math
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbus import Bus, BusSettings, InvalidInput
from redisbus._channels import _INT_LIMITS, LIMITS
from redisbus.janitor import sweep_all
from tests.cli.test_cli import BIN, clean_env
from tests.support.helpers import channel_state
from tests.support.servers import Server

# The contract, spelled out here rather than imported: a duration is at most ten years, a
# rate or burst at most 1e9, a count an integer up to 2**31.
TEN_YEARS_S = 10 * 365 * 24 * 3600
MAX_RATE = 1e9
MAX_INT = 2**31
DURATIONS = frozenset(
    {"retention_s", "lease_s", "dampen_window_s", "breaker_window_s", "breaker_cooldown_s"}
)
FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}

edges = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        1e308,
        -1e308,
        5e-324,
        -0.0,
        float(TEN_YEARS_S),
        TEN_YEARS_S * (1 + 1e-9),
        MAX_RATE,
        MAX_RATE * (1 + 1e-9),
        MAX_INT,
        MAX_INT + 1,
        10**400,
        -1,
        0,
        0.0,
        1024,
        1025,
        True,
    ]
)
numbers = st.one_of(
    edges,
    st.floats(),  # nan, inf, subnormal, huge, negative
    st.integers(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.booleans(),
    st.text(max_size=8),
    st.sampled_from(["1e308", "inf", "nan", "60"]),
)
fuzz = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def a_number(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return isinstance(v, int) or math.isfinite(v)


#: The limits whose setting refuses 0 (a channel where nobody could receive, join or hold a
#: message), and the longest name a channel may allow.
_AT_LEAST_ONE = frozenset({"inbox_cap", "max_body_bytes", "max_name_chars", "max_deliveries"})
_ABOVE_ZERO = frozenset({"lease_s", "retention_s"})
_MAX_NAME_CHARS = 1024


def allowed(field: str, v: Any) -> bool:
    """The channel limit ``field`` may be ``v``: what its setting may be."""
    if field in _INT_LIMITS:
        most = _MAX_NAME_CHARS if field == "max_name_chars" else MAX_INT
        return type(v) is int and (1 if field in _AT_LEAST_ONE else 0) <= v <= most
    top = TEN_YEARS_S if field in DURATIONS else MAX_RATE
    return a_number(v) and (v > 0 if field in _ABOVE_ZERO else v >= 0) and v <= top


@pytest.fixture(scope="module")
def board(redis7: Server) -> Iterator[tuple[Any, Any, Any]]:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("overflow", **FAST)
    a = ch.join("a")
    ch.join("b")
    a.send("b", "seed")
    yield bus, ch, a
    bus.close()


def every_key(client: redis.Redis) -> dict[str, Any]:
    """The whole database: key names and types (a refused channel() must create none)."""
    return {k: client.type(k) for k in client.scan_iter()}


@fuzz
@given(field=st.sampled_from(LIMITS), value=numbers)
def test_configure_refuses_numbers_out_of_range_and_writes_nothing(
    board: Any, field: str, value: Any
) -> None:
    bus, ch, a = board
    before = channel_state(bus.redis, ch)
    try:
        ch.configure(**{field: value})
    except InvalidInput as e:
        assert not allowed(field, value), f"{field}={value!r} was refused: {e}"
        assert field in str(e)
        assert channel_state(bus.redis, ch) == before
        return
    assert allowed(field, value), f"{field}={value!r} was accepted"
    # an accepted number works on every path that turns it into milliseconds
    ch.sweep()
    a.wait(timeout=0)


@fuzz
@given(field=st.sampled_from(LIMITS), value=numbers)
def test_a_channel_created_with_a_number_out_of_range_is_not_created(
    board: Any, field: str, value: Any
) -> None:
    bus, ch, a = board
    if allowed(field, value):
        return
    before = every_key(bus.redis)
    with pytest.raises(InvalidInput, match=field):
        bus.channel("never", **{field: value})
    assert every_key(bus.redis) == before


@fuzz
@given(batch=st.one_of(numbers, st.just(1000)), idle=st.one_of(numbers, st.just(60.0)))
def test_sweep_refuses_bad_batches_and_idle_times(board: Any, batch: Any, idle: Any) -> None:
    bus, ch, a = board
    ok = type(batch) is int and 1 <= batch <= 100_000 and a_number(idle)
    ok = ok and 0 <= idle <= TEN_YEARS_S
    before = channel_state(bus.redis, ch)
    try:
        ch.sweep(batch=batch, consumer_idle_s=idle)
    except InvalidInput as e:
        assert not ok, f"sweep(batch={batch!r}, consumer_idle_s={idle!r}) refused: {e}"
        assert ("batch" if "batch" in str(e) else "consumer_idle_s") in str(e)
        assert channel_state(bus.redis, ch) == before
        return
    assert ok, f"sweep(batch={batch!r}, consumer_idle_s={idle!r}) was accepted"


SETTINGS_SECONDS = [
    "socket_timeout_s",
    "connect_timeout_s",
    "retention_s",
    "dampen_window_s",
    "breaker_window_s",
    "breaker_cooldown_s",
    "lease_s",
    "heartbeat_s",
    "agent_lease_s",
    "durable_timeout_s",
    "signing_window_s",
    "replay_keep_s",
]
SETTINGS_RATES = ["pair_rate_burst", "pair_rate_per_s", "sender_rate_burst", "sender_rate_per_s"]
SETTINGS_COUNTS = [
    "inbox_cap",
    "max_body_bytes",
    "max_chain_depth",
    "max_chain_messages",
    "max_depth",
    "max_members",
    "max_messages",
    "dampen_turns",
    "breaker_failures",
    "max_deliveries",
    "durable_replicas",
]


@fuzz
@given(
    field_and_value=st.one_of(
        st.tuples(
            st.sampled_from(SETTINGS_SECONDS),
            st.one_of(
                st.just(math.nan), st.floats(min_value=TEN_YEARS_S * (1 + 1e-9)), st.just(10**400)
            ),
        ),
        st.tuples(
            st.sampled_from(SETTINGS_RATES),
            st.one_of(st.just(math.nan), st.floats(min_value=MAX_RATE * (1 + 1e-9))),
        ),
        st.tuples(st.sampled_from(SETTINGS_COUNTS), st.integers(min_value=MAX_INT + 1)),
    )
)
def test_settings_refuse_numbers_that_overflow(field_and_value: tuple[str, Any]) -> None:
    field, value = field_and_value
    with pytest.raises(ValueError, match=field):
        BusSettings(metrics=False, **{field: value})


@pytest.mark.parametrize("raw", ["inf", "1e308", "1e400", "315360001"])
def test_settings_from_the_environment_refuse_numbers_that_overflow(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("REDISBUS_HEARTBEAT_S", raw)
    with pytest.raises(ValueError, match="heartbeat_s"):
        BusSettings()


# -- defence in depth: numbers already stored -------------------------------------------------


@pytest.fixture
def server(redis7: Server) -> Server:
    """Both faces (``make_bus``), on the real Redis 7 only: the poison is written raw."""
    redis7.client().flushall()
    return redis7


POISON = ["1e308", "inf", "-inf", "nan", "abc", "-5", "1e400", ""]


@pytest.mark.parametrize("raw", POISON)
@pytest.mark.parametrize("field", ["lease_s", "retention_s"])
def test_a_poisoned_stored_number_is_read_safely_with_one_warning(
    make_bus: Any,
    server: Server,
    caplog: pytest.LogCaptureFixture,
    chan_name: str,
    field: str,
    raw: str,
) -> None:
    # given a channel with a message fetched and not done, and a poisoned number in its meta
    bus = make_bus()
    ch = bus.channel(chan_name, **FAST)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "keep me")
    server.client().hset(ch.keys.meta, field, raw)
    caplog.set_level(logging.WARNING, logger="redisbus")

    # when every reader of the stored config runs (twice: the warning is said once)
    for _ in range(2):
        ch.refresh()
        got = b.wait(timeout=0.2)
        report = ch.sweep()
        bus.channel(chan_name).sweep()

    # then the number is safe, nothing was trimmed, and one line said why
    v = ch.config.limits.get(field)
    assert v is None or (math.isfinite(v) and 0 <= v <= TEN_YEARS_S), v
    assert [m.body for m in got.messages] in (["keep me"], [])
    assert report.trimmed == 0 and server.client().xlen(ch.keys.stream) == 1
    lines = [r for r in caplog.records if field in r.getMessage() and chan_name in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    assert lines[0].levelno == logging.WARNING and not lines[0].exc_info


# -- the janitor goes on past a channel that fails --------------------------------------------


def four_channels(url: str) -> None:
    """a-fine and d-fine each hold one entry every group is done with (the janitor trims it);
    b-poisoned stores numbers that overflow; c-broken's stream key is not a stream."""
    with Bus.from_url(url, settings=BusSettings(metrics=False)) as bus:
        for name in ("a-fine", "b-poisoned", "c-broken", "d-fine"):
            ch = bus.channel(name, **FAST)
            x, y = ch.join("x"), ch.join("y")
            x.send("y", "done with")
            y.mark_done(y.read(limit=10))
        raw = bus.redis
        raw.hset(bus.channel("b-poisoned").keys.meta, mapping={"lease_s": "1e308"})
        raw.hset(bus.channel("b-poisoned").keys.meta, mapping={"retention_s": "inf"})
        broken = bus.channel("c-broken").keys.stream
        raw.delete(broken)
        raw.set(broken, "not a stream")


def stream_lengths(client: redis.Redis) -> dict[str, int]:
    return {
        k.split("{")[1].split("}")[0]: client.xlen(k)
        for k in client.scan_iter()
        if k.endswith(":s") and client.type(k) == "stream"
    }


def test_the_janitor_sweeps_every_channel_past_one_that_fails(
    redis_url: str, redis7: Server, caplog: pytest.LogCaptureFixture
) -> None:
    four_channels(redis_url)
    caplog.set_level(logging.INFO, logger="redisbus")
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        report = sweep_all(bus)

    assert report.channels == 3 and report.trimmed == 3
    assert len(report.errors) == 1 and report.errors[0].startswith("c-broken: ")
    assert stream_lengths(redis7.client()) == {"a-fine": 0, "b-poisoned": 0, "d-fine": 0}
    failed = [r for r in caplog.records if "c-broken" in r.getMessage()]
    assert len(failed) == 1 and failed[0].levelno == logging.WARNING
    assert not any(r.exc_info for r in caplog.records)


def test_janitor_once_reports_a_failed_channel_and_exits_1_after_the_rest(
    redis_url: str, redis7: Server
) -> None:
    four_channels(redis_url)

    p = subprocess.run(
        [BIN, "janitor", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_env(redis_url),
    )

    assert p.returncode == 1, p.stderr
    assert "Traceback" not in p.stderr
    assert "3 channels: 3 trimmed" in p.stdout and "1 failed" in p.stdout
    assert p.stderr.splitlines()[-1].startswith("redisbus: janitor: c-broken: ")
    assert stream_lengths(redis7.client()) == {"a-fine": 0, "b-poisoned": 0, "d-fine": 0}
