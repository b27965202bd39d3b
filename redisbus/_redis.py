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

from . import _bindings as bind
from ._errors import BusConnectionError, InvalidInput, RedisbusError, ServerFull, UnknownAgent
from ._settings import BusSettings

Action = Literal["retry", "reload", "raise"]

_RETRY_PREFIXES = ("TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN", "READONLY", "NOREPLICAS")


def classify(e: BaseException) -> tuple[Action, RedisbusError]:
    """How to react to a Redis exception, and the typed error to raise when giving up."""
    if isinstance(e, rx.NoScriptError) or (
        isinstance(e, rx.ResponseError) and str(e).startswith("Function not found")
    ):
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


def client_options(settings: BusSettings) -> dict[str, Any]:
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


def _target(settings: BusSettings, url: str, retry: Any) -> tuple[Target, dict[str, Any]]:
    """Where ``url`` points, and the options of a client of either face for it. ``retry`` is
    the face's ``Retry`` that retries nothing: the bus decides what is safe to repeat (a send
    without an idempotency key is never repeated, so a write whose reply was lost is never
    written twice). Every client kind gets it: standalone, Sentinel, Cluster."""
    t = parse_url(url, settings.cluster)
    opts = {**client_options(settings), "retry": retry}
    if t.ssl:
        opts.update(ssl_options(settings))
    if t.kind == "cluster":
        opts.pop("health_check_interval", None)
    return t, opts


def _primary(sentinel_class: Any, t: Target, settings: BusSettings, opts: dict[str, Any]) -> Any:
    """A client of the primary the sentinels of ``t`` name (TLS to both with rediss+)."""
    sentinel_kw: dict[str, Any] = {"socket_timeout": settings.connect_timeout_s}
    if t.ssl:
        opts["ssl"] = True
        sentinel_kw.update(ssl=True, **ssl_options(settings))
    s = sentinel_class(list(t.sentinels), sentinel_kwargs=sentinel_kw, db=t.db, **opts)
    return s.master_for(t.service, db=t.db)


def sync_client(settings: BusSettings, url: str) -> tuple[Any, bool]:
    """Return (client, is_cluster)."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    t, opts = _target(settings, url, Retry(NoBackoff(), 0))
    if t.kind == "sentinel":
        from redis.sentinel import Sentinel

        return _primary(Sentinel, t, settings, opts), False
    if t.kind == "cluster":
        from redis.cluster import RedisCluster

        try:  # the sync cluster client connects in its constructor
            return _from_url(RedisCluster, url, **opts), True
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
    return _from_url(redis.Redis, url, **opts), False


def async_client(settings: BusSettings, url: str) -> tuple[Any, bool]:
    """Return (client, is_cluster), of ``redis.asyncio``."""
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    t, opts = _target(settings, url, Retry(NoBackoff(), 0))
    if t.kind == "sentinel":
        from redis.asyncio.sentinel import Sentinel

        return _primary(Sentinel, t, settings, opts), False
    if t.kind == "cluster":
        from redis.asyncio.cluster import RedisCluster

        return _from_url(RedisCluster, url, **opts), True
    if not t.ssl and url.startswith("redis://"):
        opts["connection_class"] = _fast_async_connection()
    return _from_url(aredis.Redis, url, **opts), False


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
    verb: str,
    shas: tuple[str, str],
    keys: bind.FetchKeys,
    group: str,
    consumer: str,
    block_ms: int | None,
    settle: list[str] | None,
    replay_keep_ms: int,
) -> list[tuple[Any, ...]]:
    """The commands of one fetch, sent in one trip by either face (``verb`` names the scripts
    by ``shas``: FCALL or EVALSHA): the deferred ``settle`` ops (settle.lua, ``shas[0]``),
    then, when ``block_ms``, the blocking pop of ``group``'s wakeup list (BLPOP: it returns
    when a message for the agent is rung, or at the timeout), then wake.lua (``shas[1]``),
    which hands ``consumer`` what the agent's bell names. Redis runs a pipeline's commands in
    order, so wake.lua runs the moment the pop returns. ``keys``: the handle's
    (``_bindings.fetch_keys``), the replay check's two keys in wake.lua's only with signing
    on: nothing else reads them, and two keys fewer cost every wake-up less."""
    commands: list[tuple[Any, ...]] = []
    if settle:
        _, sk, sa = bind.settle(keys.settle, group, settle)
        commands.append((verb, shas[0], len(sk), *sk, *sa))
    if block_ms is not None:  # (at least 2 ms: Redis 6.2 reads "0.001" as 0, forever)
        commands.append(("BLPOP", keys.wakeup, f"{max(block_ms, 2) / 1000:.3f}"))
    _, wk, wa = bind.wake(keys.wake, group, consumer, replay_keep_ms, block_ms is not None)
    commands.append((verb, shas[1], len(wk), *wk, *wa))
    return commands


def fetch_result(
    out: list[Any],
) -> tuple[list[tuple[str, dict[str, str] | None]], int, int, str | None]:
    """The replies of :func:`fetch_commands`: the entries wake.lua handed over (less those it
    rejected as replays: never handed over), the Redis clock in ms, how many it rejected, and
    the agent's status when wake.lua read it (None otherwise)."""
    t1, t2, replayed, status, handed = out[-1]
    entries = stream_entries([(None, handed)]) if handed else []
    status = status.decode() if isinstance(status, bytes) else status
    return (
        entries,
        int(t1) * 1000 + int(t2) // 1000,
        len(replayed or ()),
        status or None,
    )
