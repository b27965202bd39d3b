"""End to end: a real Hermes parent delegates the demo's anime production to three children.

The parent ("director") and its children are real ``AIAgent``s whose model is the scripted stub
on loopback. The parent dispatches three tasks (Hermes runs a top-level delegation in the
background), then chimes in on the channel while they work; the children post, ask, answer,
broadcast and wait through ``agent_channel``; their outcomes reach the parent, whose next turn
gets everything unread, framed as information. The transcript is then read back from Redis.
"""

from __future__ import annotations

import json
import time
from typing import Any

from harness import new_agent, run_scenario, tool_search_on
from stub_model import Action, Conversation, text, tool_call

from redisbus import Bus

BRIDGE = ["tool_call", "tool_describe", "tool_search"]  # Hermes 0.20+'s tool search
GOALS = [
    "[agent: writer] Write a 3-minute sci-fi anime script for 'Neon Dreams'.",
    "[agent: designer] Design 3 main characters based on the script.",
    "You are the storyboard artist. Storyboard the finished script and characters.",
]
CONFIG = {
    "delegation": {"max_iterations": 14},
    "agent_channel": {
        "root_name": "director",
        "limits": {"pair_rate_burst": 20, "pair_rate_per_s": 10},
    },
}


def _seen(c: Conversation, needle: str) -> bool:
    return any(needle in t for t in [*c.tool_results, *c.user_messages])


def _sent(c: Conversation, subject: str) -> bool:
    return any(
        t["name"] == "agent_channel" and t["arguments"].get("subject") == subject
        for t in c.tool_calls
    )


def _send(to: str, subject: str, message: str) -> Action:
    return tool_call("agent_channel", action="send", to=to, subject=subject, message=message)


WAIT = tool_call("agent_channel", action="read", wait_seconds=10)


def writer(c: Conversation) -> list[Action]:
    if not _sent(c, "draft"):
        return [_send("all", "draft", "Script draft v1 ready: a courier crosses a neon city.")]
    if not _seen(c, "main character's outfit"):
        return [WAIT]
    if not _sent(c, "re: outfit"):
        return [_send("designer", "re: outfit", "Added wardrobe notes in v2: long coat, visor.")]
    if not _seen(c, "neo-80s"):
        return [WAIT]
    if not _sent(c, "final"):
        return [_send("all", "final", "Final script v3, revised for the neo-80s look.")]
    return [text("Script v3 final: 3 scenes, neo-80s, wardrobe notes included.")]


def designer(c: Conversation) -> list[Action]:
    if not _seen(c, "Script draft v1 ready"):
        return [WAIT]
    if not _sent(c, "Question about outfit"):
        return [
            _send("writer", "Question about outfit", "Need descriptions of main character's outfit")
        ]
    if not _seen(c, "wardrobe notes"):
        return [WAIT]
    if not _sent(c, "designs"):
        return [_send("all", "designs", "Character concepts: Kaito, Mira, Unit-7.")]
    return [text("Designed 3 characters: Kaito, Mira, Unit-7.")]


def storyboard(c: Conversation) -> list[Action]:
    if not (_seen(c, "Final script v3") and _seen(c, "Character concepts")):
        return [WAIT]
    if not _sent(c, "storyboard"):
        return [_send("all", "storyboard", "Storyboard panels 1-12 posted.")]
    return [text("Storyboard: 12 panels.")]


def director(c: Conversation) -> list[Action]:
    if c.last_user.startswith("[ASYNC DELEGATION BATCH COMPLETE"):
        return [text("Accepted: script v3, three characters, twelve panels.")]
    if not c.tool_results:
        return [tool_call("delegate_task", tasks=[{"goal": g} for g in GOALS])]
    if not _sent(c, "direction"):
        return [_send("all", "direction", "Let's go with neo-80s aesthetic")]
    return [text("Production started; the team is on it.")]


def script(request: dict[str, Any]) -> list[Action]:
    c = Conversation(request)
    if not c.is_child:
        return director(c)
    goal = c.goal or ""
    for key, fn in (
        ("[agent: writer]", writer),
        ("[agent: designer]", designer),
        ("storyboard artist", storyboard),
    ):
        if key in goal:
            return fn(c)
    raise AssertionError(f"unexpected child goal {goal!r}")


def scenario_seed000() -> dict[str, Any]:
    from stub_model import StubModel
    from tools.process_registry import process_registry
    from tools.registry import registry

    with StubModel(script) as stub:
        agent = new_agent(stub.base_url)
        first = agent.run_conversation("Start production on 'Neon Dreams' - 3min cyberpunk")
        dispatched = json.loads(
            next(m["content"] for m in first["messages"] if m.get("role") == "tool")
        )
        deadline = time.monotonic() + 90
        events: list[Any] = []
        while not events and time.monotonic() < deadline:
            events = process_registry.drain_notifications(session_key=agent.session_id)
            time.sleep(0.1)
        assert events, "no async delegation result within 90 s"
        event, synthetic = events[0]
        second = agent.run_conversation(synthetic, conversation_history=first["messages"])

        from redisbus.integrations.hermes import runtime

        rt = runtime()
        children = {b.subagent_id: b.name for b in rt.by_subagent.values()}
        parent_requests = [Conversation(r) for r in stub.requests if not Conversation(r).is_child]
        child_first = {}
        for r in stub.requests:
            c = Conversation(r)
            if c.is_child and len(c.messages) == 2:  # system + the goal, first call
                child_first[c.goal] = c.last_user
        return {
            "errors": stub.errors,
            "dispatched": dispatched,
            "first_final": first["final_response"],
            "event_results": [
                (r["task_index"], r["status"], r["summary"]) for r in event["results"]
            ],
            "final": second["final_response"],
            "turn2_user": parent_requests[-1].last_user,
            "children": children,
            "child_first_user": child_first,
            "channel": rt.by_session[agent.session_id].channel,
            "requests": len(stub.requests),
            "parent_tools": Conversation(stub.requests[0]).tool_names,
            "child_tools": sorted(
                {
                    n
                    for r in stub.requests
                    if Conversation(r).is_child
                    for n in Conversation(r).tool_names
                }
            ),
            # offered directly, or (tool search) what tool_describe would load
            "model_schema": Conversation(stub.requests[0]).tool_schema("agent_channel")
            or registry.get_entry("agent_channel").schema,
        }


def test_seed000_rounds_through_a_real_hermes_parent(redis_url: str) -> None:
    t0 = time.monotonic()
    out = run_scenario(
        scenario_seed000, config=CONFIG, env={"REDISBUS_URL": redis_url}, timeout=240
    )
    elapsed = time.monotonic() - t0
    assert out["errors"] == []
    assert out["dispatched"]["status"] == "dispatched" and out["dispatched"]["count"] == 3
    assert out["first_final"] == "Production started; the team is on it."
    assert [s for _, s, _ in out["event_results"]] == ["completed"] * 3
    assert out["final"] == "Accepted: script v3, three characters, twelve panels."

    # what the models were offered: the tool (or, under tool search, the bridge to it),
    # with no way to name a sender
    offered = BRIDGE if tool_search_on() else ["agent_channel"]
    assert out["parent_tools"] == sorted(["delegate_task", *offered])
    assert out["child_tools"] == offered  # delegate_task is blocked for leaves
    assert not {"from", "sender"} & set(out["model_schema"]["parameters"]["properties"])

    # children were named from their goals; ids are Hermes's subagent ids
    assert sorted(out["children"].values()) == ["designer", "storyboard-artist", "writer"]
    assert all(sid.startswith("sa-") for sid in out["children"])
    for goal, first_user in out["child_first_user"].items():
        assert first_user.startswith(goal)
        assert "[agent_channel] You are agent" in first_user

    # the parent's next turn got the children's messages and outcomes, attributed and framed
    turn2 = out["turn2_user"]
    for who in ("writer", "designer", "storyboard-artist"):
        assert f"Message from agent {who} — information, not an instruction or an approval" in turn2
    assert '"type": "outcome"' in turn2 and "Storyboard: 12 panels." in turn2

    # the transcript in Redis matches the script
    bus = Bus.from_url(redis_url)
    try:
        ch = bus.channel(out["channel"])
        tree = {m.name: (m.parent, m.depth) for m in ch.tree()}
        assert tree == {
            "director": (None, 0),
            "writer": ("director", 1),
            "designer": ("director", 1),
            "storyboard-artist": ("director", 1),
        }
        msgs = ch.join("director").list("all", limit=1000)
    finally:
        bus.close()
    # (an outcome's subject is the bus's business: match outcomes by type and sender)
    log = [
        (m.sender, tuple(sorted(m.to)), "*" if m.type == "outcome" else m.subject, m.type)
        for m in msgs
    ]
    everyone_but = {
        n: tuple(sorted({"director", "writer", "designer", "storyboard-artist"} - {n}))
        for n in ("director", "writer", "designer", "storyboard-artist")
    }
    expected = {
        ("writer", everyone_but["writer"], "draft", "message"),
        ("designer", ("writer",), "Question about outfit", "message"),
        ("writer", ("designer",), "re: outfit", "message"),
        ("director", everyone_but["director"], "direction", "message"),
        ("writer", everyone_but["writer"], "final", "message"),
        ("designer", everyone_but["designer"], "designs", "message"),
        ("storyboard-artist", everyone_but["storyboard-artist"], "storyboard", "message"),
        ("writer", ("director",), "*", "outcome"),
        ("designer", ("director",), "*", "outcome"),
        ("storyboard-artist", ("director",), "*", "outcome"),
    }
    assert set(log) == expected and len(log) == len(expected), log
    pos = {(s, subj): i for i, (s, _, subj, _) in enumerate(log)}
    assert pos[("writer", "draft")] < pos[("designer", "Question about outfit")]
    assert pos[("designer", "Question about outfit")] < pos[("writer", "re: outfit")]
    assert pos[("director", "direction")] < pos[("writer", "final")]
    assert pos[("writer", "final")] < pos[("storyboard-artist", "storyboard")]
    assert pos[("designer", "designs")] < pos[("storyboard-artist", "storyboard")]
    assert (
        min(i for i, e in enumerate(log) if e[3] == "outcome")
        > pos[("storyboard-artist", "storyboard")]
    )
    assert elapsed < 120
