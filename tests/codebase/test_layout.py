"""The package's layout shows its architecture: imports go one way, modules (Python and Lua)
stay small, no two hand-written modules say the same thing twice, and an import inside a
function is there on purpose.

Every ``import`` counts as an edge, at module level or inside a function (a function-level
import only hides a cycle until the function runs), except under ``if TYPE_CHECKING:`` (never
run) and under ``if __name__ == "__main__":`` (it runs as the module ``__main__``, which
nothing imports). ``python -m pytest tests/codebase/test_layout.py -q`` prints what it found.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "redisbus"
GENERATED = "_sync"  # the package written by scripts/unasync.py from redisbus/_async
MAX_LINES = 600  # a hand-written Python module
MAX_LUA_LINES = 700  # a Lua script or library (lua/send.lua has 685)
# Non-trivial lines two hand-written modules may have in common, async/await aside: where a
# module is written again for the other face, generate it (scripts/unasync.py) instead.
MAX_SHARED = 40

# Modules a function may import, and why: the import would cost every caller at start-up, or
# the module may be missing (an optional extra, another platform, the host application).
LAZY_OK: dict[str, str] = {
    "fcntl": "POSIX only",
    "hiredis": "optional: the async lane's packer",
    "redis.asyncio": "heavy: only the async face and async clients need it",
    "redis.sentinel": "only redis+sentinel:// URLs need it",
    "redis.cluster": "only Cluster URLs need it",
    "redis.backoff": "only the clients that set their own retry need it",
    "redis.retry": "only the clients that set their own retry need it",
    "uvicorn": "optional: the console, MCP and A2A extras",
    "hermes_cli": "the host application: present only inside Hermes",
    "tools": "the host application: present only inside Hermes",
    "redisbus.integrations.mcp._server": "optional: the MCP SDK, only when `redisbus mcp` runs",
    "redisbus.integrations.a2a": "optional: the A2A SDK, only when `redisbus a2a` runs",
    "redisbus.console": "optional: starlette and uvicorn, only when `redisbus console` runs",
    "opentelemetry": "optional: the otel extra, looked up once when a bus is made",
    "redisbus._trust": "optional: cryptography (the signing extra), only with per-host keys",
    "httpx": "optional: the a2a extra's HTTP client, only when `redisbus a2a --external` runs",
    "ctypes": "Linux only: prctl, so an embedded server dies with its owner",
}
# (importing module, imported module): function-level imports in modules owned elsewhere that
# are waiting to move to the top; remove an entry when its import moves.
LAZY_PENDING: dict[tuple[str, str], str] = {
    ("redisbus.integrations.a2a", "redisbus"): "BusSettings in main(): nothing to defer",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int
    in_function: bool


@functools.cache
def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _skipped(node: ast.If) -> bool:
    test = ast.unparse(node.test)
    return "TYPE_CHECKING" in test or test.replace("'", '"') == '__name__ == "__main__"'


def _targets(
    known: dict[str, Path], module: str, node: ast.Import | ast.ImportFrom, is_package: bool
) -> list[str]:
    """Full names of what the statement imports (``from a import b``: ``a.b`` when it is a
    module, else ``a``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".")[: None if is_package else -1]
        base = base[: len(base) - node.level + 1]
        source = ".".join([*base, *([node.module] if node.module else [])])
    else:
        source = node.module or ""
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in known else source for a in node.names]


def _walk(package: Path, module: str, node: ast.AST, in_function: bool) -> Iterator[Import]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _skipped(child):
            for other in child.orelse:  # the `else:` branch runs on import
                yield from _walk(package, module, ast.Module([other], []), in_function)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            is_package = modules(package)[module].name == "__init__.py"
            for target in _targets(modules(package), module, child, is_package):
                yield Import(module, target, child.lineno, in_function)
        inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _walk(package, module, child, in_function or inner)


@functools.cache
def imports(package: Path) -> list[Import]:
    """Every import statement of the package, once per module it names."""
    found: dict[tuple[str, str, int], Import] = {}
    for module, path in modules(package).items():
        for i in _walk(package, module, ast.parse(path.read_text(), str(path)), False):
            found.setdefault((i.importer, i.imported, i.line), i)
    return list(found.values())


def _in_package(package: Path, name: str) -> str | None:
    while name and name not in modules(package):
        name = name.rpartition(".")[0]
    return name or None


def import_cycles(package: Path) -> list[list[str]]:
    """Each strongly connected group of modules (Tarjan), as the shortest cycle through its
    first module, then the rest of the group."""
    edges: dict[str, set[str]] = {m: set() for m in modules(package)}
    for i in imports(package):
        target = _in_package(package, i.imported)
        if target and target != i.importer:
            edges[i.importer].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in edges:
        if v not in index:
            visit(v)
    return [_cycle_in(group, edges) for group in groups]


def _cycle_in(group: set[str], edges: dict[str, set[str]]) -> list[str]:
    start = min(group)
    paths = [[start]]
    while paths:  # breadth first: the shortest way back to start
        path = paths.pop(0)
        for w in sorted(edges[path[-1]] & group):
            if w == start:
                rest = sorted(group - set(path))
                return [*path, start] + ([f"(and {', '.join(rest)})"] if rest else [])
            if w not in path:
                paths.append([*path, w])
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def _allowed(i: Import) -> bool:
    name = i.imported
    while name:
        if name in LAZY_OK:
            return True
        name = name.rpartition(".")[0]
    return (i.importer, _in_package(PACKAGE, i.imported) or i.imported) in LAZY_PENDING


def test_the_package_has_no_import_cycle_even_through_imports_in_functions() -> None:
    cycles = import_cycles(PACKAGE)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_a_function_imports_only_optional_or_heavy_modules() -> None:
    lazy = [i for i in imports(PACKAGE) if i.in_function]
    assert lazy, "the walk found no import inside a function: it no longer reads the code"
    stray = [f"{i.importer}:{i.line} imports {i.imported}" for i in lazy if not _allowed(i)]
    assert not stray, "function-level imports that could be at the top:\n" + "\n".join(stray)


def hand_written(package: Path) -> list[Path]:
    """The package's Python modules but the generated ones."""
    return [p for p in modules(package).values() if package / GENERATED not in p.parents]


def oversized(
    package: Path, limit: int = MAX_LINES, lua_limit: int = MAX_LUA_LINES
) -> dict[str, int]:
    """Hand-written files of the package over their limit of lines: its Python modules (not
    the generated ones) and its Lua scripts and libraries, by path from the package's parent."""
    files = [(p, limit) for p in hand_written(package)]
    files += [(p, lua_limit) for p in sorted(package.rglob("*.lua"))]
    sizes = {p: len(p.read_text().splitlines()) for p, _ in files}
    return {str(p.relative_to(package.parent)): sizes[p] for p, n in files if sizes[p] > n}


def test_no_hand_written_module_is_over_600_lines() -> None:
    big = oversized(PACKAGE)
    assert not big, f"Python modules over {MAX_LINES} lines, Lua files over {MAX_LUA_LINES}: {big}"


def test_the_size_check_reads_lua_files_too(tmp_path: Path) -> None:
    # given a package whose Python module is small and one Lua script is one line too long
    pkg = tmp_path / "pkg"
    (pkg / "lua").mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / "lua" / "short.lua").write_text("-- ok\n" * MAX_LUA_LINES)
    (pkg / "lua" / "long.lua").write_text("-- too long\n" * (MAX_LUA_LINES + 1))
    # when the sizes are checked, then exactly the long script is reported
    assert oversized(pkg) == {"pkg/lua/long.lua": MAX_LUA_LINES + 1}


_AWAITING = re.compile(r"\b(async|await)\s+")
_NOT_SAID = re.compile(r"(from|import) |#")


def said(text: str) -> set[str]:
    """What a module says: its lines with ``async`` and ``await`` gone and white space folded,
    those of three words or more (names, keywords, numbers) that are no import or comment."""
    out = set()
    for line in text.splitlines():
        line = " ".join(_AWAITING.sub("", line).split())
        if len(re.findall(r"\w+", line)) >= 3 and not _NOT_SAID.match(line):
            out.add(line)
    return out


def written_twice(package: Path, limit: int = MAX_SHARED) -> dict[tuple[str, str], int]:
    """Pairs of hand-written modules with more than ``limit`` lines in common (:func:`said`),
    and how many."""
    found = {str(p.relative_to(package.parent)): said(p.read_text()) for p in hand_written(package)}
    pairs = itertools.combinations(sorted(found.items()), 2)
    common = {(a, b): len(x & y) for (a, x), (b, y) in pairs}
    return {pair: n for pair, n in common.items() if n > limit}


def test_no_two_hand_written_modules_share_more_than_40_lines() -> None:
    twins = written_twice(PACKAGE)
    assert not twins, (
        f"hand-written modules with over {MAX_SHARED} lines in common (async/await aside): "
        f"{twins}; write the code once (redisbus/_async, generated for both faces by "
        "scripts/unasync.py) and keep by hand only what truly differs"
    )


def test_the_twin_check_finds_a_module_written_again_for_the_other_face(tmp_path: Path) -> None:
    # given a package with an async module, its sync twin written by hand, and a generated
    # copy of it (which may repeat its source: it is not written by hand)
    pkg = tmp_path / "pkg"
    (pkg / GENERATED).mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    lines = [f"value_{i} = await fetch(keys, {i})" for i in range(MAX_SHARED)]  # and the def
    source = "async def f(keys):\n" + "".join(f"    {x}\n" for x in lines)
    (pkg / "io_async.py").write_text(source)
    (pkg / "io_sync.py").write_text(source.replace("async def", "def").replace("await ", ""))
    (pkg / GENERATED / "io.py").write_text(source.replace("await ", ""))
    (pkg / "other.py").write_text("import os\nimport re\n# a comment\nx = 1\nreturn out\n")
    # when the modules are compared, then exactly the hand-kept twins are reported
    assert written_twice(pkg) == {("pkg/io_async.py", "pkg/io_sync.py"): MAX_SHARED + 1}


@pytest.mark.parametrize(
    ("source", "cycle"),
    [
        (
            {"a": "def f():\n    from . import b\n", "b": "from . import a\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
        ),
        ({"a": "from .b import x\n", "b": "if TYPE_CHECKING:\n    from .a import y\n"}, None),
        ({"a": "from .b import x\n", "b": 'if __name__ == "__main__":\n    import pkg.a\n'}, None),
    ],
    ids=["function-level", "type-checking", "main-block"],
)
def test_the_cycle_finder_counts_imports_in_functions_too(
    tmp_path: Path, source: dict[str, str], cycle: list[str] | None
) -> None:
    # given a small package whose modules import each other as described
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in source.items():
        (pkg / f"{name}.py").write_text(text)
    # when the cycles are looked for, then exactly the expected one is found
    assert import_cycles(pkg) == ([cycle] if cycle else [])
