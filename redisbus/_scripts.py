"""The Lua scripts of ``redisbus/lua``, read once per process (the faces load them with EVALSHA).

A script cannot call another, so the helpers several scripts share are written once, in
``lua/_prelude.lua``, and put in front of each script here, when it is loaded. Only the
helpers a script calls (and those they call) go in front of it: Redis runs Lua 5.1, which
makes every ``local function`` of a script anew on each call (about 0.17 µs each, measured),
and the hot scripts should not pay for helpers they never use.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

#: The file of shared helpers (not a script of its own).
PRELUDE = "_prelude"

_DEFINES = re.compile(r"^local function (\w+)\(", re.M)


def _read(name: str) -> str:
    return (resources.files("redisbus") / "lua" / f"{name}.lua").read_text("utf-8")


@cache
def helpers() -> dict[str, str]:
    """The prelude's helpers by name, in its order: each paragraph (its comment and its one
    function) after the prelude's own heading."""
    out = {}
    for para in _read(PRELUDE).split("\n\n"):
        names = _DEFINES.findall(para)
        if names:
            (name,) = names  # one helper per paragraph
            out[name] = para.strip("\n") + "\n\n"
    return out


def _calls(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.:]){name}\(", text) is not None


@cache
def source(name: str) -> str:
    """The text of script ``name`` as the server runs it: the prelude's helpers it calls,
    then the script."""
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
