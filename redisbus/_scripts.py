"""The Lua scripts of ``redisbus/lua``, read once per process (the faces load them with EVALSHA)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def source(name: str) -> str:
    return (resources.files("redisbus") / "lua" / f"{name}.lua").read_text("utf-8")
