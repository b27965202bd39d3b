"""The sync face is generated from the async one: the committed files must match their source."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
