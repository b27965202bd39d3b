"""The name a delegated child gets on the channel: the persona its goal names, or its id.

Hermes keeps only ``leaf``/``orchestrator`` as a task's ``role`` (a task's ``role:
"writer"`` is coerced to ``leaf``), so a persona travels in the goal text. Recognised forms,
case-insensitive, at the start of the goal unless noted::

    [agent: writer] ...         [role: writer] ...     [persona: writer] ...    [writer] ...
    You are the writer. ...     You are writer, ...    As the writer, ...
    Role: writer                Persona: writer        Agent: writer     (any line)

Multi-word personas become slugs: "Storyboard Artist" -> ``storyboard-artist``.
"""

from __future__ import annotations

import re

_NAME = r"([A-Za-z][A-Za-z0-9_\-]*(?:[ _-][A-Za-z][A-Za-z0-9_\-]*){0,2})"
_TAG = re.compile(r"^\s*\[\s*(?:(?:agent|role|persona|name)\s*[:=]\s*)?" + _NAME + r"\s*\]", re.I)
_YOU_ARE = re.compile(r"^\s*(?:you are|you're|as)\s+(?:the\s+)?" + _NAME + r"\s*[.,:;!\n-]", re.I)
_LINE = re.compile(
    r"^\s*(?:agent|role|persona|agent name)\s*[:=]\s*" + _NAME + r"\s*$", re.I | re.M
)

# "You are a helpful ..." is not a persona: only "the X" or a bare single name count.
_NOT_NAMES = {"a", "an", "helpful", "focused", "expert", "assistant", "subagent", "agent", "ai"}
_HERMES_ROLES = {"leaf", "orchestrator"}


def slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9_-]+", "-", name.strip().lower()).strip("-_")
    return s[:64]


def persona_from_goal(goal: str | None) -> str | None:
    """The persona a goal names, as a channel-safe slug, or None."""
    if not goal:
        return None
    for rx in (_TAG, _LINE):
        m = rx.search(goal)
        if m:
            name = slug(m.group(1))
            if name and name not in _NOT_NAMES and name not in _HERMES_ROLES:
                return name
    m = _YOU_ARE.match(goal)
    if m:
        raw = m.group(1)
        has_the = re.match(r"^\s*(?:you are|you're|as)\s+the\s", goal, re.I) is not None
        words = raw.split()
        if words and words[0].lower() in _NOT_NAMES:
            return None
        if not has_the:
            raw = words[0]  # "You are writer, ..." -> writer
        name = slug(raw)
        if name and name not in _NOT_NAMES and name not in _HERMES_ROLES:
            return name
    return None


def goal_with_persona(goal: str, persona: str) -> str:
    """Prefix a goal with the persona tag ``persona_from_goal`` reads back."""
    return f"[agent: {slug(persona)}] {goal}"
