"""An in-memory bus for your own tests, on fakeredis: no server, same API, same scripts.

    from redisbus.testing import memory_bus

    def test_my_agents():
        with memory_bus() as bus:
            ch = bus.channel("t")
            a, b = ch.join("a"), ch.join("b")
            a.send("b", "hi")
            assert b.read()[0].body == "hi"

Several buses made with the same ``server`` share one in-memory Redis, like processes sharing
a real one. The project's contract tests run against this double too, so it behaves like the
real bus; blocking waits are emulated with short sleeps (fakeredis cannot block).

Public API: its ``__all__`` (docs/reference/api.md, docs/getting-started.md#in-your-own-tests).
"""

from __future__ import annotations

from typing import Any

try:
    import fakeredis
    import lupa  # noqa: F401 - fakeredis runs the bus's Lua scripts with it
except ModuleNotFoundError as e:  # an extra, so that a plain install does not pull in Lua
    raise ImportError(
        "redisbus.testing needs fakeredis with its Lua runtime: pip install 'redisbus[testing]'"
    ) from e

from ._settings import BusSettings
from .aio import AsyncBus
from .bus import Bus

__all__ = ["FakeServer", "memory_async_bus", "memory_bus"]

FakeServer = fakeredis.FakeServer


def _settings(settings: BusSettings | None, **overrides: Any) -> BusSettings:
    # the scripts run one by one (EVALSHA): fakeredis's Functions lack the Lua libraries
    # (cmsgpack) that Redis gives a library
    base = settings or BusSettings(metrics=False)
    return base.model_copy(update={"url": "memory://", "functions": False, **overrides})


def memory_bus(
    server: fakeredis.FakeServer | None = None,
    *,
    settings: BusSettings | None = None,
    **overrides: Any,
) -> Bus:
    """A ``Bus`` on an in-memory Redis (a fresh one unless ``server`` is given)."""
    srv = server or fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=srv, decode_responses=True, encoding_errors="replace")
    bus = Bus(client, _settings(settings, **overrides))
    bus.fake_server = srv  # type: ignore[attr-defined]
    return bus


def memory_async_bus(
    server: fakeredis.FakeServer | None = None,
    *,
    settings: BusSettings | None = None,
    **overrides: Any,
) -> AsyncBus:
    """An ``AsyncBus`` on an in-memory Redis (a fresh one unless ``server`` is given)."""
    srv = server or fakeredis.FakeServer()
    client = fakeredis.aioredis.FakeRedis(
        server=srv, decode_responses=True, encoding_errors="replace"
    )
    bus = AsyncBus(client, _settings(settings, **overrides))
    bus.fake_server = srv  # type: ignore[attr-defined]
    return bus
