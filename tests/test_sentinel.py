"""Sentinel failover (SPEC §5, issue 4): one primary, one replica, three Sentinels; the primary is
SIGKILLed during steady durable traffic sent through a ``redis+sentinel://`` URL."""

from __future__ import annotations

import time

import pytest

from redisbus import Bus

pytest.register_assert_rewrite("tests.cluster_servers")

from tests.cluster_servers import Sentinels, Traffic, read_everything, wait_until  # noqa: E402
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
    redis_sentinels: Sentinels, capsys: pytest.CaptureFixture[str]
) -> None:
    # given: a bus that knows only the Sentinels, and a healthy primary/replica pair
    s = redis_sentinels
    s.wait_healthy()
    bus = Bus.from_url(s.url, settings=settings())
    ch = bus.channel("sentinel-failover", **FAILOVER_LIMITS)
    reader = ch.join("reader")
    writer = ch.join("writer")
    t0 = time.monotonic()

    # when: durable sends flow before, during and after a SIGKILL of the primary; the old
    # primary later returns as a replica (until then WAIT cannot reach one)
    try:
        with Traffic([(writer, "reader")]) as traffic:
            wait_until(lambda: traffic.sent_count() >= 200, 10, "traffic before the kill")
            at_kill = traffic.out.attempted
            old, new = s.fail_primary()
            promoted_after = time.monotonic() - t0
            at_promotion = traffic.out.attempted
            s.restart(old)
            s.wait_healthy()
            healed = len(traffic.out.confirmed)
            wait_until(
                lambda: len(traffic.out.confirmed) >= healed + 300,
                20,
                "confirmed sends after the old primary rejoined",
            )
        out = traffic.out

        # then: nothing the bus confirmed is missing, and the same Bus worked after promotion
        assert new != old
        assert not out.errors, out.errors[:5]
        stored = read_everything(reader)
        missing = {b: i for b, (_, i) in out.confirmed.items() if stored.get(b) != i}
        assert not missing, f"{len(missing)} confirmed durable sends missing: {list(missing)[:5]}"
        assert set(stored) <= set(out.confirmed) | set(out.unreached) | set(out.unconfirmed)
        seqs = sorted(int(b[2:]) for b in out.confirmed)
        assert seqs[0] < at_kill and seqs[-1] >= at_promotion
        phases = {
            "before": sum(q < at_kill for q in seqs),
            "during": sum(at_kill <= q < at_promotion for q in seqs),
            "after": sum(q >= at_promotion for q in seqs),
        }
        unreached_kept = sum(stored.get(b) == i for b, (_, i) in out.unreached.items())
        with capsys.disabled():
            print(
                f"\n[sentinel failover] killed {old} after {at_kill} sends, {new} promoted at "
                f"{promoted_after:.1f} s; {out.summary()}; confirmed by phase {phases}; "
                f"returned-without-replica-ack still stored: {unreached_kept}/{len(out.unreached)}"
            )
    finally:
        bus.close()
