"""Sentinel failover (SPEC §5, issue 4): one primary, one replica, three Sentinels; the primary is
SIGKILLed during steady durable traffic sent through a ``redis+sentinel://`` URL."""

from __future__ import annotations

import pytest

from redisbus import Bus

pytest.register_assert_rewrite("tests.cluster_servers")

from tests.cluster_servers import Consumer, Sentinels, bus_on, run_failover  # noqa: E402
from tests.conftest import settings  # noqa: E402

pytest_plugins = ["tests.cluster_servers"]

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
