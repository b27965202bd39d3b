"""``Channel.repair()`` and ``redisbus repair`` (docs/security.md#counters-and-repair): inbox
counters corrupted with raw redis-py are rebuilt from the stream (pending entries of each group plus
entries past its cursor), on both faces, and the repair says what it fixed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from redisbus import AsyncBus, Bus, BusSettings
from redisbus.cli import main
from tests.support.servers import Server

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def busy_channel(bus: Bus, name: str) -> Any:
    """reader: 2 fetched and undone, 1 done, 3 not fetched; other: 1 not fetched."""
    ch = bus.channel(name, **FAST)
    reader, _, writer = ch.join("reader"), ch.join("other"), ch.join("writer")
    for i in range(3):
        writer.send("reader", f"early {i}")
    got = reader.wait(timeout=5).messages
    assert len(got) == 3
    reader.mark_done(got[0])
    for i in range(3):
        writer.send("reader", f"late {i}")
    writer.send("other", "hi")
    return ch


def test_repair_rebuilds_corrupted_counters_and_reports_them(redis7: Server) -> None:
    raw = redis7.client()
    raw.flushall()
    with Bus.from_url(redis7.url, settings=BusSettings(metrics=False)) as bus:
        ch = busy_channel(bus, "rep")
        truth = ch.counts()
        assert truth == {"reader": 5, "other": 1, "writer": 0}
        assert ch.repair() == {}  # nothing to fix
        raw.hset(ch.keys.inbox, mapping={"reader": 3, "other": 40})
        raw.hdel(ch.keys.inbox, "writer")
        raw.hset(ch.keys.inbox, "ghost", 7)  # no such group

        fixed = ch.repair()

        assert fixed == {"reader": (3, 5), "other": (40, 1), "writer": (None, 0), "ghost": (7, 0)}
        assert ch.counts() == truth
        assert ch.repair() == {}


async def test_repair_on_the_async_face(redis7: Server) -> None:
    raw = redis7.client()
    raw.flushall()
    with Bus.from_url(redis7.url, settings=BusSettings(metrics=False)) as bus:
        busy_channel(bus, "rep-async")
    abus = AsyncBus.from_url(redis7.url, settings=BusSettings(metrics=False))
    try:
        ch = await abus.channel("rep-async")
        raw.hset(ch.keys.inbox, "reader", 0)
        assert await ch.repair() == {"reader": (0, 5)}
    finally:
        await abus.aclose()


def test_repair_refuses_past_its_budget_and_changes_nothing(redis7: Server) -> None:
    raw = redis7.client()
    raw.flushall()
    with Bus.from_url(redis7.url, settings=BusSettings(metrics=False)) as bus:
        ch = busy_channel(bus, "rep-budget")
        raw.hset(ch.keys.inbox, "reader", 99)
        with pytest.raises(ValueError, match="needs more than 2"):
            ch.repair(budget=2)
        assert raw.hget(ch.keys.inbox, "reader") == "99"


def test_the_repair_command_prints_what_it_fixed(
    redis7: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = redis7.client()
    raw.flushall()
    with Bus.from_url(redis7.url, settings=BusSettings(metrics=False)) as bus:
        ch = busy_channel(bus, "rep-cli")
    raw.hset(ch.keys.inbox, "reader", 1)
    with pytest.raises(SystemExit, match="0"):
        main(["repair", "rep-cli", "--url", redis7.url, "--json"])
    assert json.loads(capsys.readouterr().out) == {"reader": {"stored": 1, "counted": 5}}
    with pytest.raises(SystemExit, match="0"):
        main(["repair", "rep-cli", "--url", redis7.url])
    assert "every counter matches" in capsys.readouterr().out
