"""Least-privilege Redis ACL users per agent host (docs/security.md#redis-acl-users): each limited
to the keys of the channels it may use, with the commands the bus runs and nothing else.

``redisbus acl`` prints the lines; the operator loads them with ``ACL LOAD`` (from an ACL
file) or ``ACL SETUSER``. A channel pattern is an ``fnmatch`` pattern of the trust list
(``team-*``); its keys are ``PREFIX:{CHANNEL}:*``, so the Redis key pattern is
``PREFIX:{team-*}:*`` (Redis globs and fnmatch share ``*``, ``?`` and ``[...]``; fnmatch's
``[!...]`` is Redis's ``[^...]``). The registry of channel names (``PREFIX:channels``, one set
outside every channel's slot) is shared: a host can see which channels exist, not their keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ._errors import InvalidInput

#: What an agent host runs: the commands of the ``agent`` user of deploy/redis/users.acl
#: (tests/security/test_acl_generator.py keeps the two the same).
AGENT_COMMANDS = (
    "+ping +hello +auth +client|setname +client|id +info +time +wait +multi +exec +discard "
    "+watch +unwatch +cluster|slots +cluster|nodes +readonly +xadd +xreadgroup +xread +xack "
    "+xclaim +xautoclaim +xpending +xrange +xrevrange +xlen +xinfo +xgroup +xtrim +xdel "
    "+rpush +lpop +blpop +lrange +ltrim +lrem +llen "
    "+evalsha +eval +script|load +script|exists +hget +hset +hsetnx +hmget +hgetall +hdel "
    "+hincrby +hincrbyfloat +hexists +hlen +hkeys +hscan +object|encoding +sadd +smembers "
    "+srem +sismember +scard +zadd +zrem +zrangebyscore +get +set +del +exists +expire "
    "+pexpire +pttl"
)


def key_pattern(prefix: str, channel_pattern: str) -> str:
    if not channel_pattern or any(c in channel_pattern for c in "{} \t\r\n"):
        raise InvalidInput(f"channel pattern {channel_pattern!r}: empty, or braces or spaces")
    return f"~{prefix}:{{{channel_pattern.replace('[!', '[^')}}}:*"


def acl_user(user: str, password: str, channels: Iterable[str], prefix: str = "rb") -> str:
    """One ``user ...`` line of an ACL file: ``user`` may run the bus's commands on the keys
    of ``channels`` (patterns) and the channel registry, and nothing else. The password is
    stored as its SHA-256, never in clear."""
    if not user or not user.isprintable() or " " in user:
        raise InvalidInput(f"ACL user {user!r}: printable, without spaces")
    if not password:
        raise InvalidInput("an ACL user needs a password")
    patterns = [key_pattern(prefix, c) for c in channels]
    if not patterns:
        raise InvalidInput("an ACL user needs at least one channel pattern")
    digest = hashlib.sha256(password.encode()).hexdigest()
    keys = " ".join([*patterns, f"~{prefix}:channels"])
    return f"user {user} on #{digest} resetkeys {keys} resetchannels -@all {AGENT_COMMANDS}"
