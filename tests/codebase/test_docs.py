"""The docs site: it builds with ``mkdocs build --strict``, its reference pages are generated
from the code (so they list every setting, command, error and public name), and the pages say
what a newcomer found undocumented."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer

import redisbus
from redisbus import BusSettings, _errors
from redisbus.cli import app
from redisbus.exporter import ExporterSettings

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-4000:]}"
    return out


def _page(site: Path, name: str) -> str:
    return html.unescape((site / name / "index.html").read_text())


def test_configuration_page_lists_every_variable_with_its_default(site: Path) -> None:
    page = _page(site, "reference/configuration")
    for cls in (BusSettings, ExporterSettings):
        for name, field in cls.model_fields.items():
            assert f"REDISBUS_{name.upper()}" in page, name
            assert field.description, f"{cls.__name__}.{name} has no description to document"
            assert " ".join(field.description.split()) in " ".join(page.split()), name
    assert "'auto_responder', 'message-router'" in page  # a default, as the code has it


def test_cli_page_lists_every_command_and_option(site: Path) -> None:
    page = _page(site, "reference/cli")
    group = typer.main.get_command(app)
    ctx = group.make_context("redisbus", [], resilient_parsing=True)
    for name in group.list_commands(ctx):  # type: ignore[attr-defined]
        assert f"redisbus {name}" in page, name
        for param in group.get_command(ctx, name).params:  # type: ignore[attr-defined]
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in page, f"redisbus {name} {opt}"


def test_error_page_draws_the_whole_tree_with_codes(site: Path) -> None:
    page = _page(site, "reference/errors")

    def walk(cls: type) -> list[type]:
        subs: list[type] = cls.__subclasses__()
        return [cls, *(c for sub in subs for c in walk(sub))]

    classes = walk(_errors.RedisbusError)
    assert _errors.CircuitOpen in classes
    for cls in classes:
        assert cls.__name__ in page and f"{cls.code}" in page, cls  # type: ignore[attr-defined]


def test_api_page_documents_every_public_name(site: Path) -> None:
    page = _page(site, "reference/api")
    for name in redisbus.__all__:
        assert f'id="redisbus.{name}"' in page, name
    for method in ("Bus.from_url", "Bus.from_settings", "AsyncBus.from_url", "Agent.send"):
        assert f'id="redisbus.{method}"' in page, method


def test_nav_has_every_page_and_the_benchmark_table(site: Path) -> None:
    for name in ("architecture", "runbook", "deployment", "console", "a2a", "security"):
        assert (site / name / "index.html").exists(), name
    bench = _page(site, "benchmarks")
    assert "raw XADD" in bench and "wake-up" in bench  # bench/RESULTS.md, included


def test_generated_markers_expand_and_unknown_ones_fail() -> None:
    gen = _gen_docs()
    assert "REDISBUS_LEASE_S" in gen.expand("x\n<!-- generated: configuration -->\ny")
    with pytest.raises(ValueError, match="unknown generated table"):
        gen.expand("<!-- generated: nonsense -->")


@pytest.mark.parametrize(
    ("page", "phrases"),
    [
        (
            "concepts.md",
            [
                "does not reorder delivery",
                "returns the **oldest** `limit`",
                "returns the **newest** `limit`",
                "dampen_turns",
                "breaker_failures",
                "auto_reply_deny",
                "retention_s",
                "`lease_s`",
                "`agent_lease_s`",
                "socket_timeout_s",
                "retry_attempts",
            ],
        ),
        ("security.md", ["REDISBUS_SIGNING_KEYS", "REDISBUS_UNSIGNED", "REDISBUS_REPLAY_KEEP_S"]),
        ("delivery.md", ["At-least-once", "durable=True", "idempotency_key", "appendfsync"]),
    ],
)
def test_pages_document_what_was_undocumented(page: str, phrases: list[str]) -> None:
    text = " ".join((DOCS / page).read_text().split())
    missing = [p for p in phrases if p not in text]
    assert not missing, f"{page} does not say: {missing}"


def test_readme_is_for_newcomers_and_links_pages_that_exist() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme  # .ci/run calls `make test`
    assert "_settings.py" not in readme
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).exists(), target
    assert len(readme.splitlines()) < 150
