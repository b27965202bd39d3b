"""A Redis outage is two log lines per process, not a traceback per heartbeat: one warning when
the beats start failing, one info line, saying for how long, when a beat succeeds again."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from redisbus import AsyncBus, Bus, BusSettings
from tests.support.servers import Server, start_server, wait_for

PERIOD_S = 0.1
OUTAGE_S = 1.5  # many heartbeat periods, each beat failing after the socket timeout
RECOVERED = re.compile(r"failing for ([\d.]+) s \((\d+) beats\)")


def outage_settings() -> BusSettings:
    return BusSettings(
        metrics=False,
        heartbeat_s=PERIOD_S,
        socket_timeout_s=0.2,
        connect_timeout_s=0.2,
        retry_attempts=0,
        agent_lease_s=60,
    )


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of this test's own: it is frozen with SIGSTOP (never the session's)."""
    s = start_server("redis7", tmp_path)
    yield s
    s.proc.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
    s.stop()


def heart_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.levelno == level and "heartbeat" in r.getMessage().lower()
    ]


def freeze(server: Server) -> None:
    server.proc.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]


def thaw(server: Server) -> None:
    server.proc.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]


def assert_two_lines(caplog: pytest.LogCaptureFixture) -> None:
    failing = heart_lines(caplog, logging.WARNING) + heart_lines(caplog, logging.ERROR)
    recovered = heart_lines(caplog, logging.INFO)
    assert len(failing) == 1, [r.getMessage() for r in failing]
    assert failing[0].levelno == logging.WARNING
    assert len(recovered) == 1, [r.getMessage() for r in recovered]
    m = RECOVERED.search(recovered[0].getMessage())
    assert m is not None, recovered[0].getMessage()
    assert float(m.group(1)) >= OUTAGE_S / 2 and int(m.group(2)) >= 2
    assert not any(r.exc_info for r in caplog.records)


def test_sync_heartbeat_logs_one_line_when_failing_and_one_when_recovered(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="redisbus")
    with Bus.from_url(own_server.url, settings=outage_settings()) as bus:
        bus.channel("beats").join("a")

        freeze(own_server)
        try:
            assert wait_for(lambda: heart_lines(caplog, logging.WARNING), timeout=10)
            time.sleep(OUTAGE_S)  # the outage goes on: every beat of it fails
        finally:
            thaw(own_server)
        assert wait_for(lambda: heart_lines(caplog, logging.INFO), timeout=10)
        time.sleep(3 * PERIOD_S)  # a few good beats: none of them may log

    assert_two_lines(caplog)


async def test_async_heartbeat_logs_one_line_when_failing_and_one_when_recovered(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="redisbus")

    async def until(pred: object, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():  # type: ignore[operator]
                return True
            await asyncio.sleep(0.01)
        return False

    async with AsyncBus.from_url(own_server.url, settings=outage_settings()) as bus:
        await (await bus.channel("beats")).join("a")

        freeze(own_server)
        try:
            assert await until(lambda: heart_lines(caplog, logging.WARNING))
            await asyncio.sleep(OUTAGE_S)
        finally:
            thaw(own_server)
        assert await until(lambda: heart_lines(caplog, logging.INFO))
        await asyncio.sleep(3 * PERIOD_S)

    assert_two_lines(caplog)


def test_serve_waits_out_an_outage_and_handles_what_comes_after(
    own_server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    # given: b served in a thread (sync face), a sender on a second bus
    import threading

    from redisbus._tasks_sync import Event

    caplog.set_level(logging.INFO, logger="redisbus")
    handled: list[str] = []
    stop = Event()
    with (
        Bus.from_url(own_server.url, settings=outage_settings()) as bus,
        Bus.from_url(own_server.url, settings=outage_settings()) as other,
    ):
        b = bus.channel("served").join("b")
        a = other.channel("served").join("a")
        t = threading.Thread(
            target=bus.serve,
            args=({b: lambda agent, m: handled.append(m.body)},),
            kwargs={"stop": stop, "poll_s": 0.2},
        )
        t.start()
        try:
            # when: Redis freezes for many poll periods, then thaws, then a message comes
            freeze(own_server)
            try:
                time.sleep(OUTAGE_S)
            finally:
                thaw(own_server)
            assert wait_for(lambda: heart_lines(caplog, logging.INFO), timeout=10)
            a.send("b", "after the outage")

            # then: serve() is still running and handles it; the outage was one line
            assert wait_for(lambda: handled == ["after the outage"], timeout=10)
            assert t.is_alive()
        finally:
            stop.set()
            t.join(10)
    serving = [r.levelno for r in caplog.records if "serving b" in r.getMessage()]
    # one line when it starts failing, one when it works again (a connection the freeze
    # left dead in the pool may fail once more after that: a second pair at most), never a
    # line per poll, never a traceback
    assert serving[:2] == [logging.WARNING, logging.INFO] and len(serving) <= 4, serving
    assert not any(r.exc_info for r in caplog.records)
