"""A private Redis Cluster for the scale-out figure: three primaries holding every slot, one
replica each, persistence off (like ``bench.server``'s standalone server), on free loopback
ports, formed with ``CLUSTER ADDSLOTS`` / ``MEET`` / ``REPLICATE`` (no redis-cli needed).
"""

from __future__ import annotations

import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.server import _stop, _version, _wait_ready, find_redis_server

SLOTS = 16_384
CLUSTER_ARGS = [
    "--cluster-enabled", "yes",
    "--cluster-config-file", "nodes.conf",
    "--cluster-node-timeout", "5000",
]  # fmt: skip


@dataclass
class Shard:
    """One primary, the slots it serves (``lo..hi`` inclusive) and its replicas (ports)."""

    primary: int
    lo: int
    hi: int
    replicas: list[int] = field(default_factory=list)


@dataclass
class PrivateCluster:
    shards: list[Shard]
    version: str

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.shards[0].primary}/0"

    @property
    def primaries(self) -> list[int]:
        return [s.primary for s in self.shards]

    @property
    def replicas(self) -> list[int]:
        return [p for s in self.shards for p in s.replicas]

    def shard_of(self, slot: int) -> int:
        """Index of the shard serving ``slot``."""
        return next(i for i, s in enumerate(self.shards) if s.lo <= slot <= s.hi)


def cluster_port() -> int:
    """A free port P below the ephemeral range whose cluster bus port (P + 10000) is free too."""
    for _ in range(500):
        p = random.randrange(12_000, 22_700)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 10_000))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


def _client(port: int) -> redis.Redis:
    return redis.Redis(port=port, decode_responses=True, socket_timeout=10)


def _cluster_info(port: int) -> dict[str, Any]:
    reply = _client(port).execute_command("CLUSTER INFO")
    if isinstance(reply, dict):
        return reply
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"cluster: {what} not within {timeout} s")
        time.sleep(0.05)


def _ready(ports: list[int], replicas: list[int]) -> bool:
    for p in ports:
        if str(_cluster_info(p).get("cluster_state")) != "ok":
            return False
    for p in replicas:
        info = _client(p).info("replication")
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return False
    return True


def _start(exe: str, d: Path, port: int, extra: list[str], stack: ExitStack) -> None:
    d.mkdir()
    log = d / "redis.log"
    argv = [
        exe,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(d),
        "--maxmemory-policy", "noeviction",
        "--daemonize", "no",
        *extra,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    stack.callback(_stop, url, proc)
    _wait_ready(url, proc, log, timeout=10)


@contextmanager
def private_pair(binary: str | None = None) -> Iterator[PrivateCluster]:
    """One standalone primary with one replica: a Cluster shard's twin without the Cluster
    (the same replication work per write), described as a one-shard layout."""
    exe = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="redisbus-bench-pair-") as tmp, ExitStack() as stack:
        primary, replica = cluster_port(), cluster_port()
        _start(exe, Path(tmp) / "primary", primary, [], stack)
        _start(
            exe, Path(tmp) / "replica", replica, ["--replicaof", "127.0.0.1", str(primary)], stack
        )

        def synced() -> bool:
            info = _client(replica).info("replication")
            return bool(info.get("master_link_status") == "up")

        _wait(synced, 30, "the replica in sync")
        version = _version(f"redis://127.0.0.1:{primary}/0")
        yield PrivateCluster([Shard(primary, 0, SLOTS - 1, [replica])], version)


@contextmanager
def private_cluster(
    binary: str | None = None, shards: int = 3, replicas: int = 1
) -> Iterator[PrivateCluster]:
    """Start ``shards`` primaries with ``replicas`` replicas each; stop them all on exit."""
    exe = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="redisbus-bench-cluster-") as tmp, ExitStack() as stack:
        ports: list[int] = []
        for i in range(shards * (1 + replicas)):
            port = cluster_port()
            _start(exe, Path(tmp) / f"node{i}", port, CLUSTER_ARGS, stack)
            ports.append(port)
        prim, reps = ports[:shards], ports[shards:]
        layout: list[Shard] = []
        for i, p in enumerate(prim):
            lo, hi = i * SLOTS // shards, (i + 1) * SLOTS // shards - 1
            _client(p).execute_command("CLUSTER ADDSLOTS", *range(lo, hi + 1))
            layout.append(Shard(p, lo, hi))
        for p in ports[1:]:
            _client(p).execute_command("CLUSTER MEET", "127.0.0.1", ports[0])

        def all_met() -> bool:
            return all(int(_cluster_info(p)["cluster_known_nodes"]) == len(ports) for p in ports)

        _wait(all_met, 30, "every node meets every other")
        for j, p in enumerate(reps):
            shard = layout[j % shards]
            primary_id = _client(shard.primary).execute_command("CLUSTER MYID")
            _wait(
                lambda p=p, i=primary_id: _client(p).execute_command("CLUSTER REPLICATE", i),
                30,
                f"replica {p} takes its primary",
            )
            shard.replicas.append(p)
        _wait(lambda: _ready(ports, reps), 60, "state ok on every node, replicas in sync")
        yield PrivateCluster(layout, _version(f"redis://127.0.0.1:{prim[0]}/0"))
