"""RESP on a held connection: what the two faces' lanes (``_transport_sync``,
``_transport_async``) share. Commands are packed in C by hiredis, replies parsed by a hiredis
reader of the lane's own, and an error reply handed over as the exception redis-py would raise
for it (NOSCRIPT, READONLY, ...), kept in its slot instead of raised."""

from __future__ import annotations

from typing import Any, Literal

from redis import exceptions as rx
from redis._parsers.base import BaseParser

__all__ = ["Reader", "Trip", "pack", "reader_kw"]

#: What a round trip is for, which decides the lane it rides (see each face's
#: ``Transport.acquire``): a batch of sends; a call's own script calls (one trip); a blocking
#: read (a wait's fetch, ``ask()``'s watch for its reply).
Trip = Literal["send", "call", "fetch"]

#: hiredis's reply parser (None without hiredis: the sync face then has no lane)
Reader: Any
_hiredis_pack: Any
try:
    from hiredis import Reader
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    Reader = _hiredis_pack = None

_ERROR_PARSER: Any = BaseParser


def pack(conn: Any, commands: list[tuple[Any, ...]]) -> list[bytes]:
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


def reader_kw(pool: Any) -> dict[str, Any]:
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
    """An error reply as the exception redis-py would raise for it: the hiredis reader hands
    it over instead of raising, and a lane's ``run`` keeps it in its slot."""
    err: rx.ResponseError = _ERROR_PARSER.parse_error(message)
    return gone(err)


def gone(err: rx.ResponseError) -> rx.ResponseError:
    """An FCALL of a function the server does not have (a restart without persistence, a
    failover to a node that never had it, FUNCTION FLUSH) as what EVALSHA's NOSCRIPT is: load
    the scripts again and repeat."""
    if str(err).startswith("Function not found"):
        return rx.NoScriptError(str(err))
    return err
