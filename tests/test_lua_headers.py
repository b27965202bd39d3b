"""Every Lua script is a documented interface: its header names KEYS, ARGV and the reply,
and it touches keys only through KEYS (no key names built inside, no KEYS/SCAN calls). The
helpers scripts share are written once, in ``_prelude.lua``, and loaded in front of the scripts
that call them."""

from __future__ import annotations

import itertools
import re
from importlib import resources
from importlib.resources.abc import Traversable

import pytest

from redisbus._scripts import PRELUDE, source

LUA_DIR = resources.files("redisbus") / "lua"
FILES = sorted((p for p in LUA_DIR.iterdir() if p.name.endswith(".lua")), key=lambda p: p.name)
LUA = [p for p in FILES if not p.name.startswith("_")]


def _text(p: Traversable) -> str:
    return p.read_text("utf-8")


def _functions(text: str) -> dict[str, str]:
    """``local function`` definitions: name -> body with whitespace folded (nested ones too)."""
    out = {}
    for m in re.finditer(r"^( *)local function (\w+)\(.*?\n\1end\n", text, re.M | re.S):
        out[m.group(2)] = " ".join(m.group(0).split()[3:])  # from the parameters on
    return out


def _prelude() -> str:
    return _text(LUA_DIR / f"{PRELUDE}.lua")


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_script_header_and_key_discipline(script: Traversable) -> None:
    text = _text(script)
    header = text[:2000]
    assert re.search(r"--\s*KEYS\[1\]", header), "header must name KEYS"
    assert "-- returns" in text[:3000], "header must say what the script returns"
    _assert_key_discipline(text)


def _assert_key_discipline(text: str) -> None:
    assert not re.search(r"redis\.call\(\s*'(KEYS|SCAN)'", text)
    # every key argument of a redis.call is a variable bound from KEYS, never a built string
    assert not re.search(r"redis\.call\(\s*'\w+'\s*,\s*'[^']*:", text)


def test_every_script_is_there() -> None:
    names = {p.name for p in LUA}
    assert {"send.lua", "view.lua", "done.lua", "claim.lua", "sweep.lua", "outcome.lua"} <= names


def test_the_prelude_only_defines_helpers_on_keys_it_is_given() -> None:
    text = _prelude()
    _assert_key_discipline(text)
    assert "KEYS[" not in text and "ARGV[" not in text  # a helper is passed what it touches
    # at the top level: comments and local functions only (nothing runs before the script)
    top = [ln for ln in text.splitlines() if ln and not ln[0].isspace() and not ln.startswith("--")]
    assert all(ln.startswith("local function ") or ln == "end" for ln in top), top
    assert {"now_ms", "trip", "dead_letter", "addressed", "field"} <= set(_functions(text))


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_each_script_is_loaded_behind_the_helpers_it_calls(script: Traversable) -> None:
    name, text = script.name.removesuffix(".lua"), _text(script)
    loaded = source(name)
    assert loaded.endswith(text)
    included = _functions(loaded[: -len(text)])
    shared = _functions(_prelude())
    assert set(included) <= set(shared)
    for helper in shared:  # every helper the script (or an included helper) calls is there
        if re.search(rf"(?<![\w.:]){helper}\(", text):
            assert helper in included, (name, helper)
    for helper in included:  # each defined before its callers
        called = [h for h in included if h != helper and f"{h}(" in shared[helper]]
        assert all(list(included).index(h) < list(included).index(helper) for h in called)


def test_a_script_calling_no_helper_is_loaded_as_it_is() -> None:
    assert source("outcome") == _text(LUA_DIR / "outcome.lua")
    claim = set(_functions(source("claim")))
    assert claim >= {"now_ms", "addressed", "field", "dead_letter", "trip"}


def test_no_helper_is_written_twice() -> None:
    # a helper the prelude has is not redefined by a script, and no two scripts carry the
    # same function (the breaker's trip() was once kept identical, by hand, in two of them)
    shared = _functions(_prelude())
    defined = {p.name: _functions(_text(p)) for p in LUA}
    for name, functions in defined.items():
        assert not set(functions) & set(shared), (name, set(functions) & set(shared))
    for (a, fa), (b, fb) in itertools.combinations(defined.items(), 2):
        same = {n for n in fa if fb.get(n) == fa[n]} | (set(fa.values()) & set(fb.values()))
        assert not same, (a, b, same)


def test_scripts_read_the_clock_in_ms_through_the_prelude() -> None:
    # one way to turn the Redis clock into milliseconds (settle.lua, which hands the raw
    # clock to the client, keeps its own TIME)
    for p in LUA:
        assert "* 1000 + math.floor" not in _text(p), p.name
