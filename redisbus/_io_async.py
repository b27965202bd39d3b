"""The async face's Redis boundary: one client, the script SHAs, retries and the wrapping of
Redis errors. Hand-written per face (the sync twin, ``_io_sync``, rides a socket lane of its
own); everything above it is written once, in ``_async/``."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from redis import exceptions as rx

from ._errors import BusClosed, BusConnectionError, RedisbusError
from ._keys import ChannelKeys
from ._redis import (
    AsyncLane,
    backoff_s,
    classify,
    fetch_commands,
    fetch_result,
    routed_failure,
    stream_entries,
)
from ._scripts import source
from ._settings import BusSettings

__all__ = ["IO"]

#: Idle fetch lanes an async bus keeps (each holds a connection); a fetch that finds none
#: idle takes another connection from the pool, handed back after it when this many are idle.
FETCH_LANES = 8


class IO:
    """One Redis client, the script SHAs, and the retry/wrap boundary."""

    def __init__(self, client: Any, settings: BusSettings, cluster: bool) -> None:
        self.r = client
        self.settings = settings
        self.cluster = cluster
        self.sha: dict[str, str] = {}
        self.lane = AsyncLane(client) if not cluster and AsyncLane.usable(client) else None
        # idle lanes for wait()'s blocking fetches, one taken per fetch (each waiting agent
        # blocks on a connection of its own; see ``_on_lane``)
        self.fetch_lanes: builtins.list[AsyncLane] | None = [] if self.lane is not None else None
        # Bumped on every retry: a retried fetch may have delivered entries whose reply was
        # lost, so the agents re-read their own pending entries (see Agent._fetch).
        self.retries = 0
        self.closed = False
        # Cluster: one standalone IO per primary, each on a client (and lanes) of its own to
        # that node, found from the key's slot in redis-py's slot table (see ``_routed``)
        self.nodes: dict[str, IO] = {}
        self._node_settings = settings.model_copy(update={"retry_attempts": 0})

    def check_open(self) -> None:
        if self.closed:
            raise BusClosed("this bus is closed; make a new one to keep talking to Redis")

    async def load(self, name: str) -> str:
        sha = self.sha.get(name)
        if sha is None:
            sha = self.sha[name] = await self.call(self.r.script_load, source(name))
        return sha

    async def _node(self, key: str) -> IO:
        if self.r._initialize:  # redis-py fills its slot table on first use
            await self.r.initialize()
        node = self.r.get_node_from_key(key)
        sub = self.nodes.get(node.name)
        if sub is None:
            import redis.asyncio as aredis

            pool = aredis.ConnectionPool(
                connection_class=node.connection_class,
                max_connections=node.max_connections,
                **node.connection_kwargs,
            )
            client = aredis.Redis(connection_pool=pool)
            sub = self.nodes[node.name] = IO(client, self._node_settings, False)
        return sub

    async def _routed(
        self, key: str, op: Callable[[IO], Awaitable[Any]], *, retry: bool = True
    ) -> Any:
        """Cluster: ``op`` on the standalone IO of the primary serving ``key``'s slot (see
        ``_io_sync.IO._routed``): no ``COMMAND GETKEYS``, one pipelined trip per fetch; MOVED
        and ASK (the node ran nothing) are repeated even for sends, after a refresh of the
        slot table, other trouble only when ``retry`` allows it."""
        self.check_open()
        attempt = 0
        while True:
            try:
                return await op(await self._node(key))
            except (RedisbusError, rx.RedisError, rx.RedisClusterException, OSError) as e:
                again, redirect, err = routed_failure(e, retry=retry)
                if not again or attempt >= max(1, self.settings.retry_attempts):
                    if err is None:
                        raise
                    raise err from e
                self.retries += 1
                await asyncio.sleep(backoff_s(attempt) if attempt or not redirect else 0)
                attempt += 1
                # a refresh that fails (still re-forming) is told by the next try
                with contextlib.suppress(rx.RedisError, rx.RedisClusterException, OSError):
                    await self.r.nodes_manager.initialize()

    async def _by_node(
        self,
        calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]],
        op: Callable[[IO, builtins.list[tuple[str, Sequence[str], Sequence[Any]]]], Any],
        *,
        retry: bool = True,
    ) -> builtins.list[Any]:
        """Cluster: ``calls`` grouped by the node of their first key, each group in one trip
        on that node (``_routed``), the replies back in the calls' order."""
        if self.r._initialize:
            await self._node(calls[0][1][0])
        groups: dict[str, builtins.list[int]] = {}
        for i, (_, k, _) in enumerate(calls):
            try:
                name = self.r.get_node_from_key(k[0]).name
            except rx.RedisClusterException:  # slot not covered now: alone, _routed retries
                name = str(i)
            groups.setdefault(name, []).append(i)
        out: builtins.list[Any] = [None] * len(calls)
        for idx in groups.values():
            part = [calls[i] for i in idx]
            got = await self._routed(part[0][1][0], functools.partial(_swap, op, part), retry=retry)
            for i, r in zip(idx, got, strict=True):
                out[i] = r
        return out

    async def close(self) -> None:
        self.closed = True
        subs, self.nodes = list(self.nodes.values()), {}
        for sub in subs:
            await sub.close()
        if self.lane is not None:
            await self.lane.close()
        lanes, self.fetch_lanes = self.fetch_lanes or [], None
        for lane in lanes:
            await lane.close()
        await self.r.aclose()

    async def call(self, fn: Callable[..., Any], *args: Any, retry: bool = True, **kw: Any) -> Any:
        self.check_open()
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
        self.check_open()
        if self.cluster and keys:
            return await self._routed(
                keys[0], lambda io: io.script(name, keys, args, retry=retry), retry=retry
            )
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
        """Several idempotent script calls: one round trip on a standalone server (on a fetch
        lane: mark_done(), read marks and the like are a wake-up's bookkeeping)."""
        if self.cluster:
            return await self._by_node(calls, lambda io, part: io.scripts(part))
        if len(calls) == 1 and self.fetch_lanes is None:
            return [await self.script(n, k, a) for n, k, a in calls]
        for _ in range(3):
            commands = [("EVALSHA", await self.load(n), len(k), *k, *a) for n, k, a in calls]
            try:
                # on a fetch lane when there are any (the wake-up's mark_done is one of these)
                return list(await self.call(self._on_lane, commands))
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError("could not load scripts")

    async def scripts_raw(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Script calls in one pipeline, not retried (sends); a failed call's slot holds its
        typed error instead of raising. Calls refused for a lost script cache are rerun."""
        self.check_open()
        if self.cluster:
            out = await self._by_node(calls, lambda io, part: io.scripts_raw(part), retry=False)
            for i, (r, (n, k, a)) in enumerate(zip(out, calls, strict=True)):
                if isinstance(r, RedisbusError) and isinstance(r.__cause__, rx.AskError):
                    try:  # MOVED/ASK: not run there; once more on the slot's new node
                        out[i] = await self.script(n, k, a, retry=False)
                    except RedisbusError as e:
                        out[i] = e
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
                return bool(
                    await self._routed(
                        key, lambda io: io.replicate(key, replicas, timeout_s), retry=False
                    )
                )
            else:
                n = await self.call(self.r.wait, replicas, ms, retry=False)
        except BusConnectionError:
            return False
        return int(n) >= replicas

    async def watch(
        self, stream: str, after: str, block_ms: int
    ) -> builtins.list[tuple[str, dict[str, str] | None]]:
        """Entries after ``after`` (XREAD, blocking up to ``block_ms``), outside every consumer
        group: looking changes no agent's state (``ask()`` watches for its reply this way)."""
        if self.cluster:
            return await self._routed(  # type: ignore[no-any-return]
                stream, lambda io: io.watch(stream, after, block_ms)
            )
        res = await self.call(self.r.xread, {stream: after}, count=100, block=block_ms)
        return stream_entries(res)

    async def fetch(
        self,
        keys: ChannelKeys,
        group: str,
        consumer: str,
        cursor: str,
        block_ms: int | None,
        settle: builtins.list[str] | None,
        mark_after: str | None = None,
        replay_keep_ms: int = 0,
    ) -> tuple[builtins.list[tuple[str, dict[str, str] | None]], int, int, str | None]:
        """XREADGROUP (blocking when block_ms) and the Redis clock at its return, in one trip,
        with the deferred ``settle`` ops before it and, with ``mark_after``, the "n" op right
        after it (``_redis.fetch_commands``, one source for both faces): what the fetch returns
        is marked read on the server before the reply comes back."""
        self.check_open()
        if self.cluster:
            return await self._routed(  # type: ignore[no-any-return]
                keys.stream,
                lambda io: io.fetch(
                    keys, group, consumer, cursor, block_ms, settle, mark_after, replay_keep_ms
                ),
            )
        for _ in range(3):
            try:
                sha = await self.load("settle") if settle or mark_after is not None else ""
                commands = fetch_commands(
                    sha, keys, group, consumer, cursor, block_ms, settle, mark_after, replay_keep_ms
                )
                out = await self.call(self._on_lane, commands)
                break
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        else:
            raise RedisbusError("could not load scripts")
        return fetch_result(out, bool(settle), mark_after is not None)

    async def _on_lane(self, commands: builtins.list[tuple[Any, ...]]) -> builtins.list[Any]:
        """Raw commands in one round trip on a fetch lane (a held connection, written to and
        read from directly, as the sync face's lane; ``redis.asyncio``'s pipeline costs more
        in Python than the wake-up costs the server), else a redis-py pipeline (spent on each
        try). The first error reply raises. Up to ``FETCH_LANES`` idle lanes are kept; the
        connections of the others go back to the pool (every reply read: in step), and a lane
        that failed dropped its connection and opens a fresh one when next used."""
        lanes = self.fetch_lanes
        if lanes is None:
            pipe = self.r.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            out: builtins.list[Any] = await pipe.execute(raise_on_error=False)
        else:
            lane = lanes.pop() if lanes else AsyncLane(self.r)
            try:
                out = await lane.run_many(commands)
            finally:
                if self.fetch_lanes is lanes and len(lanes) < FETCH_LANES:
                    lanes.append(lane)
                else:  # its connection goes back to the pool, open and in step, for reuse
                    conn, lane.conn, lane.reader = lane.conn, None, None
                    if conn is not None:
                        await lane.pool.release(conn)
        for reply in out:
            if isinstance(reply, rx.ResponseError):
                raise reply
        return out


def _swap(op: Callable[[Any, Any], Any], part: Any, io: Any) -> Any:
    return op(io, part)
