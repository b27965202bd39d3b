"""Hermes 0.20+ tool search: a child that does only what it is told still reaches agent_channel.

Hermes 0.20+ (the index's forks) defers plugin tools by default: the model is offered
``tool_search``, ``tool_describe`` and ``tool_call``, and a call of ``agent_channel`` by name
fails ("Tool 'agent_channel' does not exist"). Here the stub model sends exactly what its
script says (``bridge=False``), and the child's script follows the plugin's first-turn note
to the letter: if the note says to go through ``tool_call``, it loads the schema with
``tool_describe`` and calls through ``tool_call`` in the shape the note shows; otherwise it
calls ``agent_channel`` directly. Run with tool search on (0.20+'s default; 0.19 has it
too, off for one plugin tool unless set ``on``) and off.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from harness import new_agent, run_scenario
from stub_model import Action, Conversation, text, tool_call

GOAL = "[agent: scout] Tell the director the venue is booked."
REPORT = {"action": "send", "to": "parent", "subject": "venue", "message": "venue booked"}


def _note(c: Conversation) -> str:
    first = c.user_messages[0] if c.user_messages else ""
    return first[first.find("[agent_channel]") :] if "[agent_channel]" in first else ""


def _as_told(c: Conversation, args: dict[str, Any]) -> Action:
    """The call the note asks for: through tool_call in the shape it shows, or direct."""
    m = re.search(r"through tool_call, e\.g\. tool_call\((calls|name)=", _note(c))
    if m is None:
        return tool_call("agent_channel", **args)
    if m.group(1) == "calls":
        return tool_call("tool_call", calls=[{"name": "agent_channel", "arguments": args}])
    return tool_call("tool_call", name="agent_channel", arguments=args)


def script(request: dict[str, Any]) -> list[Action]:
    c = Conversation(request)
    if not c.is_child:
        if not c.tool_results:
            return [tool_call("delegate_task", goal=GOAL)]
        return [text("director done")]
    told_to_bridge = "through tool_call" in _note(c)
    done = [t["name"] for t in c.raw_tool_calls]
    if told_to_bridge and "tool_describe" not in done:
        shown = re.search(r"tool_describe\((names|name)=", _note(c))
        if shown is not None and shown.group(1) == "name":
            return [tool_call("tool_describe", name="agent_channel")]
        return [tool_call("tool_describe", names=["agent_channel"])]
    if not any(n in ("agent_channel", "tool_call") for n in done):
        return [_as_told(c, REPORT)]
    return [text("reported: " + c.tool_results[-1])]


def scenario_child_follows_the_note() -> dict[str, Any]:
    from gateway.session_context import declare_stateless_channel
    from stub_model import StubModel

    from redisbus.integrations.hermes import runtime

    declare_stateless_channel()  # the delegation runs inline
    with StubModel(script, bridge=False) as stub:
        agent = new_agent(stub.base_url)
        result = agent.run_conversation("Book the venue, then report.")
        child = [Conversation(r) for r in stub.requests if Conversation(r).is_child]
        root = runtime().by_session[agent.session_id]
        return {
            "errors": stub.errors,
            "final": result["final_response"],
            "child_tools": child[0].tool_names,
            "note": _note(child[0]),
            "child_calls": [t["name"] for t in child[-1].raw_tool_calls],
            "child_results": child[-1].tool_results,
            "inbox": [(m.sender, m.subject, m.body) for m in root.agent.list("to:me", limit=50)],
        }


@pytest.mark.parametrize("mode", ["on", "off"])
def test_child_reaches_agent_channel_with_tool_search_on_and_off(redis_url: str, mode: str) -> None:
    out = run_scenario(
        scenario_child_follows_the_note,
        config={
            "tools": {"tool_search": {"enabled": mode}},
            "agent_channel": {"root_name": "director"},
        },
        env={"REDISBUS_URL": redis_url},
    )
    assert out["errors"] == []
    assert ["scout", "venue", "venue booked"] in out["inbox"]
    assert not any("does not exist" in r for r in out["child_results"])
    if mode == "off":
        assert "agent_channel" in out["child_tools"]
        assert "through tool_call" not in out["note"]
        assert out["child_calls"] == ["agent_channel"]
        return
    # deferred: the child was offered the bridge only, and the note told it how to cross it
    assert "agent_channel" not in out["child_tools"] and "tool_call" in out["child_tools"]
    assert "agent_channel is not in your tool list" in out["note"]
    assert out["child_calls"] == ["tool_describe", "tool_call"]
    described = json.dumps(out["child_results"][0])
    assert "Message your parent and sibling agents directly" in described
    assert "call it through tool_call" in described  # the tool's own description says it too
    sent = json.loads(out["child_results"][1])
    assert sent["ok"] is True and sent["from"] == "scout"
