"""``redisbus doctor``: is this Redis fit for the bus, and what to change when it is not.

Each check reads what Redis reports about itself (``INFO``, ``ACL DRYRUN``, ``ACL GETUSER``, a
``SCRIPT LOAD``, ``PING``) and writes nothing but one throwaway probe key under the bus's
prefix, deleted again. A failure exits 1 after every check has run; warnings do not fail; a
check the connected user may not run says "unknown", never "ok".
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal
from urllib.parse import urlparse

import redis
from rich.text import Text

from .._clock import FIX, skew_check
from .._commands import BusAddress, Exit, with_address
from .._errors import BusConnectionError, human_number
from .._keys import ChannelKeys, registry_key
from .._scripts import source
from ._shared import JsonOpt, connect, out, write_json

Verdict = Literal["ok", "warn", "fail", "unknown"]

MIN_VERSION = (6, 2)
SLOW_PING_MS = 5.0
ZERO_SHA = "0" * 40

# Every command the bus sends, directly or from its Lua scripts (scripts run with the caller's
# permissions), with harmless arguments: {key} is a probe key under the bus's prefix. Probed
# by ACL DRYRUN where it can run; else by running those that write nothing (``NOMKSTREAM``,
# a missing group or key): an error other than NOPERM means the command is permitted.
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("EVALSHA", ZERO_SHA, "1", "{key}"),
    ("EVAL", "return 1", "1", "{key}"),
    ("SCRIPT", "LOAD", "return 1"),
    ("XADD", "{key}", "NOMKSTREAM", "*", "f", "v"),
    ("XREADGROUP", "GROUP", "g", "c", "COUNT", "1", "STREAMS", "{key}", ">"),
    ("XREAD", "COUNT", "1", "STREAMS", "{key}", "0-0"),
    ("XACK", "{key}", "g", "0-1"),
    ("XCLAIM", "{key}", "g", "c", "0", "0-1"),
    ("XAUTOCLAIM", "{key}", "g", "c", "0", "0-0"),
    ("XPENDING", "{key}", "g"),
    ("XRANGE", "{key}", "-", "+", "COUNT", "1"),
    ("XREVRANGE", "{key}", "+", "-", "COUNT", "1"),
    ("XLEN", "{key}"),
    ("XINFO", "GROUPS", "{key}"),
    ("XGROUP", "CREATE", "{key}", "g", "$"),
    ("XTRIM", "{key}", "MINID", "0-1"),
    ("XDEL", "{key}", "0-1"),
    ("HGET", "{key}", "f"),
    ("HMGET", "{key}", "f"),
    ("HGETALL", "{key}"),
    ("HEXISTS", "{key}", "f"),
    ("HLEN", "{key}"),
    ("HDEL", "{key}", "f"),
    ("HSET", "{key}", "f", "v"),
    ("HSETNX", "{key}", "f", "v"),
    ("HINCRBY", "{key}", "f", "1"),
    ("HSCAN", "{key}", "0"),
    ("OBJECT", "ENCODING", "{key}"),
    ("RPUSH", "{key}", "0-1"),
    ("LPOP", "{key}", "1"),
    ("BLPOP", "{key}", "0.01"),
    ("LRANGE", "{key}", "0", "0"),
    ("LTRIM", "{key}", "0", "-1"),
    ("LREM", "{key}", "1", "0-1"),
    ("LLEN", "{key}"),
    ("ZADD", "{key}", "1", "m"),
    ("ZRANGEBYSCORE", "{key}", "-inf", "+inf", "LIMIT", "0", "1"),
    ("ZREM", "{key}", "m"),
    ("SADD", "{key}", "m"),
    ("SMEMBERS", "{key}"),
    ("EXISTS", "{key}"),
    ("DEL", "{key}"),
    ("TIME",),
    ("PING",),
)
# commands that would write when run: probed on a key of their own, deleted after
WRITES = {"HSET", "HSETNX", "HINCRBY", "SADD", "RPUSH", "ZADD"}

# Servers that replay the append-only file as the ``default`` ACL user and re-check its
# permissions at each EXEC: the effects of every script reach the AOF as MULTI/EXEC, so with a
# default user that may not run them, a restart drops what the scripts wrote (redis/redis#14541,
# valkey-io/valkey#3983 on GitHub). Redis 6.2 replays as a superuser; 7.0 made the AOF client the
# default user. The fixes (redis PR 14545, valkey PR 3984) are merged, but no release is
# known here to carry them, so every Redis from 7.0 and every Valkey counts as affected; set
# the first fixed version here once one is established.
AOF_AS_DEFAULT_USER_FROM = {"redis": (7, 0), "valkey": (0,)}
AOF_ACL_FIXED_IN: dict[str, tuple[int, ...] | None] = {"redis": None, "valkey": None}


@dataclass
class Check:
    name: str
    verdict: Verdict
    detail: str
    fix: str = ""
    node: str = ""  # on a Cluster: the primary it was checked on


@with_address
def doctor(address: BusAddress, as_json: JsonOpt = False) -> None:
    """Check a Redis for what the bus needs: version, eviction policy, ACL permissions, script
    load, persistence, latency, the janitor. Prints what to fix; exit 1 when a check fails."""
    with connect(address) as bus:
        bus.ping()  # an unreachable Redis exits 3 like every command's, not as a failed check
        try:
            checks = all_checks(bus)
        except (redis.ConnectionError, redis.TimeoutError) as e:  # gone between checks
            raise BusConnectionError(f"Redis unreachable: {e}") from e
    if as_json:
        write_json([asdict(c) for c in checks])
    else:
        for c in checks:
            out.print(line(c), soft_wrap=True)
    failed = [c.name for c in checks if c.verdict == "fail"]
    if failed:
        raise Exit(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}", 1)


def all_checks(bus: Any) -> list[Check]:
    """Every check, on every primary of a Cluster."""
    r = bus.redis
    nodes = [("", r)]
    if hasattr(r, "get_primaries"):  # a Cluster: each primary has its own settings
        nodes = [(n.name, r.get_redis_connection(n)) for n in r.get_primaries()]
    checks: list[Check] = []
    for node, client in nodes:
        user = bus.settings.username or urlparse(bus.settings.url or "").username
        found = node_checks(client, bus.settings.prefix, user)
        for c in found:
            c.node = node
        checks += found
    checks.append(janitor_check(r, bus.settings.prefix, bus.settings.retention_s))
    checks.append(clock_check(r, bus.settings))
    return checks


STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "unknown": "dim"}


def line(c: Check) -> Text:
    t = Text.assemble((f"{c.verdict:<8}", STYLE[c.verdict]), (f"{c.name:<12}", "bold"))
    if c.node:
        t.append(f"{c.node}: ", style="dim")
    t.append(c.detail)
    if c.fix:
        t.append(f"\n{'':<20}fix: {c.fix}", style="yellow")
    return t


def node_checks(r: Any, prefix: str, username: str | None) -> list[Check]:
    server = info(r, "server")
    version_text = str(server.get("redis_version", "0"))
    version = tuple(int(x) for x in version_text.split(".")[:2] if x.isdigit())
    persistence = info(r, "persistence")
    return [
        version_check(version_text, version, str(server.get("valkey_version", ""))),
        eviction_check(info(r, "memory")),
        acl_check(r, prefix, username, version),
        script_check(r),
        persistence_check(persistence),
        aof_reload_check(r, server, persistence),
        latency_check(r),
    ]


def info(r: Any, section: str) -> dict[str, Any]:
    try:
        return dict(r.info(section))
    except redis.exceptions.NoPermissionError:
        return {}


def version_check(text: str, version: tuple[int, ...], valkey: str = "") -> Check:
    """``text``: INFO's redis_version (Valkey reports the Redis version it is compatible
    with, 7.2.4, and its own as ``valkey``)."""
    if version >= MIN_VERSION:
        return Check(
            "version", "ok", f"Valkey {valkey} (Redis {text})" if valkey else f"Redis {text}"
        )
    if version == ():
        return Check("version", "unknown", "INFO server is not permitted to this user")
    return Check(
        "version",
        "fail",
        f"Redis {text}: the bus needs 6.2 or later (XAUTOCLAIM, XADD ... MINID)",
        "upgrade Redis to 6.2 or later",
    )


def eviction_check(memory: dict[str, Any]) -> Check:
    policy = memory.get("maxmemory_policy")
    if policy is None:
        return Check("eviction", "unknown", "INFO memory is not permitted to this user")
    if policy != "noeviction":
        return Check(
            "eviction",
            "fail",
            f"maxmemory-policy is {policy}: under memory pressure Redis deletes keys, "
            "channel streams included (messages lost)",
            "CONFIG SET maxmemory-policy noeviction, and `maxmemory-policy noeviction` in "
            "redis.conf",
        )
    used, limit = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
    if limit and used >= limit:
        return Check(
            "eviction",
            "fail",
            f"noeviction, and Redis is at its limit ({used} of {limit} bytes): every send is "
            "refused; consumers still drain (wait, read, mark_done) and the janitor still trims",
            "let consumers drain and the janitor trim (redisbus janitor --once), or raise "
            "maxmemory",
        )
    if limit and used > 0.9 * limit:
        return Check(
            "eviction",
            "warn",
            f"noeviction, but {used * 100 // limit}% of maxmemory is used: sends will be "
            "refused when it is full",
            "raise maxmemory, or shorten retention (REDISBUS_RETENTION_S)",
        )
    return Check("eviction", "ok", "maxmemory-policy noeviction")


def acl_check(r: Any, prefix: str, username: str | None, version: tuple[int, ...]) -> Check:
    probe = ChannelKeys.build(prefix, "redisbus-doctor")
    try:
        user = str(r.execute_command("ACL", "WHOAMI"))
    except redis.exceptions.ResponseError:  # 6.2 has it; a least-privilege user may not
        user = username or "default"
    how = "ACL DRYRUN"
    denied: list[str] = []
    dryrun = version >= (7, 0) or version == ()  # () when INFO was denied: try it
    if dryrun:
        try:
            for cmd in COMMANDS:
                reply = r.execute_command("ACL", "DRYRUN", user, *args(cmd, probe.stream))
                if reply not in ("OK", b"OK"):
                    denied.append(cmd[0])
        except redis.exceptions.ResponseError:
            dryrun = False  # this user may not run ACL DRYRUN (or it has none): probe instead
    if not dryrun:
        why = f"{user} may not run it"
        if version and version < (7, 0):
            why = f"Redis {'.'.join(map(str, version))}"
        how = f"probed; ACL DRYRUN unavailable: {why}"
        denied = probe_commands(r, probe)
    if denied:
        return Check(
            "acl",
            "fail",
            f"user {user} may not run {', '.join(denied)} on {prefix}:* keys ({how})",
            f"ACL SETUSER {user} "
            + " ".join(f"+{c.lower()}" for c in denied)
            + f" ~{prefix}:*  (deploy/redis/users.acl has the bus's full list)",
        )
    return Check(
        "acl", "ok", f"user {user} may run the {len(COMMANDS)} commands of the bus ({how})"
    )


def args(cmd: tuple[str, ...], key: str) -> list[str]:
    return [key if a == "{key}" else a for a in cmd]


def probe_commands(r: Any, keys: ChannelKeys) -> list[str]:
    """Run each command where it changes nothing; NOPERM says it is denied."""
    denied = []
    for cmd in COMMANDS:
        key = keys.meta if cmd[0] in WRITES else keys.stream
        try:
            r.execute_command(*args(cmd, key))
        except redis.exceptions.NoPermissionError:
            denied.append(cmd[0])
        except redis.exceptions.ResponseError as e:
            if str(e).startswith("NOPERM"):
                denied.append(cmd[0])
        finally:
            if cmd[0] in WRITES:
                with contextlib.suppress(redis.exceptions.ResponseError):
                    r.delete(key)
    return denied


def script_check(r: Any) -> Check:
    text = source("receipt")
    try:
        sha = r.script_load(text)
    except redis.exceptions.ResponseError as e:
        return Check(
            "scripts",
            "fail",
            f"SCRIPT LOAD refused: {e}",
            "allow +script|load +evalsha +eval for the bus's user (scripting must be enabled)",
        )
    return Check("scripts", "ok", f"SCRIPT LOAD receipt.lua -> {sha[:12]}…")


def persistence_check(p: dict[str, Any]) -> Check:
    if not p:
        return Check("persistence", "unknown", "INFO persistence is not permitted to this user")
    if (
        str(p.get("aof_last_write_status", "ok")) != "ok"
        or str(p.get("rdb_last_bgsave_status", "ok")) != "ok"
    ):
        return Check(
            "persistence",
            "fail",
            f"the last write to disk failed (aof: {p.get('aof_last_write_status')}, rdb: "
            f"{p.get('rdb_last_bgsave_status')})",
            "check the server's log, its disk space and the permissions of its dir",
        )
    if int(p.get("aof_enabled", 0)):
        return Check("persistence", "ok", "AOF on")
    return Check(
        "persistence",
        "warn",
        "AOF off: a restart loses what was sent since the last RDB snapshot"
        + ("" if int(p.get("rdb_last_save_time", 0)) else " (no snapshot yet)"),
        "CONFIG SET appendonly yes, and `appendonly yes` in redis.conf",
    )


def server_identity(server: dict[str, Any]) -> tuple[str, str, tuple[int, ...]]:
    """(name, version text, version) from ``INFO server``: Valkey names itself and reports
    its own version beside the Redis version it is compatible with."""
    name = str(server.get("server_name") or "redis").lower()
    text = str(server.get(f"{name}_version") or server.get("redis_version") or "")
    return name, text, tuple(int(x) for x in text.split(".")[:3] if x.isdigit())


def replays_aof_as_default_user(name: str, version: tuple[int, ...]) -> bool:
    fixed = AOF_ACL_FIXED_IN.get(name)
    start = AOF_AS_DEFAULT_USER_FROM.get(name, (0,))  # a server we do not know: assume so
    return version >= start and (fixed is None or version < fixed)


def aof_enabled(r: Any, persistence: dict[str, Any]) -> bool | None:
    """AOF on? From ``INFO persistence``, else ``CONFIG GET appendonly``; None when neither is
    permitted."""
    if "aof_enabled" in persistence:
        return bool(int(persistence["aof_enabled"]))
    try:
        value = r.config_get("appendonly").get("appendonly")
    except redis.exceptions.ResponseError:
        return None
    return None if value is None else str(value) == "yes"


def default_user_rules(r: Any) -> dict[str, list[str]] | None:
    """``ACL GETUSER default`` as {field: tokens}; None when this user may not run it."""
    try:
        reply = r.execute_command("ACL", "GETUSER", "default")
    except redis.exceptions.ResponseError:
        return None
    if isinstance(reply, list | tuple):  # RESP2 without redis-py's parsing: field, value, ...
        reply = dict(zip(reply[::2], reply[1::2], strict=False))

    def tokens(v: Any) -> list[str]:
        if isinstance(v, list | tuple):
            return [t for x in v for t in tokens(x)]
        text = v.decode() if isinstance(v, bytes) else str(v)
        return text.split()

    return {
        (k.decode() if isinstance(k, bytes) else str(k)): tokens(v)
        for k, v in (reply or {}).items()
        if not isinstance(v, dict)
    }


def has_every_permission(rules: dict[str, list[str]]) -> bool:
    """+@all with no exception, and every key (``~*``; 6.2 lists ``*`` or flags allkeys)."""
    commands = rules.get("commands", []) + rules.get("categories", [])
    every_key = {"~*", "*"} & set(rules.get("keys", [])) or "allkeys" in rules.get("flags", [])
    return sorted(set(commands)) == ["+@all"] and bool(every_key)


def aof_reload_check(r: Any, server: dict[str, Any], persistence: dict[str, Any]) -> Check:
    """Would a restart reload the whole AOF? Not on a server that replays it as the default
    user when that user may not run the bus's commands: every script's writes are lost."""
    name, text, version = server_identity(server)
    label = f"{name.capitalize()} {text}".strip()
    aof = aof_enabled(r, persistence)
    if aof is None:
        return Check(
            "aof-reload",
            "unknown",
            "could not check: this user may read neither INFO persistence nor CONFIG",
            "run `redisbus doctor` as a user that may (an admin user)",
        )
    if not aof:
        return Check("aof-reload", "ok", "AOF off: there is no AOF to reload")
    if not version:
        return Check("aof-reload", "unknown", "could not check: INFO server is not permitted")
    if not replays_aof_as_default_user(name, version):
        return Check("aof-reload", "ok", f"{label} replays its AOF without ACL checks")
    why = (
        f"AOF on, and {label} replays the AOF as the default user, checking its permissions at "
        "each EXEC (every bus script reaches the AOF as MULTI/EXEC)"
    )
    rules = default_user_rules(r)
    if rules is None:
        return Check(
            "aof-reload",
            "unknown",
            f"could not check: this user may not run ACL GETUSER default; {why}",
            "run `redisbus doctor` as an admin user, or check that the default user of the ACL "
            "file has +@all ~* (deploy/redis/users.acl)",
        )
    if has_every_permission(rules):
        state = "off" if "off" in rules.get("flags", []) else "on"
        return Check(
            "aof-reload",
            "ok",
            f"{why}; the default user ({state}) has +@all ~*, so a restart reloads it all",
        )
    shown = " ".join(
        rules.get("flags", []) + rules.get("categories", []) + rules.get("commands", [])
    )
    return Check(
        "aof-reload",
        "fail",
        f"{why}; the default user ({shown}) may not run them: a restart loses every channel's "
        "members, groups, pending and unread messages (the log says NOPERM ... 'exec')",
        "give the default user every permission and no password, kept off: `user default off "
        "resetpass ~* &* +@all` in the ACL file (as in deploy/redis/users.acl) before the next "
        "restart, which reads the ACL file before the AOF; ACL SETUSER default off resetpass "
        "~* &* +@all makes it so now",
    )


def clock_check(r: Any, settings: Any) -> Check:
    """This host's clock against Redis TIME: a signing host past the limit has its signed
    sends refused (ClockSkew)."""
    try:
        ok, detail = skew_check(r, settings)
    except redis.exceptions.RedisError as e:
        return Check("clock", "unknown", f"TIME failed: {e}")
    if ok:
        return Check("clock", "ok", detail)
    return Check("clock", "fail", detail, FIX)


def latency_check(r: Any, rounds: int = 5) -> Check:
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        r.ping()
        samples.append((time.perf_counter() - t0) * 1000)
    p50 = statistics.median(samples)
    detail = f"PING round trip {human_number(round(p50, 3))} ms (median of {rounds})"
    if p50 > SLOW_PING_MS:
        return Check(
            "latency",
            "warn",
            detail + f": over {human_number(SLOW_PING_MS)} ms, every send and wake-up pays it",
            "run the bus near its Redis (same host or zone)",
        )
    return Check("latency", "ok", detail)


def janitor_check(r: Any, prefix: str, retention_s: float) -> Check:
    """The janitor keeps no record of its runs; what shows it is missing is a stream holding
    entries older than the retention, which a janitor would have trimmed."""
    try:
        names = sorted(r.smembers(registry_key(prefix)))[:200]
        now_ms = int(r.time()[0]) * 1000
        stale = []
        for name in names:
            keys = ChannelKeys.build(prefix, name)
            first = r.xrange(keys.stream, count=1)
            kept = r.hget(keys.meta, "retention_s")
            limit_s = float(kept) if kept else retention_s
            if first and now_ms - int(str(first[0][0]).split("-")[0]) > 2 * limit_s * 1000 + 60_000:
                stale.append(name)
    except redis.exceptions.ResponseError as e:
        return Check("janitor", "unknown", f"cannot look: {e}")
    if stale:
        return Check(
            "janitor",
            "warn",
            f"last run unknown; {len(stale)} channel(s) hold entries older than twice their "
            f"retention ({', '.join(stale[:5])}): no janitor seems to run",
            "run `redisbus janitor` (or `redisbus exporter`, which includes it) somewhere",
        )
    return Check(
        "janitor",
        "unknown",
        "last run unknown (the janitor keeps no record); no channel holds entries past twice "
        "its retention",
    )
