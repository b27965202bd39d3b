"""What an operator sees of the fleet (docs/runbook.md, docs/deployment.md): the exporter says how
many channels its cap left out and which version it runs, janitors' dead letters reach a
counter whichever process made them, a send refused before it reaches Redis is counted, an
agent host exports no ``_created`` duplicates, and its ``host`` label can be kept to a few
values."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from redisbus import Bus, BusSettings, InvalidInput
from redisbus.exporter import Exporter, ExporterSettings
from redisbus.metrics import BusMetrics, build_version
from tests.deploy.test_exporter import FAST, gauge, run_cli, scrape
from tests.support.servers import start_server


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False, host="test-host"))
    yield b
    b.close()


@pytest.fixture
def exporter(redis_url: str) -> Iterator[Callable[..., Exporter]]:
    """Exporters on free loopback ports against ``redis_url`` (refresh() by hand)."""
    started: list[Exporter] = []

    def start(**options: Any) -> Exporter:
        base: dict[str, Any] = {
            "url": redis_url,
            "exporter_port": 0,
            "exporter_addr": "127.0.0.1",
            "exporter_interval_s": 3600,
            "janitor": False,
        }
        e = Exporter(ExporterSettings(**{**base, **options})).start()
        started.append(e)
        return e

    yield start
    for e in started:
        e.stop()


def make_dead_letter(bus: Bus, channel: str) -> None:
    """A message delivered once (max_deliveries=1) whose lease ran out: the next sweep
    dead-letters it."""
    ch = bus.channel(channel, lease_s=0.05, max_deliveries=1, **FAST)
    boss, worker = ch.join("boss"), ch.join("worker")
    boss.send("worker", "a handler that never finishes")
    assert len(worker.read()) == 1
    time.sleep(0.1)


# -- the exporter's cap -------------------------------------------------------------------------


def test_the_exporter_exports_how_many_channels_its_cap_left_out(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given three channels, each with a dead letter
    for name in ("c-a", "c-b", "c-c"):
        make_dead_letter(bus, name)
        bus.channel(name).sweep()
    # when the exporter may read one channel per pass
    capped = scrape(exporter(exporter_max_channels=1).port)
    full = scrape(exporter().port)
    # then it says it left two out, so a total of 1 is not taken for the fleet's
    assert gauge(capped, "redisbus_exporter_channels_skipped") == 2
    assert gauge(capped, "redisbus_dead_letters") == 1
    assert gauge(full, "redisbus_exporter_channels_skipped") == 0
    assert gauge(full, "redisbus_dead_letters") == 3


# -- build info ---------------------------------------------------------------------------------


def test_the_exporter_exports_its_build_info_even_while_redis_is_down(tmp_path: Path) -> None:
    # given an exporter reading a Redis
    server = start_server("redis7", tmp_path / "redis")
    try:
        settings = ExporterSettings(
            url=server.url, exporter_port=0, exporter_addr="127.0.0.1",
            exporter_interval_s=3600, janitor=False,
        )  # fmt: skip
        with Exporter(settings) as e:
            # then it reports its version as every agent host does
            assert gauge(scrape(e.port), "redisbus_build_info", version=build_version()) == 1
            # and still does once Redis is gone (the "Versions running" panel keeps it)
            server.stop()
            e.refresh()
            samples = scrape(e.port)
            assert gauge(samples, "redisbus_exporter_redis_up") == 0
            assert gauge(samples, "redisbus_build_info", version=build_version()) == 1
    finally:
        server.stop()


# -- janitors' dead letters ---------------------------------------------------------------------


def test_dead_letters_of_the_janitor_command_reach_the_exporters_counter(
    redis_url: str, bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given an exporter that counts no janitor dead letter yet
    e = exporter()
    assert gauge(scrape(e.port), "redisbus_janitor_dead_lettered_total") == 0
    # when `redisbus janitor --once`, a process with no /metrics, dead-letters a message
    make_dead_letter(bus, "jobs")
    p = run_cli("janitor", "--once", REDISBUS_URL=redis_url)
    assert p.returncode == 0, p.stderr
    assert "1 dead-lettered" in p.stdout
    # then the exporter's next read counts it
    e.refresh()
    assert gauge(scrape(e.port), "redisbus_janitor_dead_lettered_total") == 1


def test_dead_letters_of_the_exporters_own_janitor_are_counted_too(
    bus: Bus, exporter: Callable[..., Exporter]
) -> None:
    # given two dead letters waiting for a janitor, and one counted already by another
    e = exporter()
    make_dead_letter(bus, "jobs-1")
    bus.channel("jobs-1").sweep()  # a sweep is not a janitor pass: not counted
    make_dead_letter(bus, "jobs-2")
    make_dead_letter(bus, "jobs-3")
    # when the exporter's janitor runs a pass
    assert e.sweep()
    e.refresh()
    # then the counter holds the two it made
    assert gauge(scrape(e.port), "redisbus_janitor_dead_lettered_total") == 2


# -- client metrics -----------------------------------------------------------------------------


def test_a_send_refused_before_it_reaches_redis_is_counted(redis_url: str) -> None:
    # given a bus recording into a registry of its own
    registry = CollectorRegistry()
    with Bus.from_url(redis_url, metrics=BusMetrics(registry, host="host-a")) as bus:
        ch = bus.channel("refusals", **FAST)
        sender = ch.join("sender")
        ch.join("b")
        # when sends are refused by the client itself, before any script runs
        for _ in range(3):
            with pytest.raises(InvalidInput):
                sender.send("b", "hi", subject=None)  # type: ignore[call-overload]  # on purpose
        # then each refusal is counted, with its reason
        counted = registry.get_sample_value(
            "redisbus_send_rejected_total", {"reason": "invalid_input", "host": "host-a"}
        )
        assert counted == 3


def test_an_agent_host_exports_no_created_series() -> None:
    # given an agent host's metrics after some traffic
    registry = CollectorRegistry()
    m = BusMetrics(registry, host="host-a")
    m.sent("message")
    m.delivered(0.01)
    # then no series is a _created timestamp, and about sixty series remain per host
    lines = [x for x in generate_latest(registry).decode().splitlines() if x[:1] != "#"]
    assert not [x for x in lines if "_created" in x]
    assert 50 <= len(lines) <= 70, len(lines)


def test_metrics_host_keeps_the_host_label_to_few_values() -> None:
    # given hosts named after their pods
    pods = [BusSettings(host=f"agent-{i}-7f9c", metrics_host="pool-a") for i in range(3)]
    # then their metrics carry the pool's name, not the pod's
    assert {BusMetrics.from_settings(s, CollectorRegistry()).host for s in pods} == {"pool-a"}
    # and without the setting the host is the label; empty drops it
    assert BusMetrics.from_settings(BusSettings(host="h1"), CollectorRegistry()).host == "h1"
    registry = CollectorRegistry()
    BusMetrics.from_settings(BusSettings(host="h1", metrics_host=""), registry).sent("message")
    assert "host=" not in generate_latest(registry).decode().replace('host=""', "")


def test_the_bus_labels_its_metrics_with_metrics_host(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given REDISBUS_METRICS_HOST set beside a per-pod REDISBUS_HOST
    monkeypatch.setenv("REDISBUS_HOST", "agent-42-7f9c")
    monkeypatch.setenv("REDISBUS_METRICS_HOST", "pool-a")
    # when a bus is built from the environment
    with Bus.from_url(redis_url) as bus:
        # then its metrics say the pool, and its replicas are still named after the pod
        assert bus.metrics.host == "pool-a"
        assert bus.settings.consumer.startswith("agent-42-7f9c/")
