"""A real Prometheus for tests, and the queries the dashboard and the alert rules run.

``start_prometheus`` runs the ``prometheus`` binary (``scripts/ensure-tools.sh``
installs it) on a free loopback port with a 1 s scrape interval and its storage under the
test's ``tmp_path``. ``query`` and ``wait_for_data`` use the HTTP API with urllib only.
``dashboard_queries`` and ``alert_queries`` read every expression out of the committed
dashboard and rules, ready to evaluate; ``quick_rules`` writes the committed rules with their
``for`` durations shortened (expressions, labels and annotations untouched), so that a live
test sees an alert fire in seconds; ``alerts`` and ``rule_states`` read what Prometheus made
of them.

A missing tool skips a test on a developer's machine and fails it in CI (``CI`` set).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "redisbus.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ENSURE = "scripts/ensure-tools.sh"


def require_tool(name: str) -> str:
    """Path of the executable ``name``; skip the test without it, or fail it in CI."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not on PATH (run {ENSURE})"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def require_module(name: str) -> Any:
    """Import ``name``; skip the test without it, or fail it in CI."""
    try:
        return importlib.import_module(name)
    except ImportError:
        msg = f"python module {name} is not installed (make .venv/.installed)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(
    scrape_targets: dict[str, list[str]], rule_files: Iterable[Path], interval: str
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job,
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "static_configs": [{"targets": list(targets)}],
            }
            for job, targets in scrape_targets.items()
        ],
    }


def start_prometheus(
    tmp_path: Path,
    scrape_targets: dict[str, list[str]],
    rule_files: Sequence[Path] = (),
    *,
    interval: str = "1s",
    ready_timeout_s: float = 30.0,
) -> tuple[str, Callable[[], None]]:
    """Start Prometheus scraping ``{job: ["host:port", ...]}``; returns (base url, stop).

    ``stop`` is idempotent; call it in a ``finally`` or register it as a finalizer.
    """
    binary = require_tool("prometheus")
    home = tmp_path / "prometheus"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "prometheus.yml"
    # JSON is YAML, so no YAML library is needed to write the config.
    config.write_text(json.dumps(_config(scrape_targets, rule_files, interval), indent=2))
    log = (home / "prometheus.log").open("wb")
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={home / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=1h",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=home,
    )
    url = f"http://127.0.0.1:{port}"

    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()

    deadline = time.monotonic() + ready_timeout_s
    while True:
        if proc.poll() is not None:
            stop()
            raise RuntimeError(
                f"prometheus exited with {proc.returncode}:\n"
                + (home / "prometheus.log").read_text(errors="replace")[-4000:]
            )
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return url, stop
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"prometheus not ready after {ready_timeout_s} s")
        time.sleep(0.1)


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """Evaluate ``expr`` now (``/api/v1/query``); returns the result list.

    Raises ``ValueError`` with Prometheus' message when the expression is rejected.
    """
    qs = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{qs}", timeout=10) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    if body.get("status") != "success":
        raise ValueError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
    data = body["data"]
    if data["resultType"] in ("scalar", "string"):
        return [{"metric": {}, "value": data["result"]}]
    result: list[dict[str, Any]] = data["result"]
    return result


def wait_for_data(url: str, expr: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Poll ``expr`` until it returns at least one sample; fail the test at the timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = query(url, expr)
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"no data for {expr!r} after {timeout_s} s")
        time.sleep(0.25)


def targets_up(url: str) -> dict[str, str]:
    """``{scrape url: health}`` of every active target."""
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=10) as r:
        body = json.load(r)
    return {t["scrapeUrl"]: t["health"] for t in body["data"]["activeTargets"]}


def substitute(expr: str, rate_interval: str = "1m") -> str:
    """A dashboard expression as Prometheus can run it: Grafana's variables replaced.

    ``$__rate_interval`` becomes ``rate_interval``; ``$job`` / ``$instance`` (always used
    with ``=~``) become ``.*``, which is what the dashboard's "All" selects.
    """
    expr = expr.replace("$__rate_interval", rate_interval)
    expr = re.sub(r"\$\{?(job|instance)\}?", ".*", expr)
    if "$" in expr:
        raise ValueError(f"unsubstituted variable in {expr!r}")
    return expr


def _panels(items: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for p in items:
        yield p
        yield from _panels(p.get("panels", []))  # panels inside collapsed rows


def dashboard_panels(path: Path = DASHBOARD) -> list[dict[str, Any]]:
    """Every panel of the dashboard, rows included, collapsed rows' children too."""
    return list(_panels(json.loads(path.read_text(encoding="utf-8"))["panels"]))


def dashboard_queries(path: Path = DASHBOARD, rate_interval: str = "1m") -> list[tuple[str, str]]:
    """``(panel title / refId, runnable expr)`` for every target of every panel."""
    out = []
    for panel in dashboard_panels(path):
        for i, t in enumerate(panel.get("targets", [])):
            if t.get("expr"):
                ref = t.get("refId") or chr(ord("A") + i)
                out.append((f"{panel['title']} / {ref}", substitute(t["expr"], rate_interval)))
    return out


def alert_queries(path: Path = ALERTS) -> list[tuple[str, str]]:
    """``(alert name, expr)`` for every alerting rule. Needs PyYAML."""
    yaml = require_module("yaml")
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [
        (rule["alert"], rule["expr"])
        for group in doc["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def quick_rules(tmp_path: Path, for_: str = "1s", path: Path = ALERTS) -> Path:
    """The committed alert rules with every ``for`` set to ``for_``, written under
    ``tmp_path``. Only the waiting time changes: ``promtool test rules`` covers the real
    durations, a live Prometheus the expressions, labels and annotations."""
    yaml = require_module("yaml")
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = for_
    out = tmp_path / "quick-alerts.yml"
    out.write_text(json.dumps(doc, indent=2), encoding="utf-8")  # JSON is YAML
    return out


def alerts(url: str) -> list[dict[str, Any]]:
    """Active alerts (pending and firing), each with ``labels``, ``annotations``, ``state``."""
    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=10) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["alerts"]
    return result


def rule_states(url: str) -> dict[str, tuple[str, str]]:
    """``{alert name: (health, state)}`` of every alerting rule loaded."""
    with urllib.request.urlopen(f"{url}/api/v1/rules?type=alert", timeout=10) as r:
        groups = json.load(r)["data"]["groups"]
    return {rule["name"]: (rule["health"], rule["state"]) for g in groups for rule in g["rules"]}


def wait_until(what: str, pred: Callable[[], bool], timeout_s: float = 30.0) -> float:
    """Poll ``pred`` every 0.2 s; fail the test with ``what`` at the timeout. Returns the
    seconds it took."""
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"{what}: not after {timeout_s} s")
        time.sleep(0.2)
    return time.monotonic() - start
