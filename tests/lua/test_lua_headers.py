"""Every Lua script is a documented interface: its header names KEYS, ARGV and the reply,
and it touches keys only through KEYS (no key names built inside, no KEYS/SCAN calls). The
helpers scripts share are written once, in the library files (``_prelude.lua``, ``_limits.lua``,
...), and loaded in front of the scripts that call them."""

from __future__ import annotations

import itertools
import re
from importlib import resources
from importlib.resources.abc import Traversable

import pytest

from redisbus._scripts import PRELUDE, helpers, libraries, source

LUA_DIR = resources.files("redisbus") / "lua"
FILES = sorted((p for p in LUA_DIR.iterdir() if p.name.endswith(".lua")), key=lambda p: p.name)
LUA = [p for p in FILES if not p.name.startswith("_")]
LIBS = [p for p in FILES if p.name.startswith("_")]


def _text(p: Traversable) -> str:
    return p.read_text("utf-8")


def _functions(text: str) -> dict[str, str]:
    """``local function`` definitions: name -> body with whitespace folded (nested ones too)."""
    out = {}
    for m in re.finditer(r"^( *)local function (\w+)\(.*?\n\1end\n", text, re.M | re.S):
        out[m.group(2)] = " ".join(m.group(0).split()[3:])  # from the parameters on
    return out


def _libraries() -> str:
    """Every library's text, in load order."""
    return "".join(_text(LUA_DIR / f"{name}.lua") for name in libraries())


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
    # nor a name joined to a prefix (tests/lua/test_declared_keys.py checks every key a
    # script touched, from outside)
    assert not re.search(r"\bcall\(\s*'\w+'\s*,\s*[\w.\[\]]+\s*\.\.", text)


def test_every_script_is_there() -> None:
    names = {p.name for p in LUA}
    assert {"send.lua", "view.lua", "done.lua", "claim.lua", "sweep.lua", "outcome.lua"} <= names


def test_the_libraries_are_the_underscored_files_prelude_first() -> None:
    assert libraries()[0] == PRELUDE
    assert sorted(libraries()) == sorted(p.name.removesuffix(".lua") for p in LIBS)
    assert {"_limits", "_chain"} <= set(libraries())


@pytest.mark.parametrize("library", LIBS, ids=lambda p: p.name)
def test_a_library_only_defines_helpers_on_keys_it_is_given(library: Traversable) -> None:
    text = _text(library)
    _assert_key_discipline(text)
    assert "KEYS[" not in text and "ARGV[" not in text  # a helper is passed what it touches
    for para in text.split("\n\n"):
        code = [ln for ln in para.splitlines() if ln and not ln.startswith("--")]
        if not code:
            continue  # the library's heading
        # at the top level: the helper's memo (plain locals), then its one local function;
        # nothing else runs before the script
        top = [ln for ln in code if not ln[0].isspace()]
        defs = [ln for ln in top if ln.startswith("local function ")]
        assert len(defs) == 1, (library.name, top)
        before = top[: top.index(defs[0])]
        assert all(re.match(r"local [\w, ]+ = ", ln) for ln in before), (library.name, before)
        assert top[-1] == "end", (library.name, top)
        # a memo is the helper's own: no other paragraph, library or script names it
        for ln in before:
            for memo in re.findall(r"\w+", ln.split("=")[0].removeprefix("local ")):
                others = _libraries().replace(para, "") + "".join(_text(p) for p in LUA)
                assert not re.search(rf"(?<![\w.]){memo}(?!\w)", others), (library.name, memo)
    assert set(_functions(text)) == {n for n, b in helpers().items() if b.strip("\n") in text}


def test_the_prelude_holds_the_basic_helpers() -> None:
    assert {"now_ms", "trip", "dead_letter", "addressed", "field"} <= set(
        _functions(_text(LUA_DIR / f"{PRELUDE}.lua"))
    )
    limits = {"bucket", "bucket_value", "spend", "rate_fields", "pair_fields", "dampened"}
    assert limits <= set(_functions(_text(LUA_DIR / "_limits.lua")))
    assert "chain_of" in _functions(_text(LUA_DIR / "_chain.lua"))


def test_a_helper_calls_only_helpers_loaded_before_it() -> None:
    # what _scripts.source relies on: the helpers go in front of a script in library order
    order = list(helpers())
    for i, (name, body) in enumerate(helpers().items()):
        code = body[body.index(f"local function {name}(") :].split("\n", 1)[1]
        later = [h for h in order[i:] if re.search(rf"(?<![\w.:]){h}\(", code)]
        assert not later, (name, later)


@pytest.mark.parametrize("script", LUA, ids=lambda p: p.name)
def test_each_script_is_loaded_behind_the_helpers_it_calls(script: Traversable) -> None:
    name, text = script.name.removesuffix(".lua"), _text(script)
    loaded = source(name)
    assert loaded.endswith(text)
    included = _functions(loaded[: -len(text)])
    shared = _functions(_libraries())
    assert set(included) <= set(shared)
    for helper in shared:  # every helper the script (or an included helper) calls is there
        if re.search(rf"(?<![\w.:]){helper}\(", text):
            assert helper in included, (name, helper)
    for helper in included:  # each defined before its callers
        called = [
            h for h in included if h != helper and re.search(rf"(?<![\w.:]){h}\(", shared[helper])
        ]
        assert all(list(included).index(h) < list(included).index(helper) for h in called)


def test_a_script_calling_no_helper_is_loaded_as_it_is() -> None:
    assert source("leave") == _text(LUA_DIR / "leave.lua")
    claim = set(_functions(source("claim")))
    assert claim >= {"now_ms", "addressed", "field", "dead_letter", "trip"}


def test_no_helper_is_written_twice() -> None:
    # a helper the prelude has is not redefined by a script, and no two scripts carry the
    # same function (the breaker's trip() was once kept identical, by hand, in two of them)
    shared = _functions(_libraries())
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
