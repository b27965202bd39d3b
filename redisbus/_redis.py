"""Connections and the boundary where Redis exceptions become redisbus errors.

Shared by both faces: URL parsing, client options, and the classification of every Redis
exception into "retry after backoff", "reload scripts" or a typed redisbus error.
"""

from __future__ import annotations

import os
import random
import select
import threading
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import unquote, urlparse

import redis
from redis import exceptions as rx

from ._errors import BusConnectionError, InvalidInput, RedisbusError, UnknownAgent
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
    p = urlparse(url)
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
    return Target("cluster" if cluster else "standalone", url, ssl=p.scheme == "rediss")


def client_options(settings: BusSettings, *, blocking: bool = False) -> dict[str, Any]:
    opts: dict[str, Any] = {
        "decode_responses": True,
        "encoding_errors": "replace",
        "socket_timeout": settings.socket_timeout_s,
        "socket_connect_timeout": settings.connect_timeout_s,
        "health_check_interval": 30,
    }
    if settings.username:
        opts["username"] = settings.username
    if settings.password:
        opts["password"] = settings.password
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
    """redis-py retries nothing by itself: the bus decides what is safe to repeat."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

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
            return RedisCluster.from_url(url, **opts), True
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
    return redis.Redis.from_url(url, retry=no_retry(), **opts), False


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
            list(t.sentinels), sentinel_kwargs=sentinel_kw, db=t.db, **opts
        )
        return s.master_for(t.service, db=t.db), False
    if t.kind == "cluster":
        from redis.asyncio.cluster import RedisCluster

        opts.pop("health_check_interval", None)
        return RedisCluster.from_url(url, **opts), True
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    if not t.ssl and url.startswith("redis://"):
        opts["connection_class"] = _fast_async_connection()
    return aredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0), **opts), False


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


_hiredis_pack: Any
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    _hiredis_pack = None


def _pack(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
    """Commands in RESP, packed in C by hiredis (redis-py's own packer checks every argument
    in Python first); what hiredis cannot encode, the connection packs."""
    if _hiredis_pack is not None:
        try:
            return [b"".join(_hiredis_pack(c) for c in commands)]
        except TypeError:
            pass
    return list(conn.pack_commands(commands))


class Lane:
    """One connection held for a sync client's single-command hot path (the scripts).

    ``redis.Redis`` checks a connection out of its pool for every command: a lock, counters
    and a non-blocking ``recv`` to see that the socket is clean, on every call (it showed as a
    large share of a send in profiles). The lane keeps one connection and checks it
    with a ``poll``: readable means closed by the server or holding stray bytes, so it is
    replaced, exactly when the pool would have replaced it. One thread at a time: a caller
    that finds the lane busy uses the pool (``run`` returns ``BUSY``). Plain TCP only (a TLS
    socket can be readable with records the client has not asked for)."""

    BUSY: Any = object()

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.lock = threading.Lock()
        self.conn: Any = None
        self.sock: Any = None
        self.poller: Any = None
        self.pid = os.getpid()

    @staticmethod
    def usable(client: Any) -> bool:
        pool = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        return (
            isinstance(client, redis.Redis)
            and isinstance(cls, type)
            and issubclass(cls, redis.connection.Connection)
            and cls.__module__.startswith("redis.")  # not a test double's connection
            and not issubclass(cls, redis.connection.SSLConnection)
            and hasattr(select, "poll")
        )

    def run(self, *args: Any) -> Any:
        """Send one command and return its reply (an error reply raises), or ``BUSY`` when
        another thread holds the lane."""
        out = self.run_many([args])
        if out is self.BUSY:
            return out
        if isinstance(out[0], rx.ResponseError):
            raise out[0]
        return out[0]

    def run_many(self, commands: list[tuple[Any, ...]]) -> Any:
        """Send ``commands`` in one write and return their replies in order (an error reply
        sits in its slot, the connection stays), or ``BUSY``. Anything else, a dropped
        connection or an interrupt, drops the connection and raises."""
        if not self.lock.acquire(blocking=False):
            return self.BUSY
        try:
            if self.pid != os.getpid():  # a forked child: the socket is the parent's
                self.conn = self.sock = self.poller = None
                self.pid = os.getpid()
            conn = self.conn if self.conn is not None and self._clean() else self._open()
            try:
                conn.send_packed_command(_pack(conn, commands))
                out: list[Any] = []
                for _ in commands:
                    try:
                        out.append(conn.read_response())
                    except rx.ResponseError as e:
                        out.append(e)
                return out
            except BaseException:
                self._drop()
                raise
        finally:
            self.lock.release()

    def _clean(self) -> bool:
        if self.conn._sock is not self.sock:  # reconnected underneath (health check)
            self._watch()
        if self.sock is None or self.poller.poll(0):
            self._drop()
            return False
        return True

    def _open(self) -> Any:
        self.conn = self.pool.get_connection()
        self._watch()
        return self.conn

    def _watch(self) -> None:
        self.sock = self.conn._sock
        self.poller = select.poll()
        if self.sock is not None:
            self.poller.register(self.sock.fileno(), select.POLLIN | select.POLLPRI)

    def _drop(self) -> None:
        conn, self.conn, self.sock, self.poller = self.conn, None, None, None
        if conn is not None:
            try:
                conn.disconnect()
            finally:
                self.pool.release(conn)

    def close(self) -> None:
        with self.lock:
            self._drop()


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
        import asyncio

        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            conn = self.conn
            if conn is not None and not self._clean(conn):
                await self._drop()
                conn = None
            if conn is None:
                conn = self.conn = await self.pool.get_connection()
            try:
                # written straight to the stream: send_packed_command wraps the drain in
                # wait_for, which costs a task and two loop turns per batch; the reads below
                # keep the socket timeout, and drain() returns at once unless the buffer is full
                writer = conn._writer
                writer.writelines(_pack(conn, commands))
                await writer.drain()
                out: list[Any] = []
                for _ in commands:
                    try:
                        out.append(await conn.read_response())
                    except rx.ResponseError as e:
                        out.append(e)
                return out
            except BaseException:
                await self._drop(nowait=True)
                raise

    @staticmethod
    def _clean(conn: Any) -> bool:
        reader = getattr(conn, "_reader", None)
        if reader is None or reader.at_eof():
            return False
        return not getattr(reader, "_buffer", b"")

    async def _drop(self, nowait: bool = False) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                await conn.disconnect(nowait=nowait)
            finally:
                await self.pool.release(conn)

    async def close(self) -> None:
        await self._drop()
