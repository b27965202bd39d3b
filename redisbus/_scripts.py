"""The Lua scripts of ``redisbus/lua``, read once per process, and the two ways a server runs
them: a Redis Functions library (FUNCTION LOAD once, FCALL per call) where the server has
Functions (Redis 7+, Valkey), and each script on its own (SCRIPT LOAD, EVALSHA) where it has not.

A script cannot call another, so the helpers several scripts share are written once, in the
library files of ``lua/`` (those whose name starts with ``_``: ``_prelude.lua``, then the
others by name), and put in front of each script here, when it is loaded. A library holds one
helper per paragraph: its comment, the locals only it keeps for the length of one call (a
memo), then one ``local function``. Only the helpers a script calls (and those they call) go
in front of it, in library order: Redis runs Lua 5.1, which makes every ``local function`` of a
script anew on each call (about 0.17 µs each, measured), and the hot scripts should not pay
for helpers they never use. A helper sees only what it defines and its arguments (nothing of
the script it is loaded with), and calls only helpers that come before it.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

#: The library of the most basic helpers (the clock, entry fields): first in every script.
PRELUDE = "_prelude"

_DEFINES = re.compile(r"^local function (\w+)\(", re.M)


def _dir() -> Traversable:
    return resources.files("redisbus") / "lua"


def _read(name: str) -> str:
    return (_dir() / f"{name}.lua").read_text("utf-8")


@cache
def libraries() -> tuple[str, ...]:
    """The library files, in the order their helpers are loaded: the prelude, then by name."""
    files = [p.name for p in _dir().iterdir()]
    names = sorted(n[:-4] for n in files if n.startswith("_") and n.endswith(".lua"))
    return (PRELUDE, *(n for n in names if n != PRELUDE))


@cache
def helpers() -> dict[str, str]:
    """Every library's helpers by name, in load order: each paragraph that defines one (the
    paragraphs without one are a library's own heading)."""
    out: dict[str, str] = {}
    for lib in libraries():
        for para in _read(lib).split("\n\n"):
            names = _DEFINES.findall(para)
            if names:
                (name,) = names  # one helper per paragraph
                if name in out:
                    raise ValueError(f"Lua helper {name} is defined twice ({lib}.lua)")
                out[name] = para.strip("\n") + "\n\n"
    return out


def _calls(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.:]){name}\(", text) is not None


@cache
def source(name: str) -> str:
    """The text of script ``name`` as the server runs it: the library helpers it calls, then
    the script."""
    script = _read(name)
    shared = helpers()
    needed: set[str] = set()
    todo = [script]
    while todo:
        text = todo.pop()
        for helper, body in shared.items():
            if helper not in needed and _calls(text, helper):
                needed.add(helper)
                todo.append(body)
    return "".join(body for helper, body in shared.items() if helper in needed) + script


#: The scripts that add data: at maxmemory (noeviction) their functions are refused before they
#: run (a function without flags is), as their scripts' first write is under EVALSHA. Every
#: other function carries the flag allow-oom, so draining (wait, read, mark_done, the janitor,
#: a replica's join) goes on at maxmemory as it does by EVALSHA, where Redis refuses only the
#: writes that may grow memory, and only before a script's first write (see soft() in
#: lua/_prelude.lua; under allow-oom those small writes go through instead).
ADDS_DATA = frozenset({"send", "replay", "channel", "configure"})


def scripts() -> tuple[str, ...]:
    """The names of the scripts (the files of ``lua/`` that are not libraries), sorted."""
    files = [p.name for p in _dir().iterdir()]
    return tuple(sorted(n[:-4] for n in files if n.endswith(".lua") and not n.startswith("_")))


@cache
def library() -> tuple[str, str]:
    """The Redis Functions library of every script: its name and its code. The helpers are
    defined once, when the server loads the library, not on every call as in a script run on
    its own; each script is a function of it, ``function_name(script)``. The name carries a
    digest of the code, so two versions of redisbus on one server each load their own (a
    function's name is global on a server) and a server never runs a stale one."""
    bodies = [(n, _read(n)) for n in scripts()]
    shared = "".join(helpers().values())
    digest = hashlib.sha1((shared + "".join(b for _, b in bodies)).encode()).hexdigest()[:12]
    name = f"redisbus_{digest}"
    parts = [f"#!lua name={name}\n\n", shared]
    for script, body in bodies:
        parts.append(f"local function {script}_script(KEYS, ARGV)\n{body}end\n\n")
        fn = _function(digest, script)
        flags = "" if script in ADDS_DATA else ", flags = {'allow-oom'}"
        parts.append(
            f"redis.register_function{{function_name = '{fn}', callback = {script}_script{flags}}}"
            "\n\n"
        )
    return name, "".join(parts)


def _function(digest: str, script: str) -> str:
    return f"rb_{digest}_{script}"


def function_name(script: str) -> str:
    """The name of ``script``'s function in :func:`library`."""
    return _function(library()[0].removeprefix("redisbus_"), script)
