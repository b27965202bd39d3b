"""The public surface is pinned: ``redisbus.__all__`` is exactly what the package exposes, each
name says it is ``redisbus.<name>``, every module without an underscore is listed, with its
status, in docs/reference/api.md#what-is-public, what mypy infers of ``send`` and of the channel
limits is checked (tests/codebase/static/check_public_api.py), and no comment or page cites a
document or tracker item a maintainer cannot open."""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType

import pytest

import redisbus
from redisbus import (
    Agent,
    AsyncAgent,
    BusSettings,
    ChannelConfig,
    ChannelLimits,
    InvalidInput,
    RedisbusError,
    SendOptions,
)
from redisbus._channels import LIMITS, plan_channel

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "redisbus"
API_PAGE = ROOT / "docs" / "reference" / "api.md"


# -- __all__ and __module__ ---------------------------------------------------------------------


def test_all_is_sorted_and_is_every_public_name_of_the_package() -> None:
    exposed = {
        name
        for name, value in vars(redisbus).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)
    }
    assert redisbus.__all__ == sorted(redisbus.__all__), "keep __all__ in sorted order"
    assert len(set(redisbus.__all__)) == len(redisbus.__all__)
    assert set(redisbus.__all__) == exposed


def test_every_public_name_says_it_is_redisbus() -> None:
    for name in redisbus.__all__:
        obj = getattr(redisbus, name)
        assert obj.__module__ == "redisbus", name
        assert obj.__qualname__ == name, name
        assert getattr(sys.modules[obj.__module__], obj.__qualname__) is obj


def test_the_faces_modules_hand_out_the_same_objects() -> None:
    import redisbus.aio
    import redisbus.bus

    for module in (redisbus.aio, redisbus.bus):
        for name in module.__all__:
            assert getattr(module, name) is getattr(redisbus, name)


def _instances() -> list[RedisbusError]:
    def walk(cls: type[RedisbusError]) -> list[type[RedisbusError]]:
        return [cls, *(c for sub in cls.__subclasses__() for c in walk(sub))]

    out: list[RedisbusError] = []
    for cls in walk(RedisbusError):
        if issubclass(cls, redisbus.LimitExceeded):
            out.append(cls("too many", limit=3, current=4, retry_after_s=0.5))
        elif issubclass(cls, redisbus.AskTimeout):
            out.append(cls("no reply", request_id="1-0"))
        else:
            out.append(cls("refused"))
    return out


@pytest.mark.parametrize("error", _instances(), ids=lambda e: type(e).__name__)
def test_every_error_pickles_by_its_public_name(error: RedisbusError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error) and vars(back) == vars(error)
    if type(error).__name__ in redisbus.__all__:
        assert f"redisbus\n{type(error).__name__}".encode() in pickle.dumps(error, protocol=0)


def test_annotations_of_public_classes_still_resolve() -> None:
    # __module__ names redisbus, not the defining module: the annotations were resolved there
    for name in redisbus.__all__:
        obj = getattr(redisbus, name)
        if isinstance(obj, type):
            typing.get_type_hints(obj)
            if dataclasses.is_dataclass(obj):
                assert not any(isinstance(f.type, str) for f in dataclasses.fields(obj)), name


# -- channel limits ----------------------------------------------------------------------------


def test_channel_limits_name_every_stored_limit_with_the_settings_type() -> None:
    hints = typing.get_type_hints(ChannelLimits)
    assert set(hints) == {*LIMITS, "auto_reply_deny"}
    assert ChannelLimits.__required_keys__ == frozenset()
    settings = typing.get_type_hints(BusSettings)
    config = {f.name: f.type for f in dataclasses.fields(ChannelConfig)}
    for name in LIMITS:
        assert hints[name] is settings[name], name
        assert config[name] == hints[name] | None, name


def test_an_unknown_limit_is_refused_with_a_typed_error() -> None:
    with pytest.raises(InvalidInput, match="unknown channel limit"):
        plan_channel(BusSettings(), None, None, {"inbox_kap": 3})
    with pytest.raises(InvalidInput, match="inbox_cap"):
        plan_channel(BusSettings(), None, None, {"inbox_cap": "3"})


def test_a_stored_limit_is_a_typed_attribute() -> None:
    from redisbus._channels import config_from_hash

    cfg = config_from_hash("team", {"routing": "open", "inbox_cap": "3", "lease_s": "1.5"})
    assert cfg.inbox_cap == 3 and isinstance(cfg.inbox_cap, int)
    assert cfg.lease_s == 1.5 and cfg.max_members is None
    assert dict(cfg.limits) == {"inbox_cap": 3.0, "lease_s": 1.5}
    with pytest.raises(AttributeError):
        cfg.no_such_limit  # type: ignore[attr-defined]  # noqa: B018


# -- send options -------------------------------------------------------------------------------


@pytest.mark.parametrize("face", [Agent, AsyncAgent], ids=["sync", "async"])
def test_send_options_are_the_keywords_of_send_with_their_types(
    face: type[Agent | AsyncAgent],
) -> None:
    # the overloads take **options: Unpack[SendOptions]; the implementation names each one
    import inspect

    params = inspect.signature(face.send).parameters
    keywords = {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY}
    assert set(keywords) == set(SendOptions.__annotations__)
    hints = typing.get_type_hints(face.send)
    assert {n: hints[n] for n in keywords} == typing.get_type_hints(SendOptions)
    assert SendOptions.__required_keys__ == frozenset()


# -- what the type checker infers ---------------------------------------------------------------


def test_the_type_checker_infers_send_results_and_checks_channel_limits() -> None:
    # mypy (strict, the project's config) on a file of assert_type calls: without the send
    # overloads or ChannelLimits it fails (every result is Any, every limit unchecked)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--no-error-summary",
            "tests/codebase/static/check_public_api.py",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MYPY_FORCE_COLOR": "0"},
    )
    assert done.returncode == 0, done.stdout + done.stderr


# -- public modules ----------------------------------------------------------------------------


def _public_modules() -> list[str]:
    """Every module of the package whose dotted name has no part with a leading underscore."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] in ("__init__", "__main__"):
            parts = parts[:-1]
        if not any(p.startswith("_") for p in parts):
            found.append(".".join(parts))
    return sorted(set(found))


def _listed() -> dict[str, str]:
    """docs/reference/api.md#what-is-public: module -> its status."""
    section = API_PAGE.read_text().split("## What is public", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[1] in ("public API", "program"):
            for name in re.findall(r"`([\w.*]+)`", cells[0]):
                rows[name] = cells[1]
    return rows


def _docstring(module: str) -> str:
    base = ROOT.joinpath(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def test_every_public_module_is_listed_with_its_status() -> None:
    listed = _listed()
    assert "redisbus" in listed and "redisbus.testing" in listed
    for module in _public_modules():
        parents = [module.rsplit(".", n)[0] + ".*" for n in range(1, module.count(".") + 1)]
        assert module in listed or any(p in listed for p in parents), (
            f"{module} has no leading underscore but docs/reference/api.md#what-is-public does "
            "not list it: list it (public API or program), or rename it with an underscore"
        )
    for name in listed:
        assert name.rstrip(".*") in _public_modules(), f"{name} is listed but no such module"


def test_every_listed_module_says_the_same_in_its_docstring() -> None:
    words = {"public API": "Public API", "program": "Not a Python API"}
    for module, status in _listed().items():
        if module.endswith(".*"):
            continue
        doc = _docstring(module)
        if module != "redisbus":  # the package's docstring is its front page
            assert words[status] in doc, f"{module}'s docstring should say {words[status]!r}"


# -- citations ---------------------------------------------------------------------------------

# A citation a maintainer cannot open: a section of a spec that is not in the tree, or an item
# of a tracker or task list named by number. Link the docs page that states the rule instead
# (docs/<page>.md#<anchor>), or say the rule where it is used.
CITATION = re.compile(r"\bSPEC\b|§|\b[Ii]ssue #?\d|\b[Tt]ask #?\d|\b[Ss]eeds?[ -]?\d{3}")
SCANNED = ("redisbus", "tests", "bench", "docs", "scripts", "deploy", "grafana", "examples")
TEXT = {".py", ".md", ".lua", ".yml", ".yaml", ".json", ".toml", ".txt", ".cfg", ".conf", ".sh"}


def test_no_citation_of_what_a_maintainer_cannot_open() -> None:
    files = [ROOT / "README.md", ROOT / "Makefile"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in TEXT]
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("CHANGELOG.md", "docs/changelog.md") or "/node_modules/" in rel:
            continue
        if rel == "tests/codebase/test_public_api.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not found, "cite a docs page instead:\n" + "\n".join(found)


def _slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_docs_link_in_the_tree_opens() -> None:
    # what replaced the citations: docs/<page>.md#<anchor>, each page and heading present
    link = re.compile(r"\bdocs/([\w/.-]+?\.md)(?:#([\w-]+))?")
    anchors: dict[str, set[str]] = {}
    for page in (ROOT / "docs").rglob("*.md"):
        rel = page.relative_to(ROOT / "docs").as_posix()
        heads = re.findall(r"^#{1,6} (.+?)\s*$", page.read_text(), re.MULTILINE)
        anchors[rel] = {_slug(h) for h in heads}
    broken = []
    for top in ("redisbus", "tests", "bench", "scripts", "deploy", "grafana", "examples"):
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or path.suffix not in TEXT:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for page, anchor in link.findall(line):
                    if page not in anchors or (anchor and anchor not in anchors[page]):
                        broken.append(f"{path.relative_to(ROOT)}:{n}: docs/{page}#{anchor}")
    assert not broken, "no such docs page or heading:\n" + "\n".join(broken)
