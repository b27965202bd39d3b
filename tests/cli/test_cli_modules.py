"""How the CLI's modules hang together, and how its errors read: no import cycles (none hidden
in a function either), and limits that print their numbers as people write them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import redisbus
from redisbus._commands import refusal_text
from redisbus._errors import (
    BudgetExceeded,
    ChainTooDeep,
    CircuitOpen,
    InboxFull,
    LimitExceeded,
    LoopRefused,
    RateLimited,
    TooLarge,
    UnknownAgent,
    UnknownChannel,
    error_from_code,
    human_bytes,
    human_number,
)

PACKAGE = Path(redisbus.__file__).parent
CLI_MODULES = ["cli", "cli._shared", "cli.doctor", "cli.life", "cli.ops", "cli.talk", "demo"]
CLI_MODULES += ["_commands", "_show", "_demo_script", "_errors"]


def _path(module: str) -> Path:
    """The file of a module named relative to the package (``cli`` is a package)."""
    path = PACKAGE.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imports(module: str) -> tuple[set[str], set[str]]:
    """(redisbus modules imported at module level, those imported inside a function), named
    relative to the package as CLI_MODULES names them (``cli.talk``, ``_errors``)."""
    path = _path(module)
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    inner: set[str] = set()

    def named(base: list[str], name: str) -> str:
        """``base.name`` when that is a module of the package, else ``base``."""
        full = ".".join([*base, name])
        return full if _path(full).exists() else ".".join(base)

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            found: set[str] = set()
            if isinstance(child, ast.ImportFrom) and child.level:
                base = here[: len(here) - child.level + 1]
                base += (child.module or "").split(".") if child.module else []
                found.update(named(base, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("redisbus."):
                base = (child.module or "").split(".")[1:]
                found.update(named(base, a.name) for a in child.names)
            (inner if in_function else top).update(m for m in found if m)
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            visit(child, nested)

    visit(tree, False)
    return top, inner


def test_cli_modules_import_nothing_inside_functions() -> None:
    hidden = {m: sorted(imports(m)[1]) for m in CLI_MODULES if imports(m)[1]}

    assert hidden == {}


def test_cli_modules_form_no_import_cycle() -> None:
    graph = {m: imports(m)[0] for m in CLI_MODULES}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, set()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert [m for m in CLI_MODULES if reaches(m, m, set())] == []
    assert not {m for m in graph["demo"] if m.split(".")[0] == "cli"}  # the CLI runs the demo


@pytest.mark.parametrize(
    ("value", "text"),
    [(1048576, "1048576"), (1048576.0, "1048576"), (0.0019999999999998, "0.002"), (2.5, "2.5")],
)
def test_numbers_print_as_people_write_them(value: float, text: str) -> None:
    assert human_number(value) == text


def test_sizes_print_in_binary_units() -> None:
    assert [human_bytes(v) for v in (900, 32768, 1536, 1048576)] == [
        "900 B",
        "32 KiB",
        "1.5 KiB",
        "1 MiB",
    ]


def test_too_large_says_its_limit_and_current_value() -> None:
    e = TooLarge("body is too large (bytes)", limit=1048576.0, current=2000000.0)

    assert str(e) == ("body is too large (bytes): limit 1048576 (1 MiB), current 2000000 (1.9 MiB)")


def test_a_rate_limit_says_when_to_retry_in_plain_seconds() -> None:
    e = error_from_code("rate_limited", "sender rate limit for writer", 3, 0, 0.0019999999999998)

    assert str(e) == "sender rate limit for writer: limit 3, current 0, retry after 0.002 s"
    assert refusal_text(e) == f"rate_limited: {e}"  # the numbers once, not twice


@pytest.mark.parametrize(
    "kind",
    [InboxFull, RateLimited, TooLarge, ChainTooDeep, LoopRefused, CircuitOpen, BudgetExceeded],
)
def test_every_limit_error_carries_its_numbers_in_its_text(kind: type[LimitExceeded]) -> None:
    e = kind("refused", limit=100.0, current=101.0)

    assert "limit 100" in str(e) and "current 101" in str(e)
    assert str(kind("refused")) == "refused"  # no numbers known, none invented


def test_an_unknown_channel_is_its_own_code_and_still_an_unknown_agent() -> None:
    e = UnknownChannel("no such channel 'x'")

    assert e.code == "unknown_channel" and isinstance(e, UnknownAgent)
