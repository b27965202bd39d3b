"""The library helper (the ``delegate_task`` shape of the README), persistence, and nested trees."""

from __future__ import annotations

import json
from typing import Any

from harness import new_agent, run_scenario
from stub_model import Action, Conversation, text, tool_call

BOARD = "anime-project-1"


def _sent(c: Conversation, subject: str) -> bool:
    return any(t["arguments"].get("subject") == subject for t in c.tool_calls)


def helper_script(request: dict[str, Any]) -> list[Action]:
    c = Conversation(request)
    goal = c.goal or ""
    if "[agent: writer]" in goal:
        if not _sent(c, "draft"):
            return [
                tool_call(
                    "agent_channel",
                    action="send",
                    to="designer",
                    subject="draft",
                    message="Script draft v1 ready",
                )
            ]
        return [text("wrote the draft")]
    if "[agent: designer]" in goal:
        if not any("Script draft v1 ready" in t for t in c.tool_results):
            return [
                tool_call("agent_channel", action="read", filter_by="from:writer", wait_seconds=10)
            ]
        return [text("read the draft")]
    if "[agent: reviewer]" in goal:
        if not c.tool_results:
            return [tool_call("agent_channel", action="list", filter_by="all")]
        return [text("reviewed: " + c.tool_results[-1])]
    return [text("plain child: " + goal)]


def scenario_helper(channel_name: str, second_run: bool) -> dict[str, Any]:
    from stub_model import StubModel

    from redisbus.integrations.hermes import delegate_task, runtime

    with StubModel(helper_script) as stub:
        agent = new_agent(stub.base_url)
        if not second_run:
            plain = delegate_task(tasks=[{"goal": "Summarise the brief"}], parent_agent=agent)
            result = delegate_task(
                tasks=[
                    {"goal": "Write a script", "role": "writer"},
                    {"goal": "Design characters", "role": "designer"},
                ],
                enable_agent_channel=True,
                channel_name=channel_name,
                parent_agent=agent,
            )
        else:
            plain = None
            result = delegate_task(
                tasks=[{"goal": "Review the board", "role": "reviewer"}],
                enable_agent_channel=True,
                channel_name=channel_name,
                parent_agent=agent,
            )
        rt = runtime()
        return {
            "plain": plain,
            "result": result,
            "names": sorted(b.name for b in rt.by_subagent.values()),
            "errors": stub.errors,
        }


def test_helper_runs_seed000_shape_and_board_survives_restart(redis_url: str) -> None:
    env = {"REDISBUS_URL": redis_url}
    cfg = {"agent_channel": {"root_name": "director"}}
    first = run_scenario(
        scenario_helper, config=cfg, env=env, params={"channel_name": BOARD, "second_run": False}
    )
    assert first["errors"] == []
    # without enable_agent_channel: exactly Hermes's delegate_task, no channel
    assert "channel" not in first["plain"]
    assert first["plain"]["results"][0]["summary"] == "plain child: Summarise the brief"
    res = first["result"]
    assert res["channel"] == BOARD
    assert [r["summary"] for r in res["results"]] == ["wrote the draft", "read the draft"]
    assert first["names"] == ["designer", "writer"]  # role "writer" became the persona

    # a new Hermes process, same Redis: the board is still there
    second = run_scenario(
        scenario_helper, config=cfg, env=env, params={"channel_name": BOARD, "second_run": True}
    )
    assert second["errors"] == []
    summary = second["result"]["results"][0]["summary"]
    assert summary.startswith("reviewed: ")
    board = json.loads(summary[len("reviewed: ") :])
    seen = [(m["from"], m["subject"] if m["type"] != "outcome" else "*") for m in board["messages"]]
    assert ("writer", "draft") in seen
    assert ("writer", "*") in seen and ("designer", "*") in seen  # both outcomes


# -- nested orchestrators -------------------------------------------------------------------


def tree_script(request: dict[str, Any]) -> list[Action]:
    c = Conversation(request)
    goal = c.goal
    if goal is None:  # the top-level parent
        if not c.tool_results:
            return [
                tool_call(
                    "delegate_task",
                    tasks=[
                        {
                            "goal": "[agent: lead] Split the storyboard between two artists",
                            "role": "orchestrator",
                        }
                    ],
                )
            ]
        return [text("done")]
    if goal.startswith("[agent: lead]"):
        if not c.tool_results:
            return [
                tool_call(
                    "delegate_task",
                    tasks=[
                        {"goal": "[agent: panel-a] Draw panels 1-6"},
                        {"goal": "[agent: panel-b] Draw panels 7-12"},
                    ],
                )
            ]
        if len(c.tool_results) == 1:
            return [tool_call("agent_channel", action="read", filter_by="all")]
        return [text("lead read: " + c.tool_results[-1])]
    if not c.tool_results:
        return [
            tool_call(
                "agent_channel",
                action="send",
                to="parent",
                subject="panels",
                message=f"{goal.split(']')[0][8:]} finished",
            )
        ]
    return [text("drew " + goal)]


def scenario_tree() -> dict[str, Any]:
    from gateway.session_context import declare_stateless_channel
    from stub_model import StubModel

    from redisbus.integrations.hermes import runtime

    declare_stateless_channel()  # the top-level delegation runs synchronously
    with StubModel(tree_script) as stub:
        agent = new_agent(stub.base_url)
        result = agent.run_conversation("Storyboard it")
        rt = runtime()
        root = rt.by_session[agent.session_id]
        tree = [(m.name, m.parent, m.depth) for m in rt.channel(root.channel).tree()]
        lead_summary = next(m["content"] for m in result["messages"] if m.get("role") == "tool")
        return {
            "errors": stub.errors,
            "tree": tree,
            "final": result["final_response"],
            "tool_result": lead_summary,
            "root_inbox": [(m.sender, m.type, m.body) for m in root.agent.list("to:me", limit=100)],
        }


def test_nested_orchestrators_form_a_tree(redis_url: str) -> None:
    out = run_scenario(
        scenario_tree,
        config={
            "delegation": {"max_spawn_depth": 2, "max_iterations": 6},
            "agent_channel": {"root_name": "director"},
        },
        env={"REDISBUS_URL": redis_url},
    )
    assert out["errors"] == []
    assert sorted(out["tree"]) == [
        ["director", None, 0],
        ["lead", "director", 1],
        ["panel-a", "lead", 2],
        ["panel-b", "lead", 2],
    ]
    lead = json.loads(out["tool_result"])["results"][0]
    assert lead["status"] == "completed"
    assert "panel-a finished" in lead["summary"] and "panel-b finished" in lead["summary"]
    # grandchildren's outcomes went to their parent (lead), lead's outcome to the director
    assert [s for s, t, _ in out["root_inbox"] if t == "outcome"] == ["lead"]
    assert '"from": "panel-a"' in lead["summary"] and '"type": "outcome"' in lead["summary"]


def test_helper_switches_the_channel_on_when_config_leaves_it_off() -> None:
    """Plugin loaded (plugins.enabled) but no agent_channel block and no REDISBUS_*:
    ``enable_agent_channel=True`` is the opt-in; the bus is a private embedded Redis."""
    out = run_scenario(
        scenario_helper,
        config={},
        env={"REDISBUS_URL": "", "REDISBUS_ENABLED": ""},
        params={"channel_name": BOARD, "second_run": False},
    )
    assert out["errors"] == []
    assert "channel" not in out["plain"]
    assert [r["summary"] for r in out["result"]["results"]] == ["wrote the draft", "read the draft"]
    assert out["names"] == ["designer", "writer"]
