"""The sync face's Redis boundary: one client, the script SHAs, retries and the wrapping of
Redis errors, on the socket lane where it is free. Hand-written per face (the async twin is
``_io_async``); everything above it is generated from ``_async/``."""

from __future__ import annotations

import builtins
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as rx

from ._errors import BusClosed, BusConnectionError, RedisbusError
from ._keys import ChannelKeys
from ._redis import (
    Lane,
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


class IO:
    """One Redis client, the script SHAs, and the retry/wrap boundary."""

    def __init__(self, client: Any, settings: BusSettings, cluster: bool) -> None:
        self.r = client
        self.settings = settings
        self.cluster = cluster
        self.sha: dict[str, str] = {}
        self.lane = Lane(client) if not cluster and Lane.usable(client) else None
        # a second one for wait()'s blocking fetches, so a waiting thread never keeps the
        # scripts' lane from the others
        self.fetch_lane = Lane(client) if self.lane is not None else None
        # Bumped on every retry: a retried fetch may have delivered entries whose reply was
        # lost, so the agents re-read their own pending entries (see Agent._fetch).
        self.retries = 0
        self.closed = False
        # Cluster: one standalone IO per primary, each on its node's own client (and lane),
        # found from the key's slot in redis-py's slot table (see ``_routed``)
        self.nodes: dict[str, IO] = {}
        self._node_settings = settings.model_copy(update={"retry_attempts": 0})

    def check_open(self) -> None:
        if self.closed:
            raise BusClosed("this bus is closed; make a new one to keep talking to Redis")

    def load(self, name: str) -> str:
        sha = self.sha.get(name)
        if sha is None:
            sha = self.sha[name] = self.call(self.r.script_load, source(name))
        return sha

    def call(self, fn: Callable[..., Any], *args: Any, retry: bool = True, **kw: Any) -> Any:
        self.check_open()
        attempt = 0
        while True:
            try:
                return fn(*args, **kw)
            except (rx.RedisError, rx.RedisClusterException, OSError) as e:
                action, err = classify(e)
                if action == "reload":
                    self.sha.clear()
                    raise err from e
                if action == "retry" and retry and attempt < self.settings.retry_attempts:
                    self.retries += 1
                    time.sleep(backoff_s(attempt))
                    attempt += 1
                    continue
                raise err from e

    def script(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool = True
    ) -> Any:
        self.check_open()
        if self.cluster and keys:
            return self._routed(
                keys[0], lambda io: io.script(name, keys, args, retry=retry), retry=retry
            )
        lane, sha = self.lane, self.sha.get(name)
        if lane is not None and sha is not None:
            # the hot path: straight onto the lane; any trouble is classified as call() would
            # and, when it may be repeated, handed to the general path below
            try:
                reply = lane.run("EVALSHA", sha, len(keys), *keys, *args)
            except (rx.RedisError, OSError) as e:
                action, err = classify(e)
                if action == "raise" or (action == "retry" and not retry):
                    raise err from e
                if action == "reload":
                    self.sha.clear()
                else:
                    self.retries += 1
                    time.sleep(backoff_s(0))
            else:
                if reply is not Lane.BUSY:
                    return reply
        for _ in range(3):
            sha = self.load(name)
            try:
                return self.call(self._evalsha, sha, keys, args, retry=retry)
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError(f"could not load script {name}")

    def _evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.lane is not None:
            reply = self.lane.run("EVALSHA", sha, len(keys), *keys, *args)
            if reply is not Lane.BUSY:
                return reply
        return self.r.evalsha(sha, len(keys), *keys, *args)

    def _node(self, key: str) -> IO:
        node = self.r.get_node_from_key(key)
        sub = self.nodes.get(node.name)
        if sub is None or sub.r is not node.redis_connection:
            sub = self.nodes[node.name] = IO(node.redis_connection, self._node_settings, False)
        return sub

    def _routed(self, key: str, op: Callable[[IO], Any], *, retry: bool = True) -> Any:
        """Cluster: ``op`` on the standalone IO of the primary serving ``key``'s slot (every
        key of a channel shares one slot), so a call costs what it costs on one server: no
        ``COMMAND GETKEYS``, one pipelined trip per fetch. MOVED and ASK mean the node ran
        nothing, so they are repeated even for sends, after a refresh of the slot table;
        other trouble is repeated, after the same refresh, only when ``retry`` allows it."""
        self.check_open()
        attempt = 0
        while True:
            try:
                return op(self._node(key))
            except (RedisbusError, rx.RedisError, rx.RedisClusterException, OSError) as e:
                again, redirect, err = routed_failure(e, retry=retry)
                if not again or attempt >= max(1, self.settings.retry_attempts):
                    if err is None:
                        raise
                    raise err from e
                self.retries += 1
                time.sleep(backoff_s(attempt) if attempt or not redirect else 0)
                attempt += 1
                # a refresh that fails (still re-forming) is told by the next try
                with contextlib.suppress(rx.RedisError, rx.RedisClusterException, OSError):
                    self.r.nodes_manager.initialize()

    def close(self) -> None:
        self.closed = True
        for sub in self.nodes.values():
            for lane in (sub.lane, sub.fetch_lane):
                if lane is not None:
                    lane.close()
        for lane in (self.lane, self.fetch_lane):
            if lane is not None:
                lane.close()
        self.r.close()

    def scripts(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Several idempotent script calls: one round trip on a standalone server."""
        if self.cluster:
            return self._by_node(calls, lambda io, part: io.scripts(part))
        if len(calls) == 1:
            return [self.script(n, k, a) for n, k, a in calls]
        for _ in range(3):
            commands = [("EVALSHA", self.load(n), len(k), *k, *a) for n, k, a in calls]
            try:
                return list(self.call(self._on_lane, self.lane, commands))
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError("could not load scripts")

    def scripts_raw(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Script calls in one round trip (on the lane when it is free, else a redis-py
        pipeline), not retried (sends); a failed call's slot holds its typed error instead of
        raising. Calls refused for a lost script cache are rerun."""
        self.check_open()
        if self.cluster:
            out = self._by_node(calls, lambda io, part: io.scripts_raw(part), retry=False)
            for i, (r, (n, k, a)) in enumerate(zip(out, calls, strict=True)):
                if isinstance(r, RedisbusError) and isinstance(r.__cause__, rx.AskError):
                    try:  # MOVED/ASK: not run there; once more on the slot's new node
                        out[i] = self.script(n, k, a, retry=False)
                    except RedisbusError as e:
                        out[i] = e
            return out
        commands = [("EVALSHA", self.load(n), len(k), *k, *a) for n, k, a in calls]
        try:
            raw = Lane.BUSY if self.lane is None else self.lane.run_many(commands)
            if raw is Lane.BUSY:
                pipe = self.r.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                raw = pipe.execute(raise_on_error=False)
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
        out = []
        for (n, k, a), r in zip(calls, raw, strict=True):
            if isinstance(r, rx.NoScriptError):
                self.sha.clear()
                try:
                    r = self.script(n, k, a, retry=False)
                except RedisbusError as e:
                    r = e
            elif isinstance(r, Exception):
                err = classify(r)[1]
                err.__cause__ = r
                r = err
            out.append(r)
        return out

    def replicate(self, key: str, replicas: int, timeout_s: float) -> bool:
        """WAIT for ``replicas`` replicas of the node holding ``key``; False when not reached.

        Never retried: after a reconnect WAIT would vouch for whatever node answers then
        (perhaps a newly promoted primary), not for this write. A dropped WAIT is False."""
        ms = max(1, int(timeout_s * 1000))
        try:
            if self.cluster:
                return bool(
                    self._routed(
                        key, lambda io: io.replicate(key, replicas, timeout_s), retry=False
                    )
                )
            else:
                n = self.call(self.r.wait, replicas, ms, retry=False)
        except BusConnectionError:
            return False
        return int(n) >= replicas

    def watch(
        self, stream: str, after: str, block_ms: int
    ) -> builtins.list[tuple[str, dict[str, str] | None]]:
        """Entries after ``after`` (XREAD, blocking up to ``block_ms``), outside every consumer
        group: looking changes no agent's state (``ask()`` watches for its reply this way)."""
        if self.cluster:
            return self._routed(stream, lambda io: io.watch(stream, after, block_ms))  # type: ignore[no-any-return]
        command = ("XREAD", "COUNT", 100, "BLOCK", block_ms, "STREAMS", stream, after)
        return stream_entries(self.call(self._on_lane, self.fetch_lane, [command])[0])

    def fetch(
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
            return self._routed(  # type: ignore[no-any-return]
                keys.stream,
                lambda io: io.fetch(
                    keys, group, consumer, cursor, block_ms, settle, mark_after, replay_keep_ms
                ),
            )
        for _ in range(3):
            try:
                sha = self.load("settle") if settle or mark_after is not None else ""
                commands = fetch_commands(
                    sha, keys, group, consumer, cursor, block_ms, settle, mark_after, replay_keep_ms
                )
                out = self.call(self._on_lane, self.fetch_lane, commands)
                break
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        else:
            raise RedisbusError("could not load scripts")
        return fetch_result(out, bool(settle), mark_after is not None)

    def _by_node(
        self,
        calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]],
        op: Callable[[IO, builtins.list[tuple[str, Sequence[str], Sequence[Any]]]], Any],
        *,
        retry: bool = True,
    ) -> builtins.list[Any]:
        """Cluster: ``calls`` grouped by the node of their first key, each group in one trip
        on that node (``_routed``), the replies back in the calls' order."""
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
            got = self._routed(part[0][1][0], functools.partial(_swap, op, part), retry=retry)
            for i, r in zip(idx, got, strict=True):
                out[i] = r
        return out

    def _on_lane(
        self, lane: Lane | None, commands: builtins.list[tuple[Any, ...]]
    ) -> builtins.list[Any]:
        """Raw commands in one round trip: on ``lane`` when it is free, else a redis-py
        pipeline (spent on each try). The first error reply raises."""
        out: Any = Lane.BUSY
        if lane is not None:
            out = lane.run_many(commands)
        if out is Lane.BUSY:
            pipe = self.r.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            out = pipe.execute(raise_on_error=False)
        for reply in out:
            if isinstance(reply, rx.ResponseError):
                raise reply
        return out  # type: ignore[no-any-return]


def _swap(op: Callable[[Any, Any], Any], part: Any, io: Any) -> Any:
    return op(io, part)
