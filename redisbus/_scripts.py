"""The Lua scripts of ``redisbus/lua``, loaded once per process, and their reply codes."""

from __future__ import annotations

from functools import cache
from importlib import resources

NAMES = (
    "beat",
    "channel",
    "claim",
    "done",
    "join",
    "outcome",
    "receipt",
    "replay",
    "send",
    "settle",
    "sweep",
    "view",
)


@cache
def source(name: str) -> str:
    return (resources.files("redisbus") / "lua" / f"{name}.lua").read_text("utf-8")


def available() -> list[str]:
    return [n for n in NAMES if (resources.files("redisbus") / "lua" / f"{n}.lua").is_file()]
