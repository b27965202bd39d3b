"""Connections and the boundary where Redis exceptions become redisbus errors.

Shared by both faces: URL parsing, client options, and the classification of every Redis
exception into "retry after backoff", "reload scripts" or a typed redisbus error.
"""

from __future__ import annotations

import random
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
