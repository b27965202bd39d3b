"""The async face's transport: the lanes its I/O layer (``_async/io.py``) runs round trips on,
the client of a Cluster node, and how it sleeps.

Hand-written per face (the sync twin, ``_transport_sync``, says what both give the I/O layer
above, which is written once); here a lane is a connection of the pool read by a hiredis reader
of its own, and trips wait their turn instead of going round a busy lane."""

from __future__ import annotations

import asyncio
from typing import Any

from redis import exceptions as rx

from ._resp import Reader, Trip, pack, reader_kw

__all__ = [
    "FETCH_LANES",
    "AsyncLane",
    "Transport",
    "Trip",
    "moved",
    "node_client",
    "sleep",
    "slot_table",
]

sleep = asyncio.sleep

#: Idle lanes a transport keeps for the fetches and calls (each holds a connection); a trip
#: that finds none idle takes another connection from the pool, handed back after it when this
#: many are idle.
FETCH_LANES = 8


class Transport:
    """One lane that the send coalescer's batches take turns on, and the lanes of the other
    trips: one per trip in flight (each waiting agent blocks on a connection of its own), up
    to ``FETCH_LANES`` of them kept idle between trips.

    ``redis.asyncio``'s pipeline costs more in Python than a send or a wake-up costs the
    server; a lane is the same wire traffic without it."""

    def __init__(self, client: Any) -> None:
        self.lane = AsyncLane(client) if AsyncLane.usable(client) else None
        self.idle: list[AsyncLane] | None = [] if self.lane is not None else None
        self.client = client

    async def acquire(self, trip: Trip) -> AsyncLane | None:
        if self.lane is None or self.idle is None:
            return None
        if trip != "send":
            return self.idle.pop() if self.idle else AsyncLane(self.client)
        if self.lane.lock is None:  # made in the loop that first uses the lane
            self.lane.lock = asyncio.Lock()
        await self.lane.lock.acquire()
        return self.lane

    async def release(self, lane: AsyncLane) -> None:
        """The sends' lane to the next batch; another lane back among the idle ones, or, when
        enough are idle, its connection back to the pool (open and in step: every reply was
        read; a lane that failed dropped its connection and opens a fresh one when next used)."""
        if lane is self.lane:
            lane.lock.release()
        elif self.idle is not None and len(self.idle) < FETCH_LANES:
            self.idle.append(lane)
        else:
            conn, lane.conn, lane.reader = lane.conn, None, None
            if conn is not None:
                await lane.pool.release(conn)

    async def close(self) -> None:
        if self.lane is not None:
            await self.lane.close()
        idle, self.idle = self.idle or [], None
        for lane in idle:
            await lane.close()


async def slot_table(client: Any) -> None:
    """A Cluster client's slot table is ready: the async client fills it on first use."""
    if client._initialize:
        await client.initialize()


async def moved(client: Any, e: rx.MovedError) -> Any:
    """A Cluster client's slot table takes a MOVED reply's word: the slot is served by the node
    it names (``move_slot`` where redis-py has it, as 8.x does; 5.x and 6.x apply a noted
    MOVED at the next slot lookup). Returns that node where the client knows it (else None),
    for the next try to go to it whatever a refresh of the table meanwhile reads."""
    nodes = client.nodes_manager
    if hasattr(nodes, "move_slot"):
        await nodes.move_slot(e)
    else:
        nodes._moved_exception = e
    host, port = e.host, e.port
    if hasattr(nodes, "remap_host_port"):  # (the address as the table names it)
        host, port = nodes.remap_host_port(host, port)
    return nodes.get_node(host=host, port=port)


def node_client(client: Any, node: Any, current: Any) -> Any:
    """The client a Cluster node's standalone IO talks through: one of its own (``current``
    once made), on a pool to that node (the async cluster client keeps no ``redis.Redis`` per
    node)."""
    if current is not None:
        return current
    import redis.asyncio as aredis

    pool = aredis.ConnectionPool(
        connection_class=node.connection_class,
        max_connections=node.max_connections,
        **node.connection_kwargs,
    )
    return aredis.Redis(connection_pool=pool)


class AsyncLane:
    """A connection a round trip writes its commands to in one write, reading the replies in
    order.

    Before each trip the held connection is checked as the pool would check it: a reader at
    EOF (the server closed it) or holding unread bytes means a fresh connection. Any failure
    mid-trip, cancellation included, drops the connection: its replies can no longer be
    matched to requests. One trip at a time (the sends' lane takes turns on ``lock``); plain
    TCP only, as the sync lane."""

    def __init__(self, client: Any) -> None:
        self.pool = client.connection_pool
        self.conn: Any = None
        self.lock: Any = None  # an asyncio.Lock, for the sends' lane (see Transport.acquire)
        # replies are parsed by a hiredis reader of the lane's own, fed from the stream (one
        # timeout per trip), skipping redis.asyncio's reply layers
        self.reader: Any = None
        self.reader_kw = reader_kw(self.pool) if Reader is not None else None

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

    async def run(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Send ``commands`` in one write and return their replies in order; an error reply
        (``ResponseError``) sits in its slot. Connection trouble raises."""
        conn = self.conn
        if conn is not None and not self._clean(conn):
            await self._drop()
            conn = None
        if conn is None:
            conn = self.conn = await self.pool.get_connection()
            if self.reader_kw is not None:
                self.reader = Reader(**self.reader_kw)
        try:
            # written straight to the stream: send_packed_command wraps the drain in
            # wait_for, which costs a task and two loop turns per trip; the reads below keep
            # the socket timeout, and drain() returns at once unless the buffer is full
            writer = conn._writer
            writer.writelines(pack(conn, commands))
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
