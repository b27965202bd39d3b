"""Results: per-side medians, ratios, targets met or missed, and the table/JSON/markdown."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

from bench.common import Metrics, median

TargetKind = Literal["ratio_min", "ratio_max", "max", "min"]
Status = Literal["met", "not met", "info", "unavailable", "error"]


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool = True
    #: Show the redisbus/baseline ratio (off for counts that are equal by construction).
    ratio: bool = True


@dataclass(frozen=True)
class Target:
    """``ratio_*`` compares redisbus to the baseline on ``metric`` (to the reference labelled
    ``ref`` when given); ``max``/``min`` are absolute."""

    metric: str
    kind: TargetKind
    value: float
    text: str
    ref: str = ""


@dataclass
class Side:
    label: str
    runs: list[Metrics] = field(default_factory=list)
    error: str | None = None
    #: Per run, the latency quantiles it recorded (``bench.common.QUANTILES``), for plots.
    quantiles: list[dict[str, list[float]]] = field(default_factory=list)

    def median(self, key: str) -> float:
        return median(run[key] for run in self.runs if key in run)

    def medians(self) -> Metrics:
        keys: list[str] = []
        for run in self.runs:
            keys.extend(k for k in run if k not in keys)
        return {k: self.median(k) for k in keys}

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "runs": self.runs,
            "median": self.medians(),
            "error": self.error,
            "quantiles_us": self.quantiles,
        }


@dataclass
class TargetResult:
    target: Target
    observed: float
    met: bool | None
    gap: str

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.target.metric,
            "kind": self.target.kind,
            "value": self.target.value,
            "text": self.target.text,
            "observed": _num(self.observed),
            "met": self.met,
            "gap": self.gap,
        }


@dataclass
class FigureResult:
    name: str
    title: str
    metrics: tuple[Metric, ...]
    baseline: Side | None
    subject: Side
    refs: list[Side] = field(default_factory=list)
    specs: tuple[Target, ...] = ()
    targets: list[TargetResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unavailable: str | None = None

    @property
    def status(self) -> Status:
        if self.subject.error or (self.baseline and self.baseline.error):
            return "error"
        if self.unavailable:
            return "unavailable"
        if not self.targets:
            return "info"
        return "met" if all(t.met for t in self.targets) else "not met"

    def ratio(self, key: str, ref: str = "") -> float:
        against = next((r for r in self.refs if r.label == ref), None) if ref else self.baseline
        if against is None:
            return math.nan
        base, sub = against.median(key), self.subject.median(key)
        if math.isnan(base) or math.isnan(sub) or base == 0:
            return math.nan
        return sub / base

    def evaluate(self) -> None:
        self.targets = [self._evaluate(t) for t in self.specs]

    def _evaluate(self, t: Target) -> TargetResult:
        if t.kind in ("ratio_min", "ratio_max"):
            observed = self.ratio(t.metric, t.ref)
        else:
            observed = self.subject.median(t.metric)
        if math.isnan(observed):
            return TargetResult(t, observed, None, "not measured")
        met = observed >= t.value if t.kind in ("ratio_min", "min") else observed <= t.value
        return TargetResult(t, observed, met, _gap(t, observed, met))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "status": self.status,
            "unavailable": self.unavailable,
            "metrics": [m.__dict__ for m in self.metrics],
            "baseline": self.baseline.to_json() if self.baseline else None,
            "subject": self.subject.to_json(),
            "refs": [r.to_json() for r in self.refs],
            "ratios": {m.key: _num(self.ratio(m.key)) for m in self.metrics if m.ratio},
            "targets": [t.to_json() for t in self.targets],
            "notes": self.notes,
        }


def _gap(t: Target, observed: float, met: bool) -> str:
    suffix = "x" if t.kind.startswith("ratio") else ""
    shown = f"{observed:.2f}{suffix}" if suffix else _fmt(observed)
    if met:
        return f"{shown} (target {t.text})"
    if t.value == 0:
        return f"{shown}, target {t.text}"
    miss = abs(observed - t.value) / t.value * 100
    word = "short of" if t.kind in ("ratio_min", "min") else "over"
    if miss < 1:  # a near miss reads as one: "1.054x: 0.4% over", not "1.05x: 0% over"
        shown = f"{observed:.3f}{suffix}" if abs(observed) < 100 else shown
        return f"{shown}: {miss:.1f}% {word} {t.text}"
    return f"{shown}: {miss:.0f}% {word} {t.text}"


def _num(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


# --- machine --------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def describe_machine(redis_version: str, server_kind: str) -> dict[str, Any]:
    from redis.utils import HIREDIS_AVAILABLE

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "redis_server": redis_version,
        "server": server_kind,
        "redis_py": _version("redis"),
        "hiredis": _version("hiredis") if HIREDIS_AVAILABLE else None,
        "faststream": _version("faststream"),
        "redisbus": _version("redisbus"),
        "commit": _git_commit(),
        "load_start": load_average(),
    }


def load_average() -> float | None:
    """1-minute load average (a busy machine explains noisy figures)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_line(m: dict[str, Any]) -> str:
    hiredis = m["hiredis"] or "off"
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['os']}; Python {m['python']}; "
        f"redis-server {m['redis_server']} ({m['server']}); redis-py {m['redis_py']}, "
        f"hiredis {hiredis}; FastStream {m['faststream']}; redisbus {m['redisbus']}"
        + (f" @ {m['commit']}" if m.get("commit") else "")
        + (
            f"; load average {m['load_start']} at start, {m['load_end']} at end"
            if m.get("load_end") is not None
            else ""
        )
    )


# --- rendering --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    figure: str
    metric: str
    baseline_label: str
    baseline: str
    redisbus: str
    ratio: str
    target: str
    status: str


def rows(figures: list[FigureResult]) -> list[Row]:
    out: list[Row] = []
    for fig in figures:
        status_by_metric: dict[str, list[TargetResult]] = {}
        for t in fig.targets:
            status_by_metric.setdefault(t.target.metric, []).append(t)
        for i, m in enumerate(fig.metrics):
            unit = f" {m.unit}" if m.unit else ""
            base = fig.baseline.median(m.key) if fig.baseline else math.nan
            if fig.subject.error:
                sub = "error"
            elif fig.unavailable:
                sub = "n/a"
            else:
                sub = _fmt(fig.subject.median(m.key)) + unit
            ratio = fig.ratio(m.key) if m.ratio else math.nan
            tr = status_by_metric.get(m.key, [])
            target = "; ".join(t.text for t in fig.specs if t.metric == m.key)
            status = "; ".join(_status_word(t) for t in tr)
            if not tr and i == 0:
                status = fig.status if fig.status in ("unavailable", "error") else ""
            out.append(
                Row(
                    figure=fig.title if i == 0 else "",
                    metric=m.label,
                    baseline_label=fig.baseline.label if fig.baseline and i == 0 else "",
                    baseline=_fmt(base) + unit if fig.baseline else "",
                    redisbus=sub,
                    ratio=f"{ratio:.2f}x" if not math.isnan(ratio) else "",
                    target=target,
                    status=status,
                )
            )
        for ref in fig.refs:
            for m in fig.metrics:
                v = ref.median(m.key)
                if math.isnan(v):
                    continue
                unit = f" {m.unit}" if m.unit else ""
                out.append(Row("", m.label, f"ref: {ref.label}", _fmt(v) + unit, "", "", "", ""))
    return out


def _status_word(t: TargetResult) -> str:
    if t.met is None:
        return "not measured"
    return "met: " + t.gap if t.met else "NOT MET: " + t.gap


HEADERS = ("figure", "metric", "baseline", "value", "redisbus", "ratio", "target", "status")


def print_table(figures: list[FigureResult], machine: dict[str, Any], console: Console) -> None:
    table = Table(title="redisbus benchmarks (medians over rounds)", show_lines=False)
    for h in HEADERS:
        table.add_column(h, overflow="fold")
    for r in rows(figures):
        style = "red" if "NOT MET" in r.status or r.status == "error" else None
        table.add_row(
            r.figure,
            r.metric,
            r.baseline_label,
            r.baseline,
            r.redisbus,
            r.ratio,
            r.target,
            r.status,
            style=style,
        )
    console.print(table)
    console.print(machine_line(machine))
    for fig in figures:
        for note in fig.notes:
            console.print(f"[dim]{fig.name}: {note}[/dim]")
        for side in (fig.baseline, fig.subject, *fig.refs):
            if side and side.error:
                console.print(f"[red]{fig.name} / {side.label}: {side.error}[/red]")


def markdown(figures: list[FigureResult], machine: dict[str, Any], config: dict[str, Any]) -> str:
    lines = [
        "# Benchmark results",
        "",
        f"`python -m bench{config['argv']}` — {config['generated_at']}, "
        f"{config['rounds']} rounds per figure (fewer for the slow ones; alternating order), "
        "medians.",
        "",
        f"Machine: {machine_line(machine)}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "---|" * len(HEADERS),
    ]
    for r in rows(figures):
        cells = (
            r.figure,
            r.metric,
            r.baseline_label,
            r.baseline,
            r.redisbus,
            r.ratio,
            r.target,
            r.status,
        )
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    notes = [f"- **{f.name}**: {n}" for f in figures for n in f.notes]
    errors = [
        f"- **{f.name}** / {s.label}: {s.error}"
        for f in figures
        for s in (f.baseline, f.subject, *f.refs)
        if s and s.error
    ]
    if notes:
        lines += ["", "Notes:", "", *notes]
    if errors:
        lines += ["", "Errors:", "", *errors]
    return "\n".join(lines) + "\n"


def write(
    figures: list[FigureResult],
    machine: dict[str, Any],
    config: dict[str, Any],
    json_path: Path,
    md_path: Path,
) -> None:
    doc = {
        "schema": 1,
        "generated_at": config["generated_at"],
        "config": config,
        "machine": machine,
        "figures": [f.to_json() for f in figures],
    }
    json_path.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    md_path.write_text(markdown(figures, machine, config))


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
