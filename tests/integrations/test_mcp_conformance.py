"""The official MCP conformance suite (npm ``@modelcontextprotocol/conformance``) against
``redisbus mcp`` over streamable HTTP, for every server scenario that applies to a tools-only
server. The suite is installed with npm into ``.cache/`` (git-ignored) on first use; without
node and npm the tests skip locally and fail under CI.

Not applicable, so not run: ``tools-call-*``, ``json-schema-2020-12`` and ``server-sse-polling``
call test tools of the suite's own (``test_simple_text``, ``test_reconnection``, ...);
``resources-*``, ``prompts-*``, ``completion-complete`` and ``elicitation-*`` need capabilities
a tools-only server does not declare.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mcp_support import ROOT, http_server
from tests.support.servers import Server, missing

pytestmark = pytest.mark.timeout(300)

# 0.1.12 is the last release that runs on Node 20; later ones need Node 22
PACKAGE = "@modelcontextprotocol/conformance"
VERSION = "0.1.12"
CACHE = ROOT / ".cache" / f"mcp-conformance-{VERSION}"

SCENARIOS = (
    "server-initialize",
    "ping",
    "tools-list",
    "logging-set-level",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
)
# the suite's other server scenarios, and why they do not apply (see the module docstring)
NOT_APPLICABLE = (
    "completion-complete",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
)


def installed_version() -> str | None:
    meta = CACHE / "node_modules" / "@modelcontextprotocol" / "conformance" / "package.json"
    try:
        return str(json.loads(meta.read_text())["version"])
    except (OSError, ValueError, KeyError):
        return None


@pytest.fixture(scope="module")
def conformance() -> Path:
    """The suite's command, installed into the cache directory when it is not there yet."""
    if not (shutil.which("node") and shutil.which("npm")):
        missing("node and npm are needed for the MCP conformance suite")
    binary = CACHE / "node_modules" / ".bin" / "conformance"
    if installed_version() != VERSION or not binary.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        p = subprocess.run(
            ["npm", "install", "--prefix", str(CACHE), "--no-audit", "--no-fund",
             f"{PACKAGE}@{VERSION}"],
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )  # fmt: skip
        if p.returncode != 0 or not binary.exists():
            missing(f"npm install {PACKAGE}@{VERSION} failed: {p.stderr.strip()[-500:]}")
    return binary


@pytest.fixture(scope="module")
def endpoint(redis7: Server) -> Iterator[str]:
    """One ``redisbus mcp --transport http`` on loopback, without a token (the suite cannot
    send one; its DNS-rebinding scenario is about exactly such a server)."""
    with http_server(redis7.url, "conf-" + uuid.uuid4().hex[:8], "conformer") as url:
        yield url


def test_every_server_scenario_of_the_suite_is_run_or_known_not_to_apply(
    conformance: Path,
) -> None:
    p = subprocess.run(
        [str(conformance), "list"], capture_output=True, text=True, timeout=120, check=True
    )
    server_part = p.stdout.split("Server scenarios", 1)[1].split("Client scenarios", 1)[0]
    listed = [ln.strip()[2:] for ln in server_part.splitlines() if ln.strip().startswith("- ")]

    assert sorted(listed) == sorted(SCENARIOS + NOT_APPLICABLE)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_conformance_scenario_passes(
    conformance: Path, endpoint: str, scenario: str, tmp_path: Path
) -> None:
    p = subprocess.run(
        [str(conformance), "server", "--url", endpoint, "--scenario", scenario,
         "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip

    [report] = tmp_path.glob("*/checks.json")
    checks = json.loads(report.read_text())
    verdicts = {c["id"]: c["status"] for c in checks if c["status"] != "INFO"}
    assert verdicts and set(verdicts.values()) == {"SUCCESS"}, (verdicts, p.stdout[-2000:])
    assert p.returncode == 0, p.stdout[-2000:]
