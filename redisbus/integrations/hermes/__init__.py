"""Hermes Agent plugin: the ``agent_channel`` tool for ``delegate_task`` subagents.

Not a Python API: Hermes loads it as a plugin, and its configuration is the interface
(redisbus/integrations/hermes/README.md); its Python names may change in any release.

Install redisbus next to hermes-agent, then enable both the plugin and the channel in
``$HERMES_HOME/config.yaml``::

    plugins:
      enabled: [redisbus]       # Hermes loads plugins only when listed here
    agent_channel:              # without this block (or REDISBUS_URL / REDISBUS_ENABLED=1)
      url: redis://localhost:6379/0   # the plugin registers nothing: zero change

What it adds (see ``_config`` for every setting):

- the ``agent_channel`` tool (toolset ``agent_channel``): ``send`` (``to`` a name,
  ``parent`` or ``all``; ``subject``; ``message``), ``read`` (``filter_by``, ``since``,
  optional ``wait_seconds``) and ``list``. The caller is whoever Hermes says is calling
  (``task_id`` of a subagent, else the session of the top-level agent); no argument can set
  the sender. Results are JSON strings; errors use Hermes's ``{"error": ...}`` shape.
- ``subagent_start``: each child joins its parent's channel under the persona its goal names
  (``[agent: writer] ...``, ``You are the writer. ...``) or else its subagent id, with its
  parent and depth recorded; nested orchestrators form a tree.
- ``subagent_stop``: the child's outcome (``complete(summary)`` or ``fail(reason)``) goes to
  its parent as an attributed outcome message.
- ``pre_llm_call``: at the start of each turn an agent gets its unread messages (and, for a
  child's first turn, a short note about the channel), framed as attributed information
  from another agent — not an instruction, not an approval.

For code that calls delegation directly, ``delegate_task(tasks=[...],
enable_agent_channel=True, channel_name=..., parent_agent=agent)`` is the shape it takes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from ._access import search_bridge
from ._config import ChannelConfig
from ._persona import goal_with_persona, persona_from_goal, slug
from ._runtime import Binding, ChannelToolError, Runtime
from ._tool import SCHEMA, TOOL_NAME, TOOLSET, hermes_schema, make_handler

__all__ = [
    "SCHEMA",
    "TOOLSET",
    "TOOL_NAME",
    "Binding",
    "ChannelConfig",
    "Runtime",
    "activate",
    "deactivate",
    "delegate_task",
    "goal_with_persona",
    "persona_from_goal",
    "register",
    "runtime",
    "slug",
]

log = logging.getLogger("redisbus.integrations.hermes")

_lock = threading.Lock()
_runtime: Runtime | None = None

HERMES_ROLES = ("leaf", "orchestrator")


def runtime() -> Runtime:
    """The active runtime (raises when the agent channel is off in this process)."""
    rt = _runtime
    if rt is None:
        raise ChannelToolError("the agent channel is not enabled in this Hermes process")
    return rt


def _hermes_config() -> dict[str, Any]:
    try:
        from hermes_cli.config import load_config  # Hermes' own modules exist only inside it

        cfg = load_config()
        return cfg if isinstance(cfg, dict) else {}
    except Exception:
        log.debug("could not read the Hermes config", exc_info=True)
        return {}


def _hook(name: str) -> Callable[..., Any]:
    """A hook that forwards to the active runtime (a no-op while the channel is off)."""

    def hook(**kw: Any) -> Any:
        rt = _runtime
        if rt is None:
            return None
        try:
            return getattr(rt, f"on_{name}")(**kw)
        except Exception:
            log.warning("agent_channel %s hook failed", name, exc_info=True)
            return None

    hook.__name__ = f"redisbus_{name}"
    return hook


def _install(ctx: Any, rt: Runtime) -> None:
    """Register the tool and the hooks through ``ctx`` and make ``rt`` the active runtime."""
    global _runtime
    with _lock:
        _runtime = rt
    schema = hermes_schema(search_bridge())
    ctx.register_tool(
        name=TOOL_NAME,
        toolset=TOOLSET,
        schema=schema,
        handler=make_handler(runtime),
        description=schema["description"],
        emoji="📨",
    )
    for name in ("subagent_start", "subagent_stop", "pre_llm_call"):
        ctx.register_hook(name, _hook(name))


def register(ctx: Any) -> None:
    """Hermes entry point (group ``hermes_agent.plugins``). Registers nothing unless enabled."""
    cfg = ChannelConfig.resolve(_hermes_config())
    if not cfg.enabled:
        log.info("redisbus agent_channel is off (no agent_channel block, no REDISBUS_URL)")
        return
    _install(ctx, Runtime(cfg))
    log.info("redisbus agent_channel on (%s)", cfg.source)


def _installed() -> bool:
    from hermes_cli.plugins import get_plugin_manager  # only inside Hermes
    from tools.registry import registry

    pm = get_plugin_manager()
    pm.discover_and_load()  # a no-op once Hermes has discovered its plugins
    hooks = getattr(pm, "_hooks", {})
    ours = all(
        any(getattr(cb, "__name__", "") == f"redisbus_{h}" for cb in hooks.get(h, []))
        for h in ("subagent_start", "subagent_stop", "pre_llm_call")
    )
    return ours and registry.get_entry(TOOL_NAME) is not None


def activate(config: ChannelConfig | None = None, bus: Any = None) -> Runtime:
    """Turn the channel on from code (``delegate_task(enable_agent_channel=True)`` does this).

    Uses Hermes's own plugin API (a ``PluginContext`` of the process-wide plugin manager), so
    the tool and the hooks are the same as when Hermes loads the plugin from its config.
    ``bus`` (a ``redisbus.Bus``) replaces the one the settings would open.
    """
    global _runtime
    if _runtime is not None and config is None and bus is None:
        return _runtime
    if config is None:
        config = ChannelConfig.resolve(_hermes_config())
        if not config.enabled:
            config = dataclasses.replace(config, enabled=True, source="activate()")
    rt = Runtime(config, bus_factory=(lambda: bus) if bus is not None else None)
    if _installed():
        with _lock:
            old, _runtime = _runtime, rt
        if old is not None:
            old.close()
        return rt
    from hermes_cli.plugins import PluginContext, PluginManifest, get_plugin_manager  # in Hermes

    ctx = PluginContext(PluginManifest(name="redisbus", source="entrypoint"), get_plugin_manager())
    _install(ctx, rt)
    return rt


def deactivate() -> None:
    """Close the runtime's bus; the tool then reports that the channel is off."""
    global _runtime
    with _lock:
        rt, _runtime = _runtime, None
    if rt is not None:
        rt.close()


def _prepare_tasks(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tasks):
        if not isinstance(t, dict) or not str(t.get("goal") or "").strip():
            raise ValueError(f"task {i} needs a 'goal'")
        t = dict(t)
        role = t.pop("role", None)
        persona = t.pop("persona", None) or t.pop("name", None)
        if role and str(role).strip().lower() not in HERMES_ROLES:
            persona = persona or role  # role="writer" names a persona
            role = None
        if role:
            t["role"] = str(role).strip().lower()
        if persona and persona_from_goal(t["goal"]) is None:
            t["goal"] = goal_with_persona(t["goal"], str(persona))
        out.append(t)
    return out


def delegate_task(
    tasks: list[dict[str, Any]] | None = None,
    *,
    parent_agent: Any,
    goal: str | None = None,
    context: str | None = None,
    enable_agent_channel: bool = False,
    channel_name: str | None = None,
    role: str | None = None,
    background: bool = False,
    max_iterations: int | None = None,
) -> dict[str, Any]:
    """Hermes's ``delegate_task`` with ``enable_agent_channel``/``channel_name``.

    ``tasks`` items take ``goal``, ``context`` and ``role``; a role other than Hermes's
    ``leaf``/``orchestrator`` (e.g. ``"writer"``), or ``persona``/``name``, is the child's
    name on the channel. Without ``enable_agent_channel`` this is exactly Hermes's call, and
    its children stay off the channel even when the plugin is on for model-driven
    delegations.
    Synchronous by default (the children's results are in the returned dict); with
    ``background=True`` Hermes returns at once and delivers results later. Returns Hermes's
    result as a dict, plus ``channel`` when the channel is on.
    """
    from tools.delegate_tool import delegate_task as hermes_delegate_task  # only inside Hermes

    channel: str | None = None
    if enable_agent_channel:
        rt = activate() if _runtime is None else _runtime
        session_id = getattr(parent_agent, "session_id", None)
        parent_sub = getattr(parent_agent, "_subagent_id", None)
        if parent_sub and parent_sub in rt.by_subagent:
            channel = rt.by_subagent[parent_sub].channel
            if channel_name and channel_name != channel:
                raise ChannelToolError(f"a subagent's delegations stay on its channel {channel!r}")
        elif session_id:
            if channel_name:
                rt.bind_session_channel(session_id, channel_name)
            channel = rt.root_binding(session_id).channel
        if tasks is not None:
            tasks = _prepare_tasks(tasks)
        elif goal is not None and role and role.strip().lower() not in HERMES_ROLES:
            goal, role = goal_with_persona(goal, role), None
    if tasks is not None and len(tasks) == 1 and set(tasks[0]) <= {"goal", "context", "role"}:
        # one task goes as goal=: Hermes 0.20+ forks refuse a batch of one (axisrow: "Batch
        # mode requires at least 2 tasks"); 0.19 treats both the same
        one = tasks[0]
        goal, context, role, tasks = one["goal"], one.get("context", context), one.get("role"), None
    rt_now = _runtime
    old = rt_now.set_suppressed(not enable_agent_channel) if rt_now is not None else False
    try:
        raw = hermes_delegate_task(
            goal=goal,
            context=context,
            tasks=tasks,
            max_iterations=max_iterations,
            role=role,
            background=background,
            parent_agent=parent_agent,
        )
    finally:
        if rt_now is not None:
            rt_now.set_suppressed(old)
    result: dict[str, Any] = json.loads(raw) if isinstance(raw, str) else dict(raw)
    if channel is not None and isinstance(result, dict):
        result["channel"] = channel
    return result
