"""Run one Hermes scenario in a fresh subprocess with its own HERMES_HOME.

Hermes's plugin manager, tool registry, async-delegation queue and session database are
process-wide, and plugin discovery happens on the first ``import run_agent``. So every
scenario runs in a new interpreter whose ``HERMES_HOME`` (a temp dir with a ``config.yaml``)
is set before anything from Hermes is imported.

A scenario is a module-level function ``fn(**params) -> JSON-able value`` in a file of this
directory (test modules are fine, as long as they import Hermes only inside functions)::

    from harness import run_scenario

    def scenario_hello() -> dict:
        from run_agent import AIAgent
        ...
        return {"final": result["final_response"]}

    def test_hello():
        out = run_scenario(scenario_hello)
        assert out["final"] == "hello"

Inside the scenario, ``hermes_home()`` is the temp dir, and ``new_agent(base_url, ...)``
builds an ``AIAgent`` with the quiet, local settings every test wants.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]

DEFAULT_CONFIG: dict[str, Any] = {
    "agent": {"environment_probe": False},
    "delegation": {"max_iterations": 5, "max_concurrent_children": 3},
    "plugins": {"enabled": ["redisbus"]},
}


TOOL_SEARCH_ENV = "REDISBUS_TEST_TOOL_SEARCH"  # on | off | unset: Hermes's default (auto)


def _hermes_version() -> tuple[int, ...]:
    """The installed Hermes's version (official package or a fork), without importing it."""
    import importlib.metadata as md

    for dist in md.packages_distributions().get("run_agent", []):
        try:
            return tuple(int(x) for x in md.version(dist).split(".")[:2])
        except (md.PackageNotFoundError, ValueError):
            continue
    return (0, 0)


HERMES_VERSION = _hermes_version()
# 0.20+ (the forks) defer plugin tools by default; 0.19's "auto" defers only past 10 % of
# the context (never for one plugin tool); "on" defers them on both
DEFERS_BY_DEFAULT = HERMES_VERSION >= (0, 20)


def tool_search_mode() -> str | None:
    """``tools.tool_search.enabled`` the scenarios run with (None: Hermes's default)."""
    return os.environ.get(TOOL_SEARCH_ENV) or None


def tool_search_on() -> bool:
    """Whether plugin tools are hidden behind tool_search/tool_call in the scenarios."""
    mode = tool_search_mode()
    return mode == "on" or (mode in (None, "auto") and DEFERS_BY_DEFAULT)


class ScenarioError(AssertionError):
    """The scenario subprocess failed; the message carries its traceback and output tail."""


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _dump_yaml(data: Any) -> str:
    """JSON is valid YAML; keep the config readable without needing PyYAML here."""
    return json.dumps(data, indent=2) + "\n"


def run_scenario(
    fn: Callable[..., Any],
    *,
    config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    params: Mapping[str, Any] | None = None,
    timeout: float = 120.0,
    home: str | os.PathLike[str] | None = None,
) -> Any:
    """Run ``fn(**params)`` in a subprocess with a fresh HERMES_HOME; return its result.

    ``config`` is deep-merged over ``DEFAULT_CONFIG`` into ``$HERMES_HOME/config.yaml``
    (``config={"plugins": {"enabled": []}}`` disables the plugin). ``env`` adds or, with a
    value of ``""``, blanks environment variables. ``home`` reuses a directory (e.g. to
    check persistence across two runs); by default a temp dir is created and removed.
    """
    src = Path(inspect.getfile(fn)).resolve()
    if fn.__name__ != fn.__qualname__:
        raise ValueError("a scenario must be a module-level function")
    base = DEFAULT_CONFIG
    if tool_search_mode() is not None:
        base = _merge(base, {"tools": {"tool_search": {"enabled": tool_search_mode()}}})
    cfg = _merge(base, config or {})
    with tempfile.TemporaryDirectory(prefix="hermes-home-") as tmp:
        hermes_home = Path(home) if home is not None else Path(tmp)
        hermes_home.mkdir(parents=True, exist_ok=True)
        (hermes_home / "config.yaml").write_text(_dump_yaml(cfg))
        out_file = Path(tmp) / "scenario-result.json"
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")}
        child_env.update(
            HERMES_HOME=str(hermes_home),
            SCENARIO_OUT=str(out_file),
            SCENARIO_PARAMS=json.dumps(dict(params or {})),
            PYTHONPATH=os.pathsep.join(
                [str(REPO), str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            PYTHONUNBUFFERED="1",
        )
        for k, v in (env or {}).items():
            if v == "":
                child_env.pop(k, None)
            else:
                child_env[k] = v
        cmd = [sys.executable, str(Path(__file__).resolve()), str(src), fn.__name__]
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                cmd,
                cwd=str(hermes_home),
                env=child_env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            raise ScenarioError(
                f"scenario {fn.__name__} timed out after {timeout}s\n"
                f"--- stdout ---\n{_tail(e.stdout)}\n--- stderr ---\n{_tail(e.stderr)}"
            ) from None
        elapsed = time.monotonic() - t0
        payload = json.loads(out_file.read_text()) if out_file.exists() else None
        if proc.returncode != 0 or payload is None or "error" in payload:
            err = (payload or {}).get("error", f"exit code {proc.returncode}, no result")
            raise ScenarioError(
                f"scenario {fn.__name__} failed: {err}\n"
                f"--- stdout ---\n{_tail(proc.stdout)}\n--- stderr ---\n{_tail(proc.stderr)}"
            )
        result = payload["result"]
        if isinstance(result, dict):
            result.setdefault("_elapsed_s", round(elapsed, 2))
        return result


def _tail(s: str | bytes | None, n: int = 4000) -> str:
    if s is None:
        return ""
    if isinstance(s, bytes):
        s = s.decode(errors="replace")
    return s[-n:]


# ---------------------------------------------------------------------------------------
# Helpers for code running inside a scenario


def hermes_home() -> Path:
    return Path(os.environ["HERMES_HOME"])


def new_agent(base_url: str, toolsets: list[str] | None = None, **kw: Any) -> Any:
    """An ``AIAgent`` wired to the stub model with quiet, local settings."""
    from run_agent import AIAgent

    opts: dict[str, Any] = dict(
        base_url=base_url,
        api_key="stub",
        model="stub-model",
        enabled_toolsets=toolsets if toolsets is not None else ["delegation", "agent_channel"],
        quiet_mode=True,
        skip_context_files=True,
        skip_memory=True,
        max_iterations=8,
    )
    opts.update(kw)
    return AIAgent(**opts)


def _main(argv: list[str]) -> int:
    src, name = argv[1], argv[2]
    out = Path(os.environ["SCENARIO_OUT"])
    try:
        spec = importlib.util.spec_from_file_location(f"_scenario_{Path(src).stem}", src)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        params = json.loads(os.environ.get("SCENARIO_PARAMS") or "{}")
        result = getattr(module, name)(**params)
        out.write_text(json.dumps({"result": result}, default=str))
        code = 0
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        code = 1
    plugin = sys.modules.get("redisbus.integrations.hermes")
    if plugin is not None:  # close the bus (and stop an embedded Redis) before _exit
        try:
            plugin.deactivate()
        except Exception:
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    # Hermes leaves daemon threads (async delegation, tool loops) behind; don't wait on them.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(_main(sys.argv))
