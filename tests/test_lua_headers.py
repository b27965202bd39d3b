"""Every Lua script is a documented interface: its header names KEYS, ARGV and the reply,
and it touches keys only through KEYS (no key names built inside, no KEYS/SCAN calls)."""

from __future__ import annotations

import re
from importlib import resources

import pytest

LUA = sorted(p for p in (resources.files("redisbus") / "lua").iterdir() if p.name.endswith(".lua"))


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_script_header_and_key_discipline(script: object) -> None:
    text = script.read_text("utf-8")  # type: ignore[attr-defined]
    header = text[:2000]
    assert re.search(r"--\s*KEYS\[1\]", header), "header must name KEYS"
    assert "-- returns" in text[:3000], "header must say what the script returns"
    assert not re.search(r"redis\.call\(\s*'(KEYS|SCAN)'", text)
    # every key argument of a redis.call is a variable bound from KEYS, never a built string
    assert not re.search(r"redis\.call\(\s*'\w+'\s*,\s*'[^']*:", text)


def test_every_script_is_there() -> None:
    names = {p.name for p in LUA}  # type: ignore[attr-defined]
    assert {"send.lua", "view.lua", "done.lua", "claim.lua", "sweep.lua", "outcome.lua"} <= names
