"""The sync face is generated from the async one: the committed files must match their source."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _unasync() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", ROOT / "scripts" / "unasync.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("unasync", mod)
    spec.loader.exec_module(mod)
    return mod


def test_generated_sync_face_matches_its_async_source() -> None:
    stale = _unasync().stale()
    assert not stale, f"stale generated files {stale}: run `make unasync` (scripts/unasync.py)"


def test_every_generated_file_says_what_it_was_generated_from() -> None:
    for path in sorted((ROOT / "redisbus" / "_sync").glob("*.py")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("# Generated from redisbus/_async/"), path


def test_unasync_rewrites_names_keywords_and_drops_async_only_lines() -> None:
    u = _unasync()
    src = (
        "from .._tasks_async import sleep\n"
        "class AsyncBus:\n"
        "    async def aclose(self) -> AsyncBus:\n"
        "        await sleep(0)\n"
        "    close = aclose  # unasync: remove\n"
    )
    assert u.unasync_text(src) == (
        "from .._tasks_sync import sleep\n"
        "class Bus:\n"
        "    def close(self) -> Bus:\n"
        "        sleep(0)\n"
    )


def test_every_rewrite_rule_matches_something_in_the_source() -> None:
    u = _unasync()
    sources = [p.read_text() for p in sorted(u.SOURCE.glob("*.py"))]
    assert u.unused_words(sources) == []
    # (and a rule is counted only where it rewrites a whole word of a kept line)
    assert "_tasks_async" not in u.unused_words(["from .._tasks_async import sleep\n"])
    assert "AsyncBus" in u.unused_words(["x = AsyncBusy  # AsyncBus  # unasync: remove\n"])


def test_the_check_fails_on_a_rule_that_matches_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    u = _unasync()
    # given: the rules and one more that nothing in the source says (as "_async" once was)
    words = {**u.WORDS, "AsyncNowhere": "Nowhere"}
    monkeypatch.setattr(u, "WORDS", words)
    monkeypatch.setattr(u, "_WORD", re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b"))
    # when: the drift check runs
    code = u.main(["unasync.py", "--check"])
    # then: it fails and names the rule, though every generated file is up to date
    out = capsys.readouterr().out
    assert code == 1
    assert "unused rule: 'AsyncNowhere' -> 'Nowhere'" in out
    assert "stale:" not in out
