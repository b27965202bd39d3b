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


def main() -> int:
    ensure_tools()
    # the soak tests (many minutes each) are `make soak`'s; an explicit -m decides otherwise
    marks = [] if "-m" in sys.argv[1:] else ["-m", "not soak"]
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *marks, *sys.argv[1:]]
    code = subprocess.call([sys.executable, *args])
    if code == 5:
        print("tests/run: pytest collected no tests - failing the run", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
