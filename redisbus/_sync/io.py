# Generated from redisbus/_async/io.py by scripts/unasync.py: do not edit.
"""The Redis boundary: one client, how it names the scripts (a Functions library, or SHAs),
retries, the wrapping of Redis errors and the routing of Cluster calls to their node.

Written once, in ``_async/io.py``, for both faces (``_sync/io.py`` is generated from it).
Where the faces differ, in the lanes the round trips ride on and in how they sleep, each has a
hand-written transport giving the same names (here ``_transport_sync``)."""

from __future__ import annotations

import builtins
import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

from redis import exceptions as rx

from .._bindings import Call, FetchKeys, unrung, with_bells
from .._errors import BusClosed, BusConnectionError, RedisbusError
from .._redis import backoff_s, classify, fetch_commands, fetch_result, stream_entries
from .._resp import gone
from .._scripts import function_name, library, source
from .._settings import BusSettings
from .._transport_sync import Transport, Trip, moved, node_client, sleep, slot_table

__all__ = ["IO"]

Command = tuple[Any, ...]

#: How many times a call is made again with the doorbells its script asked for (``unrung``):
#: each time, the members the script found were not all among those it was given, because
#: agents joined in between.
UNRUNG_TRIES = 5
#: MOVED replies one call follows in a row (backing off from the second: 3 to 7 s in all)
REDIRECTS = 10


class IO:
    """One Redis client, how it names the scripts, and the retry/wrap boundary."""

    def __init__(self, client: Any, settings: BusSettings, cluster: bool) -> None:
        self.r = client
        self.settings = settings
        self.cluster = cluster
        # script name -> what a call names after `verb`: its function in the library
        # ("FCALL"), or its SHA ("EVALSHA") where the server has no Functions (Redis 6.2, the
        # test double) or the bus's user may not load them (FUNCTION LOAD refused)
        self.sha: dict[str, str] = {}
        self.verb = "EVALSHA"
        self.library: bool | None = None if settings.functions else False
        self.transport = Transport(client)
        # Bumped on every retry: a retried fetch may have delivered entries whose reply was
        # lost, so the agents re-read their own pending entries (see Agent._fetch).
        self.retries = 0
        self.closed = False
        # Cluster: one standalone IO per primary, each on a client (and lanes) of its own to
        # that node, found from the key's slot in redis-py's slot table (see ``_routed``)
        self.nodes: dict[str, IO] = {}
        self._node_settings = settings.model_copy(update={"retry_attempts": 0})
        # members whose doorbells a script asked for, by channel stream (``learn``)
        self.rosters: dict[str, dict[str, None]] = {}

    def check_open(self) -> None:
        if self.closed:
            raise BusClosed("this bus is closed; make a new one to keep talking to Redis")

    def load(self, name: str) -> str:
        """What a call of script ``name`` names after ``verb``, loading it first: the library,
        once per server (then every script is a function of it), else the script's SHA."""
        got = self.sha.get(name)
        if got is None:
            if self.library is None:
                self.library = self._load_library()
                self.verb = "FCALL" if self.library else "EVALSHA"
            if self.library:
                got = function_name(name)
            else:
                got = self.call(self.r.script_load, source(name))
            self.sha[name] = got
        return got

    def _load_library(self) -> bool:
        """FUNCTION LOAD the scripts' library; False where the server refuses it (no Functions:
        an unknown command; an ACL user without the right: NOPERM), so the scripts run by
        EVALSHA instead."""
        try:
            self.call(self.r.execute_command, "FUNCTION", "LOAD", library()[1])
        except RedisbusError as e:
            cause = e.__cause__
            if isinstance(cause, rx.ResponseError) and "already exists" in str(cause):
                return True  # another client loaded it: its name is its code's digest
            if isinstance(cause, rx.ResponseError):
                return False
            raise
        return True

    def command(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Command:
        """The command of one call of script ``name``."""
        handle = self.load(name)
        return (self.verb, handle, len(keys), *keys, *args)

    def forget(self) -> None:
        """The server lost the scripts (NOSCRIPT, or no such function: a restart without
        persistence, a failover to a node that never had them, SCRIPT or FUNCTION FLUSH):
        load them again before the next call."""
        self.sha.clear()
        if self.library:
            self.library = None

    def close(self) -> None:
        self.closed = True
        subs, self.nodes = list(self.nodes.values()), {}
        for sub in subs:
            sub.close()
        self.transport.close()
        self.r.close()

    # -- calls, retried ---------------------------------------------------------------------
    def call(self, fn: Callable[..., Any], *args: Any, retry: bool = True, **kw: Any) -> Any:
        """``fn(*args, **kw)``, a Redis error raised as its redisbus error; repeated after a
        backoff, up to ``retry_attempts`` times, when the trouble may pass and ``retry``
        allows it. A lost script cache forgets the SHAs (the caller loads them again)."""
        self.check_open()
        attempt = 0
        while True:
            try:
                return fn(*args, **kw)
            except (rx.RedisError, rx.RedisClusterException, OSError) as e:
                self._failed(e, attempt, retry)
                attempt += 1

    def _failed(self, e: BaseException, attempt: int, retry: bool) -> None:
        """Try ``attempt`` (from 0) of a call failed with ``e``: return, after a backoff, when
        the call may be repeated (the trouble may pass and ``retry`` allows it); else raise
        the redisbus error for ``e`` (for a lost script cache, once the SHAs are forgotten)."""
        action, err = classify(e)
        if action == "reload":
            self.forget()
        elif action == "retry" and retry and attempt < self.settings.retry_attempts:
            self.retries += 1
            sleep(backoff_s(attempt))
            return
        raise err from e

    def script(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool = True
    ) -> Any:
        """One script call, repeated as ``call`` repeats (only when ``retry`` allows it)."""
        if self.cluster and keys:
            return self._routed(
                keys[0], lambda io: io.script(name, keys, args, retry=retry), retry=retry
            )
        call = Call(name, keys, args)
        for _ in range(UNRUNG_TRIES):
            command = self.command(*call)
            reply = (self._scripted("call", [command], [name], retry))[0]
            names = unrung(call, reply)
            if names is None:
                return reply
            self.learn(keys[0], names)
            call = with_bells(call, names)
        raise RedisbusError(
            f"{name}.lua kept asking for more doorbells: the channel's members kept changing"
        )

    def learn(self, stream: str, names: Sequence[str]) -> None:
        """Members of the channel whose stream is ``stream`` this bus met: its own joins, and
        those whose doorbells a script asked for."""
        self.rosters.setdefault(stream, {}).update(dict.fromkeys(names))

    def known(self, stream: str) -> builtins.list[str]:
        """The members of the channel whose stream is ``stream`` this bus met so far (``learn``):
        the doorbells a broadcast is given first."""
        return builtins.list(self.rosters.get(stream, ()))

    def scripts(self, calls: Sequence[Call]) -> builtins.list[Any]:
        """Several idempotent script calls: one round trip on a standalone server (a wake-up's
        bookkeeping: mark_done(), read marks and the like)."""
        if self.cluster:
            return self._by_node(calls, lambda io, part: io.scripts(part))
        commands = [self.command(n, k, a) for n, k, a in calls]
        return self._scripted("call", commands, [n for n, _, _ in calls])

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
            return self._routed(  # type: ignore[no-any-return]
                stream, lambda io: io.watch(stream, after, block_ms)
            )
        command = ("XREAD", "COUNT", 100, "BLOCK", block_ms, "STREAMS", stream, after)
        (reply,) = self.call(self._trip, "fetch", [command])
        return stream_entries(reply)

    def fetch(
        self,
        keys: FetchKeys,
        group: str,
        consumer: str,
        block_ms: int | None,
        settle: builtins.list[str] | None,
        replay_keep_ms: int,
    ) -> tuple[builtins.list[tuple[str, dict[str, str] | None]], int, int, str | None]:
        """The blocking pop of ``group``'s wakeup list (when block_ms) and wake.lua right after
        it, in one trip, with the deferred ``settle`` ops before them
        (``_redis.fetch_commands``): what the fetch returns is marked read on the server
        before the reply comes back."""
        self.check_open()
        if self.cluster:
            return self._routed(  # type: ignore[no-any-return]
                keys.wakeup,  # (the channel's hash tag, as every key of the fetch)
                lambda io: io.fetch(keys, group, consumer, block_ms, settle, replay_keep_ms),
            )
        scripts = ["settle", "wake"] if settle else ["wake"]
        shas = (self.load("settle") if settle else "", self.load("wake"))
        commands = fetch_commands(
            self.verb, shas, keys, group, consumer, block_ms, settle, replay_keep_ms
        )

        # a repeat does not block: the failed try's pop may have taken the wakeup
        def again() -> builtins.list[Command]:
            return fetch_commands(
                self.verb, shas, keys, group, consumer, None, settle, replay_keep_ms
            )

        out = self._scripted("fetch", commands, scripts, again=again)
        return fetch_result(out)

    # -- sends: not retried, each call's reply or error in its slot -------------------------
    def scripts_raw(self, calls: Sequence[Call]) -> builtins.list[Any]:
        """Script calls in one round trip, not retried (sends); a failed call's slot holds its
        typed error instead of raising. Calls refused for a lost script cache are rerun."""
        self.check_open()
        if self.cluster:
            out = self._by_node(calls, lambda io, part: io.scripts_raw(part), retry=False)
            for i, (r, (n, k, a)) in enumerate(zip(out, calls, strict=True)):
                if isinstance(r, RedisbusError) and isinstance(r.__cause__, rx.AskError):
                    if isinstance(r.__cause__, rx.MovedError):
                        moved(self.r, r.__cause__)
                    try:  # MOVED/ASK: not run there; once more on the slot's new node
                        out[i] = self.script(n, k, a, retry=False)
                    except RedisbusError as e:
                        out[i] = e
            return out
        commands = [self.command(n, k, a) for n, k, a in calls]
        try:
            raw = self._trip("send", commands, raw=True)
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
        out = []
        for (n, k, a), r in zip(calls, raw, strict=True):
            if isinstance(r, rx.NoScriptError):
                self.forget()
                try:
                    r = self.script(n, k, a, retry=False)
                except RedisbusError as e:
                    r = e
            elif isinstance(r, Exception):
                err = classify(r)[1]
                err.__cause__ = r
                r = err
            elif (names := unrung(Call(n, k, a), r)) is not None:
                # it wrote nothing: once more, alone, given the doorbells it asked for
                self.learn(k[0], names)
                try:
                    r = self.script(*with_bells(Call(n, k, a), names), retry=False)
                except RedisbusError as e:
                    r = e
            out.append(r)
        return out

    # -- round trips ------------------------------------------------------------------------
    def _scripted(
        self,
        trip: Trip,
        commands: builtins.list[Command],
        scripts: builtins.list[str],
        retry: bool = True,
        again: Callable[[], builtins.list[Command]] | None = None,
    ) -> builtins.list[Any]:
        """``commands``, with EVALSHAs of the ``scripts``, in one round trip (``_trip``),
        repeated as ``call`` repeats (``again``, when given, makes what a repeat sends). When the
        server lost the scripts (NOSCRIPT, or no such function: a restart, a failover, a
        flush) they are loaded again and the commands sent again as they are (a SHA, a
        function's name: both are their code's digest), three tries in all."""
        self.check_open()
        attempt = tries = 0
        while True:
            try:
                return self._trip(trip, commands)
            except rx.NoScriptError as e:
                commands = again() if again else commands
                tries += 1
                if tries == 3:
                    raise RedisbusError(f"could not load {', '.join(scripts)}") from e
                self.forget()
                for name in scripts:
                    self.load(name)
            except (rx.RedisError, rx.RedisClusterException, OSError) as e:
                self._failed(e, attempt, retry)
                attempt += 1
                commands = again() if again else commands

    def _trip(
        self, trip: Trip, commands: builtins.list[Command], *, raw: bool = False
    ) -> builtins.list[Any]:
        """Commands in one round trip, their replies in order: on the lane the transport gives
        this kind of trip, else in a redis-py pipeline (spent on each try), which the pool
        serves. The first error reply raises (for ``call`` to classify), unless ``raw``: then
        each sits in its slot."""
        lane = self.transport.acquire(trip)
        if lane is None:
            pipe = self.r.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            out = [
                gone(r) if isinstance(r, rx.ResponseError) else r
                for r in pipe.execute(raise_on_error=False)
            ]
        else:
            try:
                out = lane.run(commands)
            finally:
                self.transport.release(lane)
        if not raw:
            for reply in out:
                if isinstance(reply, rx.ResponseError):
                    raise reply
        return out

    # -- Cluster ----------------------------------------------------------------------------
    def _node(self, key: str, node: Any = None) -> IO:
        """The standalone IO of ``node``, else of the primary serving ``key``'s slot."""
        if node is None:
            slot_table(self.r)
            node = self.r.get_node_from_key(key)
        sub = self.nodes.get(node.name)
        client = node_client(self.r, node, None if sub is None else sub.r)
        if sub is None or sub.r is not client:
            sub = self.nodes[node.name] = IO(client, self._node_settings, False)
            sub.rosters = self.rosters  # what one node's scripts asked for, the bus knows
        return sub

    def _routed(self, key: str, op: Callable[[IO], Any], *, retry: bool = True) -> Any:
        """Cluster: ``op`` on the standalone IO of the primary serving ``key``'s slot (every
        key of a channel shares one slot), so a call costs what it costs on one server: no
        ``COMMAND GETKEYS``, one pipelined trip per fetch. MOVED and ASK mean the node ran
        nothing, so they are repeated even for sends: after a MOVED, on the node it names (its
        word goes into the slot table: a refresh may read a node that has not yet heard of a
        failover, and send the call back to the one that refused it), after an ASK, once the
        slot table is read again. Other trouble is repeated, after the same refresh, only when
        ``retry`` allows it. A MOVED reply's try goes to the node it names even when a refresh
        (another call's) read a node that had not heard, up to REDIRECTS times in a row: while
        a failover settles the nodes' views may send a call back and forth for a while."""
        self.check_open()
        attempt = redirects = 0
        target: Any = None  # the node a MOVED reply named: the next try goes there
        while True:
            try:
                return op(self._node(key, target))
            except (RedisbusError, rx.RedisError, rx.RedisClusterException, OSError) as e:
                # the node's IO raised a redisbus error; finding the node, a redis-py one
                cause, err = (
                    (e.__cause__, e) if isinstance(e, RedisbusError) else (e, classify(e)[1])
                )
                target = None
                if isinstance(cause, rx.MovedError) and redirects < REDIRECTS:
                    self.retries += 1
                    target = moved(self.r, cause)
                    sleep(backoff_s(redirects - 1) if redirects else 0)
                    redirects += 1
                    continue
                redirect = isinstance(cause, rx.AskError) and not isinstance(cause, rx.MovedError)
                again = redirect or (
                    retry and isinstance(cause, BaseException) and classify(cause)[0] == "retry"
                )
                if not again or attempt >= max(1, self.settings.retry_attempts):
                    if err is e:
                        raise
                    raise err from e
                self.retries += 1
                sleep(backoff_s(attempt) if attempt or not redirect else 0)
                attempt += 1
                # a refresh that fails (still re-forming) is told by the next try
                with contextlib.suppress(rx.RedisError, rx.RedisClusterException, OSError):
                    self.r.nodes_manager.initialize()

    def _by_node(
        self,
        calls: Sequence[Call],
        op: Callable[[IO, builtins.list[Call]], Any],
        *,
        retry: bool = True,
    ) -> builtins.list[Any]:
        """Cluster: ``calls`` grouped by the node of their first key, each group in one trip
        on that node (``_routed``), the replies back in the calls' order."""
        groups: dict[str, builtins.list[int]] = {}
        for i, (_, k, _) in enumerate(calls):
            try:
                name = self.r.get_node_from_key(k[0]).name
            except rx.RedisClusterException:  # slot not covered (or no table yet): alone
                name = str(i)
            groups.setdefault(name, []).append(i)
        out: builtins.list[Any] = [None] * len(calls)
        for idx in groups.values():
            part = [calls[i] for i in idx]
            got = self._routed(part[0][1][0], functools.partial(_swap, op, part), retry=retry)
            for i, r in zip(idx, got, strict=True):
                out[i] = r
        return out


def _swap(op: Callable[[Any, Any], Any], part: Any, io: Any) -> Any:
    return op(io, part)
