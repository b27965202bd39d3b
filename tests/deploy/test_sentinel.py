"""Sentinel (docs/delivery.md#redis-cluster-and-sentinel): one primary, one replica, three
Sentinels. The core contract through a ``redis+sentinel://`` URL, then the primary SIGKILLed during
steady durable traffic."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from redisbus import AsyncBus, Bus

pytest.register_assert_rewrite("tests.support.cluster_servers")

from tests.conftest import Synced, settings  # noqa: E402
from tests.contract import test_contract  # noqa: E402
from tests.support.cluster_servers import Consumer, Sentinels, bus_on, run_failover  # noqa: E402

pytest_plugins = ["tests.support.cluster_servers"]

# Collect every contract test here too, run against buses that know only the Sentinels.
globals().update({n: f for n, f in vars(test_contract).items() if n.startswith("test_")})


class SentinelSynced(Synced):
    """The async face behind the sync adapter, inspected on the primary the Sentinels name."""

    sentinels: Sentinels

    @property
    def redis(self) -> Any:
        return redis.Redis(port=self.sentinels.primary(), decode_responses=True)


@pytest.fixture
def make_bus(redis_sentinels: Sentinels, face: str) -> Iterator[Any]:
    """make_bus(sync=False, **settings): a Bus or AsyncBus from the Sentinel URL, flushed."""
    redis_sentinels.wait_healthy()
    redis_sentinels.client().flushall()
    made: list[Any] = []
    loop = asyncio.new_event_loop()

    def make(sync: bool = False, **kw: Any) -> Any:
        s = settings(**kw)
        b: Any
        if face == "sync" or sync:
            b = Bus.from_url(redis_sentinels.url, settings=s)
        else:
            b = SentinelSynced(AsyncBus.from_url(redis_sentinels.url, settings=s), loop)
            b.sentinels = redis_sentinels
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
    loop.close()


FAILOVER_LIMITS = {"inbox_cap": 1_000_000, "pair_rate_burst": 0, "sender_rate_burst": 0}


def test_sentinel_url_reaches_the_primary(redis_sentinels: Sentinels) -> None:
    redis_sentinels.wait_healthy()
    with Bus.from_url(redis_sentinels.url, settings=settings()) as bus:
        ch = bus.channel("sentinel-hello")
        a, b = ch.join("a"), ch.join("b")
        r = a.send("b", "hello")
        assert [m.id for m in b.read()] == [r.id]
        assert redis_sentinels.client().exists(ch.keys.stream)


def test_primary_killed_during_durable_traffic_loses_no_confirmed_message(
    redis_sentinels: Sentinels, face: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # given: a bus that knows only the Sentinels, and a healthy primary/replica pair
    s = redis_sentinels
    s.wait_healthy()
    with bus_on(s.url, face) as bus, bus_on(s.url, face) as other:
        ch = bus.channel(f"sentinel-failover-{face}", **FAILOVER_LIMITS)
        reader = ch.join("reader")
        writer = ch.join("writer")
        live = Consumer(other.channel(ch.name).join("live"))  # served from another Bus

        # when: durable sends flow before, during and after a SIGKILL of the primary; the old
        # primary later returns as a replica
        def heal(port: int) -> None:
            s.restart(port)
            s.wait_healthy()

        with live:
            run = run_failover([(writer, "reader"), (writer, "live")], s.fail_primary, heal)
            live.drain()

        # then: nothing the bus confirmed is missing, and the same Buses worked after promotion
        assert run.new == s.primary() != run.old
        figures = run.verify({ch.name: reader}, {ch.name}) + "; " + run.verify_live(live)
    with capsys.disabled():
        print(f"\n[sentinel failover, {face}] {figures}")
