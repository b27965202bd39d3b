"""The sync face's transport: the socket lanes its I/O layer (``_sync/io.py``, generated) runs
round trips on, the client of a Cluster node, and how it sleeps.

Hand-written per face (the async twin is ``_transport_async``); the I/O layer above is written
once, in ``_async/io.py``. Both twins give it the same names:

- ``Transport(client)``: the lanes of one client (none where a lane cannot serve it: a Cluster
  client, TLS, a test double's connections);
- ``acquire(trip)``, a lane for that kind of round trip or None (the trip then goes through
  redis-py's pipeline, which the pool serves); ``lane.run(commands)``, the replies in order,
  an error reply in its slot; ``release(lane)``; ``close()``;
- ``slot_table(client)``, ``node_client(client, node, current)`` and ``moved(client, e)``, for
  Cluster routing;
- ``sleep``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import sys
import threading
import time
import weakref
from typing import Any, NoReturn

import redis
from redis import exceptions as rx

from ._resp import Reader, Trip, pack, reader_kw

__all__ = ["Lane", "Transport", "Trip", "moved", "node_client", "sleep", "slot_table"]

sleep = time.sleep


class Transport:
    """Two lanes per client: one for the scripts (sends and calls), one for ``wait()``'s
    blocking fetches, so a waiting thread never keeps the scripts' lane from the others. A
    lane serves one thread at a time; a trip that finds its lane busy goes through the pool."""

    def __init__(self, client: Any) -> None:
        usable = Lane.usable(client)
        self.lane = Lane(client) if usable else None
        self.fetch_lane = Lane(client) if usable else None

    def acquire(self, trip: Trip) -> Lane | None:
        lane = self.fetch_lane if trip == "fetch" else self.lane
        if lane is None or not lane.lock.acquire(blocking=False):
            return None
        return lane

    def release(self, lane: Lane) -> None:
        lane.lock.release()

    def close(self) -> None:
        for lane in (self.lane, self.fetch_lane):
            if lane is not None:
                lane.close()


def slot_table(client: Any) -> None:
    """A Cluster client's slot table is ready: the sync client fills it in its constructor."""


def moved(client: Any, e: rx.MovedError) -> Any:
    """A Cluster client's slot table takes a MOVED reply's word: the slot is served by the node
    it names (``move_slot`` where redis-py has it, as 8.x does; 5.x and 6.x apply a noted
    MOVED at the next slot lookup). Returns that node where the client knows it (else None),
    for the next try to go to it whatever a refresh of the table meanwhile reads."""
    nodes = client.nodes_manager
    if hasattr(nodes, "move_slot"):
        nodes.move_slot(e)
    else:
        nodes._moved_exception = e
    host, port = e.host, e.port
    if hasattr(nodes, "remap_host_port"):  # (the address as the table names it)
        host, port = nodes.remap_host_port(host, port)
    return nodes.get_node(host=host, port=port)


def node_client(client: Any, node: Any, current: Any) -> Any:
    """The client a Cluster node's standalone IO talks through: the cluster client's own for
    that node (a refresh of the slot table may have replaced it since ``current``; a node
    first named by a MOVED reply gets one here)."""
    return client.get_redis_connection(node)


class Lane:
    """One connection held for the sync client's hot path (the scripts, or the fetches).

    ``redis.Redis`` checks a connection out of its pool for every command (a lock, counters
    and a non-blocking ``recv`` to see that the socket is clean) and reads the reply through
    several layers; together that cost more per call than a send's script costs the server.
    The lane keeps one connection that the pool opened (so AUTH, SELECT and the client name
    are the pool's), and talks on its socket directly: one ``sendall`` of the packed
    commands, ``recv_into`` a buffer, a hiredis reader of its own. Before each use the socket
    is checked with a ``poll``: readable means closed by the server or holding stray bytes, so
    it is replaced, exactly when the pool would have replaced it. One thread at a time (the
    ``lock``, which ``Transport`` takes). Plain TCP only (a TLS socket can be readable with
    records the client has not asked for), and only with hiredis installed (a dependency)."""

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.lock = threading.Lock()
        self.conn: Any = None
        self.sock: Any = None
        self.reader: Any = None
        self.poller: Any = None
        self.buf = bytearray(65536)
        _LANES.add(self)
        self.reader_kw = reader_kw(self.pool)

    @staticmethod
    def usable(client: Any) -> bool:
        pool = getattr(client, "connection_pool", None)
        cls = getattr(pool, "connection_class", None)
        return (
            Reader is not None
            and isinstance(client, redis.Redis)
            and isinstance(cls, type)
            and issubclass(cls, redis.connection.Connection)
            and cls.__module__.startswith("redis.")  # not a test double's connection
            and not issubclass(cls, redis.connection.SSLConnection)
            and int(getattr(pool, "connection_kwargs", {}).get("protocol") or 2) == 2
            and hasattr(select, "poll")
        )

    def run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write and return their replies in order (an error reply
        sits in its slot, the connection stays). Anything else, a dropped connection, a
        timeout or an interrupt, drops the connection and raises (as redis-py's
        ``ConnectionError`` / ``TimeoutError`` for socket trouble)."""
        if self.sock is None or self.poller.poll(0):
            self._open()
        try:
            _sendall(self.sock, b"".join(pack(self.conn, commands)))
            if len(commands) == 1:  # the hot path: one script call
                return [self._reply()]
            return [self._reply() for _ in commands]
        except BaseException as e:
            self._fail(e)

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
        self.reader = Reader(**self.reader_kw)
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

#: Every lane, forgotten (not closed) in a forked child: the socket is the parent's.
_LANES: weakref.WeakSet[Lane] = weakref.WeakSet()


def _forget_lanes() -> None:
    for lane in list(_LANES):
        lane.conn = lane.sock = lane.poller = lane.reader = None
        lane.lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_lanes)
