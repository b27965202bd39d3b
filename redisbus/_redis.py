"""Connections and the boundary where Redis exceptions become redisbus errors.

Shared by both faces: URL parsing, client options, and the classification of every Redis
exception into "retry after backoff", "reload scripts" or a typed redisbus error.
"""

from __future__ import annotations

import asyncio
import os
import random
import select
import socket
import struct
import sys
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Literal, NoReturn
from urllib.parse import unquote, urlparse

import redis
from redis import exceptions as rx
from redis._parsers.base import BaseParser

from ._errors import BusConnectionError, InvalidInput, RedisbusError, ServerFull, UnknownAgent
from ._keys import ChannelKeys
from ._settings import BusSettings

Action = Literal["retry", "reload", "raise"]

_RETRY_PREFIXES = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "NOREPLICAS")


def classify(e: BaseException) -> tuple[Action, RedisbusError]:
    """How to react to a Redis exception, and the typed error to raise when giving up."""
    if isinstance(e, rx.NoScriptError):
        return "reload", RedisbusError(f"script cache lost: {e}")
    if isinstance(e, rx.RedisClusterException) and not isinstance(e, rx.RedisError):
        # redis-py's cluster errors ("cannot be connected", slot not covered) sit outside
        # RedisError; they mean the cluster is unreachable or re-forming: retry
        return "retry", BusConnectionError(f"Redis Cluster unavailable: {e}")
    if isinstance(e, rx.ConnectionError | rx.TimeoutError | ConnectionError | TimeoutError):
        return "retry", BusConnectionError(f"Redis unreachable: {e}")
    if isinstance(e, rx.ClusterDownError | rx.TryAgainError | rx.MasterDownError):
        return "retry", BusConnectionError(f"Redis cluster unavailable: {e}")
    if isinstance(e, rx.ReadOnlyError):
        return "retry", BusConnectionError(f"Redis failover in progress: {e}")
    if isinstance(e, rx.ResponseError):
        msg = str(e)
        if msg.startswith(_RETRY_PREFIXES):
            return "retry", BusConnectionError(f"Redis busy: {msg}")
        # (redis-py parses a plain OOM reply as OutOfMemoryError; a script's error on 6.2
        # quotes it mid-text)
        if isinstance(e, rx.OutOfMemoryError) or "OOM command not allowed" in msg:
            return "raise", ServerFull(
                "Redis is at its maxmemory (noeviction) and refused the write; nothing was "
                "written. Consumers still drain and the janitor still trims: retry later"
            )
        if msg.startswith("NOGROUP"):
            return "raise", UnknownAgent(f"agent has no consumer group (not joined): {msg}")
        if "NOPERM" in msg or "NOAUTH" in msg or "WRONGPASS" in msg:
            return "raise", BusConnectionError(f"Redis refused the bus's user: {msg}")
        return "raise", RedisbusError(f"Redis error: {msg}")
    if isinstance(e, rx.AuthenticationError | rx.AuthorizationError):
        return "raise", BusConnectionError(f"Redis refused the bus's user: {e}")
    if isinstance(e, rx.RedisError):
        return "raise", RedisbusError(f"Redis error: {e}")
    return "raise", RedisbusError(f"unexpected error: {e!r}")


def routed_failure(e: BaseException, *, retry: bool) -> tuple[bool, bool, BaseException | None]:
    """A Cluster call routed to one node failed with ``e`` (a redisbus error wrapping the
    cause, or the cause itself): (repeat it, it was a redirect, the error to raise instead of
    ``e`` or None). MOVED and ASK mean the node ran nothing, so they are repeated even for
    sends; other trouble only when ``retry`` allows it. Both faces' ``IO._routed`` decide
    here; they only sleep and refresh the slot table their own way."""
    if isinstance(e, RedisbusError):
        cause, err = e.__cause__, e
    else:
        cause, err = e, classify(e)[1]
    redirect = isinstance(cause, rx.AskError)  # MovedError is one too
    again = redirect or (
        retry and isinstance(cause, BaseException) and classify(cause)[0] == "retry"
    )
    return again, redirect, (None if err is e else err)


def backoff_s(attempt: int) -> float:
    return float(min(2.0, 0.02 * (2**attempt)) * (0.5 + random.random() / 2))


@dataclass(frozen=True, slots=True)
class Target:
    kind: Literal["standalone", "cluster", "sentinel"]
    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    ssl: bool = False


def parse_url(url: str, cluster: bool) -> Target:
    if not isinstance(url, str) or not url:
        raise InvalidInput("Redis URL must be a non-empty string")
    try:
        p = urlparse(url)
    except ValueError as e:  # "Invalid IPv6 URL"
        raise InvalidInput(f"malformed Redis URL: {e}") from None
    if p.scheme in ("redis+sentinel", "rediss+sentinel", "sentinel"):
        hosts = []
        for part in p.netloc.rpartition("@")[2].split(","):
            host, _, port = part.rpartition(":")
            if not host:
                host, port = port, "26379"
            try:
                hosts.append((host.strip("[]"), int(port)))
            except ValueError:
                raise InvalidInput(f"bad sentinel address {part!r} in {url!r}") from None
        path = [x for x in p.path.split("/") if x]
        if not path:
            raise InvalidInput(
                "sentinel URL needs a service name: redis+sentinel://h:p/SERVICE[/db]"
            )
        db = int(path[1]) if len(path) > 1 and path[1].isdigit() else 0
        return Target(
            "sentinel", url, tuple(hosts), unquote(path[0]), db, p.scheme.startswith("rediss")
        )
    if p.scheme not in ("redis", "rediss", "unix"):
        raise InvalidInput(
            f"unsupported Redis URL scheme {p.scheme!r}: use redis://, rediss://, "
            "redis+sentinel:// (or cluster=True with redis://)"
        )
    try:  # redis-py parses the rest; a bad port is the caller's input, not a crash
        p.port  # noqa: B018 - parsing it is the check
    except ValueError as e:  # (the URL may carry a password: not echoed)
        raise InvalidInput(f"malformed Redis URL: {e}") from None
    return Target("cluster" if cluster else "standalone", url, ssl=p.scheme == "rediss")


def _from_url(factory: Any, url: str, **kw: Any) -> Any:
    """``factory.from_url``, with redis-py's ValueError for a malformed URL as InvalidInput."""
    try:
        return factory.from_url(url, **kw)
    except ValueError as e:
        raise InvalidInput(f"malformed Redis URL: {e}") from None


def client_options(settings: BusSettings, *, blocking: bool = False) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "decode_responses": True,
        "encoding_errors": "replace",
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "health_check_interval": 30,
        # redis-py's async pool refuses the 101st connection ("Too many connections"), and
        # every async agent blocked in wait() holds one: size the pool for the fleet
        "max_connections": settings.max_connections,
    }
    if settings.username:
        opts["username"] = settings.username
    if settings.password:
        opts["password"] = settings.password.get_secret_value()
    return opts


def ssl_options(settings: BusSettings) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if settings.ssl_ca_certs:
        opts["ssl_ca_certs"] = settings.ssl_ca_certs
    if settings.ssl_certfile:
        opts["ssl_certfile"] = settings.ssl_certfile
    if settings.ssl_keyfile:
        opts["ssl_keyfile"] = settings.ssl_keyfile
    return opts


def no_retry() -> Any:
    """redis-py retries nothing by itself: the bus decides what is safe to repeat (a send
    without an idempotency key is never repeated, so a write whose reply was lost is never
    written twice). Given to every client kind: standalone, Sentinel, Cluster."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return Retry(NoBackoff(), 0)


def no_retry_async() -> Any:
    """``no_retry`` for the asyncio clients (their own ``Retry`` class)."""
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    return Retry(NoBackoff(), 0)


def sync_client(settings: BusSettings, url: str) -> tuple[Any, bool]:
    """Return (client, is_cluster)."""
    t = parse_url(url, settings.cluster)
    opts = client_options(settings)
    if t.ssl:
        opts.update(ssl_options(settings))
    if t.kind == "sentinel":
        from redis.sentinel import Sentinel

        sentinel_kw: dict[str, Any] = {"socket_timeout": settings.connect_timeout_s}
        if t.ssl:  # rediss+sentinel: TLS to the sentinels and to the primary
            opts["ssl"] = True
            sentinel_kw.update(ssl=True, **ssl_options(settings))
        s = Sentinel(  # type: ignore[no-untyped-call]
            list(t.sentinels), sentinel_kwargs=sentinel_kw, db=t.db, retry=no_retry(), **opts
        )
        return s.master_for(t.service, db=t.db), False  # type: ignore[no-untyped-call]
    if t.kind == "cluster":
        from redis.cluster import RedisCluster

        opts.pop("health_check_interval", None)
        try:  # the sync cluster client connects in its constructor
            return _from_url(RedisCluster, url, retry=no_retry(), **opts), True
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
    return _from_url(redis.Redis, url, retry=no_retry(), **opts), False


def async_client(settings: BusSettings, url: str) -> tuple[Any, bool]:
    import redis.asyncio as aredis

    t = parse_url(url, settings.cluster)
    opts = client_options(settings)
    if t.ssl:
        opts.update(ssl_options(settings))
    if t.kind == "sentinel":
        from redis.asyncio.sentinel import Sentinel

        sentinel_kw: dict[str, Any] = {"socket_timeout": settings.connect_timeout_s}
        if t.ssl:
            opts["ssl"] = True
            sentinel_kw.update(ssl=True, **ssl_options(settings))
        s = Sentinel(  # type: ignore[no-untyped-call]
            list(t.sentinels), sentinel_kwargs=sentinel_kw, db=t.db, retry=no_retry_async(), **opts
        )
        return s.master_for(t.service, db=t.db), False
    if t.kind == "cluster":
        from redis.asyncio.cluster import RedisCluster

        opts.pop("health_check_interval", None)
        return _from_url(RedisCluster, url, retry=no_retry_async(), **opts), True
    if not t.ssl and url.startswith("redis://"):
        opts["connection_class"] = _fast_async_connection()
    return _from_url(aredis.Redis, url, retry=no_retry_async(), **opts), False


def _fast_async_connection() -> Any:
    """redis.asyncio packs commands in pure Python (the sync client uses hiredis): an EVALSHA
    with its keys and arguments costs more to pack than to run. Pack with hiredis when it is
    installed, as the sync client does."""
    import redis.asyncio as aredis

    try:
        from hiredis import pack_command
    except ImportError:  # pragma: no cover - hiredis is a dependency
        return aredis.Connection

    class HiredisPackedConnection(aredis.Connection):
        def pack_command(self, *args: Any) -> list[bytes]:
            if args and isinstance(args[0], str) and " " in args[0]:
                return list(super().pack_command(*args))  # "SCRIPT LOAD" and friends
            try:
                return [pack_command(args)]
            except TypeError:  # an argument hiredis cannot encode: the slow path
                return list(super().pack_command(*args))

    return HiredisPackedConnection


_hiredis: Any
_hiredis_pack: Any
try:
    import hiredis as _hiredis
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    _hiredis = _hiredis_pack = None

_ERROR_PARSER: Any = BaseParser


def _pack(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """Commands in RESP, packed in C by hiredis (redis-py's own packer checks every argument
    in Python first); what hiredis cannot encode, the connection packs."""
    if _hiredis_pack is not None:
        try:
            if len(commands) == 1:  # the hot path: one script call
                return [_hiredis_pack(commands[0])]
            return [b"".join(_hiredis_pack(c) for c in commands)]
        except TypeError:
            pass
    return list(conn.pack_commands(commands))


class Lane:
    """One connection held for a sync client's single-command hot path (the scripts).

    ``redis.Redis`` checks a connection out of its pool for every command (a lock, counters
    and a non-blocking ``recv`` to see that the socket is clean) and reads the reply through
    several layers; together that cost more per call than a send's script costs the server.
    The lane keeps one connection that the pool opened (so AUTH, SELECT and the client name
    are the pool's), and talks on its socket directly: one ``sendall`` of the packed
    commands, ``recv_into`` a buffer, a hiredis reader of its own. Before each use the socket
    is checked with a ``poll``: readable means closed by the server or holding stray bytes, so
    it is replaced, exactly when the pool would have replaced it. One thread at a time: a
    caller that finds the lane busy uses the pool (``run`` returns ``BUSY``). Plain TCP only
    (a TLS socket can be readable with records the client has not asked for), and only with
    hiredis installed (it is a dependency)."""

    BUSY: Any = object()

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.lock = threading.Lock()
        self.conn: Any = None
        self.sock: Any = None
        self.reader: Any = None
        self.poller: Any = None
        self.buf = bytearray(65536)
        _LANES.add(self)
        self.reader_kw = _reader_kw(self.pool)

    @staticmethod
    def usable(client: Any) -> bool:
        pool = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        return (
            _hiredis is not None
            and isinstance(client, redis.Redis)
            and isinstance(cls, type)
            and issubclass(cls, redis.connection.Connection)
            and cls.__module__.startswith("redis.")  # not a test double's connection
            and not issubclass(cls, redis.connection.SSLConnection)
            and int(getattr(pool, "connection_kwargs", {}).get("protocol") or 2) == 2
            and hasattr(select, "poll")
        )

    def run(self, *args: Any) -> Any:
        """Send one command and return its reply (an error reply raises), or ``BUSY`` when
        another thread holds the lane. The hot path: what ``run_many`` does for one command,
        without the lists."""
        if not self.lock.acquire(blocking=False):
            return self.BUSY
        try:
            if self.sock is None or self.poller.poll(0):
                self._open()
            try:
                _sendall(self.sock, b"".join(_pack(self.conn, [args])))
                reply = self._reply()
            except BaseException as e:
                self._fail(e)
        finally:
            self.lock.release()
        if isinstance(reply, rx.ResponseError):
            raise reply
        return reply

    def run_many(self, commands: list[tuple[Any, ...]]) -> Any:
        """Send ``commands`` in one write and return their replies in order (an error reply
        sits in its slot, the connection stays), or ``BUSY``. Anything else, a dropped
        connection, a timeout or an interrupt, drops the connection and raises (as redis-py's
        ``ConnectionError`` / ``TimeoutError`` for socket trouble)."""
        if not self.lock.acquire(blocking=False):
            return self.BUSY
        try:
            if self.sock is None or self.poller.poll(0):
                self._open()
            try:
                _sendall(self.sock, b"".join(_pack(self.conn, commands)))
                return [self._reply() for _ in commands]
            except BaseException as e:
                self._fail(e)
        finally:
            self.lock.release()

    def _reply(self) -> Any:
        """The next reply on the socket (an error reply as its exception, not raised)."""
        reader, reply = self.reader, self.reader.gets()
        while reply is False:
            n = self.sock.recv_into(self.buf)
            if not n:
                raise rx.ConnectionError("Connection closed by server.")
            reader.feed(self.buf, 0, n)
            reply = reader.gets()
        return reply

    def _fail(self, e: BaseException) -> NoReturn:
        """Drop the connection (its replies can no longer be matched to requests) and raise:
        socket trouble as redis-py's ``TimeoutError`` / ``ConnectionError``, the rest as is."""
        self._drop()
        if isinstance(e, socket.timeout | BlockingIOError):
            raise rx.TimeoutError("Timeout reading from socket") from e
        if isinstance(e, OSError):
            raise rx.ConnectionError(f"Error on the Redis socket: {e}") from e
        raise e

    def _open(self) -> None:
        self._drop()
        conn = self.pool.get_connection()
        self.conn, self.sock = conn, conn._sock
        _kernel_timeouts(self.sock)
        self.reader = _hiredis.Reader(**self.reader_kw)
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN | select.POLLPRI)

    def _drop(self) -> None:
        conn, self.conn, self.sock, self.poller, self.reader = self.conn, None, None, None, None
        if conn is not None:
            try:
                conn.disconnect()
            finally:
                self.pool.release(conn)

    def close(self) -> None:
        with self.lock:
            self._drop()


def _kernel_timeouts(sock: socket.socket) -> None:
    """Move the socket's timeout into the kernel (``SO_RCVTIMEO``/``SO_SNDTIMEO``) on Linux: a
    Python-level timeout polls before every ``recv`` and ``send``, a system call per
    operation on the hot path. A timed-out call then fails with ``EAGAIN``
    (``BlockingIOError``), which the lane reports as a timeout."""
    timeout = sock.gettimeout()
    if sys.platform != "linux" or not timeout:
        return
    sec = int(timeout)
    tv = struct.pack("ll", sec, int((timeout - sec) * 1_000_000))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    sock.settimeout(None)


#: How a lane writes to its socket (a module global, so a benchmark can count round trips).
_sendall = socket.socket.sendall

#: Every sync lane, forgotten (not closed) in a forked child: the socket is the parent's.
_LANES: weakref.WeakSet[Lane] = weakref.WeakSet()


def _forget_lanes() -> None:
    for lane in list(_LANES):
        lane.conn = lane.sock = lane.poller = lane.reader = None
        lane.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lanes)


def _reader_kw(pool: Any) -> dict[str, Any]:
    """A hiredis reader's settings for the pool's connections: its decoding, and error
    replies handed over as redis-py's exception types."""
    kw = pool.connection_kwargs
    out: dict[str, Any] = {
        "protocolError": rx.InvalidResponse,
        "replyError": _reply_error,
        "errors": kw.get("encoding_errors", "strict"),
    }
    if kw.get("decode_responses"):
        out["encoding"] = kw.get("encoding", "utf-8")
    return out


def _reply_error(message: str) -> rx.ResponseError:
    """An error reply as the exception redis-py would raise for it (NOSCRIPT, READONLY, ...):
    the hiredis reader hands it over instead of raising, and ``run_many`` keeps it in its slot."""
    err: rx.ResponseError = _ERROR_PARSER.parse_error(message)
    return err


class AsyncLane:
    """The async face's lane: one connection that the send coalescer writes each batch of
    scripts to, in one write, reading the replies in order. ``redis.asyncio``'s pipeline costs
    more in Python than a send costs the server; this is the same wire traffic without it.

    Before each batch the held connection is checked as the pool would check it: a reader at
    EOF (the server closed it) or holding unread bytes means a fresh connection. Any failure
    mid-batch, cancellation included, drops the connection: its replies can no longer be
    matched to requests. Batches take turns (a lock); plain TCP only, as the sync lane."""

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.conn: Any = None
        self.lock: Any = None  # an asyncio.Lock, made in the loop that first uses the lane
        # replies are parsed by a hiredis reader of the lane's own, fed from the stream (one
        # timeout per batch), skipping redis.asyncio's reply layers
        self.reader: Any = None
        self.reader_kw = _reader_kw(self.pool) if _hiredis is not None else None

    @staticmethod
    def usable(client: Any) -> bool:
        import redis.asyncio as aredis

        pool = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        return (
            isinstance(client, aredis.Redis)
            and isinstance(cls, type)
            and issubclass(cls, aredis.Connection)
            and not issubclass(cls, aredis.SSLConnection)
            and cls.__module__.split(".")[0] in ("redis", "redisbus")  # not a test double's
        )

    async def run_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write and return their replies in order; an error reply
        (``ResponseError``) sits in its slot. Connection trouble raises."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            conn = self.conn
            if conn is not None and not self._clean(conn):
                await self._drop()
                conn = None
            if conn is None:
                conn = self.conn = await self.pool.get_connection()
                if self.reader_kw is not None:
                    self.reader = _hiredis.Reader(**self.reader_kw)
            try:
                # written straight to the stream: send_packed_command wraps the drain in
                # wait_for, which costs a task and two loop turns per batch; the reads below
                # keep the socket timeout, and drain() returns at once unless the buffer is full
                writer = conn._writer
                writer.writelines(_pack(conn, commands))
                await writer.drain()
                if self.reader is None:
                    out: list[Any] = []
                    for _ in commands:
                        try:
                            out.append(await conn.read_response())
                        except rx.ResponseError as e:
                            out.append(e)
                    return out
                timeout = conn.socket_timeout
                if not timeout:
                    return await self._replies(conn._reader, len(commands))
                try:
                    async with asyncio.timeout(timeout):
                        return await self._replies(conn._reader, len(commands))
                except TimeoutError as e:
                    raise rx.TimeoutError("Timeout reading from socket") from e
            except BaseException:
                await self._drop(nowait=True)
                raise

    async def _replies(self, stream: Any, n: int) -> list[Any]:
        """The next ``n`` replies on the stream (error replies as their exceptions)."""
        reader, out = self.reader, []
        for _ in range(n):
            reply = reader.gets()
            while reply is False:
                data = await stream.read(65536)
                if not data:
                    raise rx.ConnectionError("Connection closed by server.")
                reader.feed(data)
                reply = reader.gets()
            out.append(reply)
        return out

    @staticmethod
    def _clean(conn: Any) -> bool:
        reader = getattr(conn, "_reader", None)
        if reader is None or reader.at_eof():
            return False
        return not getattr(reader, "_buffer", b"")

    async def _drop(self, nowait: bool = False) -> None:
        conn, self.conn, self.reader = self.conn, None, None
        if conn is not None:
            try:
                await conn.disconnect(nowait=nowait)
            finally:
                await self.pool.release(conn)

    async def close(self) -> None:
        await self._drop()


def stream_entries(reply: Any) -> list[tuple[str, dict[str, str] | None]]:
    """The entries of a one-stream XREAD(GROUP) reply as (id, fields), whether raw (RESP2 list,
    RESP3 map, flat field lists) or parsed by redis-py; fields are None for an entry deleted
    while pending."""
    if not reply:
        return []
    got = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    out = []
    for entry_id, f in got:
        if f and not isinstance(f, dict):
            pairs = iter(f)
            f = dict(zip(pairs, pairs, strict=True))
        out.append((entry_id, f or None))
    return out


def fetch_commands(
    sha: str,
    keys: ChannelKeys,
    group: str,
    consumer: str,
    cursor: str,
    block_ms: int | None,
    settle: list[str] | None,
    mark_after: str | None,
    replay_keep_ms: int,
) -> list[tuple[Any, ...]]:
    """The commands of one fetch, sent in one trip by either face: the deferred ``settle`` ops
    (settle.lua, ``sha``), the XREADGROUP (blocking when ``block_ms``) of ``keys.stream`` as
    ``consumer`` of ``group`` from ``cursor``, then, with ``mark_after`` (the last entry id
    this consumer fetched before), the "n" op that marks what the read returns read on the
    server before the reply comes back and replies with the Redis clock; else a TIME. The
    replay check's two keys go only with signing on (``replay_keep_ms``): nothing else reads
    them, and two keys fewer cost every wake-up less."""
    settle_keys = keys.settle if replay_keep_ms else keys.settle[:4]
    nk = len(settle_keys)
    commands: list[tuple[Any, ...]] = []
    if settle:
        commands.append(("EVALSHA", sha, nk, *settle_keys, group, *settle))
    read: tuple[Any, ...] = ("XREADGROUP", "GROUP", group, consumer, "COUNT", 500)
    if block_ms is not None:
        read += ("BLOCK", block_ms)
    commands.append((*read, "STREAMS", keys.stream, cursor))
    if mark_after is None:
        commands.append(("TIME",))
    else:
        keep = f"\n{replay_keep_ms}" if replay_keep_ms else ""  # signing on: see settle.lua
        op = f"{mark_after}\n{consumer}{keep}"
        commands.append(("EVALSHA", sha, nk, *settle_keys, group, "n", op))
    return commands


def fetch_result(
    out: list[Any], settled: bool, marked: bool
) -> tuple[list[tuple[str, dict[str, str] | None]], int, int, str | None]:
    """The replies of :func:`fetch_commands` (``settled``: it had settle ops; ``marked``: an
    "n" op): the entries (less those settle.lua rejected as replays: never handed over), the
    Redis clock in ms, how many it rejected, and the agent's status when the "n" op read it
    (None otherwise)."""
    entries = stream_entries(out[1 if settled else 0])
    last = out[-1]
    now = last[1:3] if marked else last
    replayed = (last[3] if marked and len(last) > 3 else None) or []
    status = last[4] if marked and len(last) > 4 else None
    if replayed:
        gone = set(replayed)
        entries = [e for e in entries if e[0] not in gone]
    status = status.decode() if isinstance(status, bytes) else status
    return entries, int(now[0]) * 1000 + int(now[1]) // 1000, len(replayed), status or None
