"""The scripted stub model drives a real Hermes ``AIAgent`` (hermes-agent from PyPI)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from harness import new_agent, run_scenario
from stub_model import Action, Conversation, StubModel, stream_events, text, tool_call


def scenario_hello() -> dict[str, Any]:
    from stub_model import StubModel, reply_hello

    with StubModel(reply_hello) as stub:
        agent = new_agent(stub.base_url, toolsets=[])
        result = agent.run_conversation("Say hello.")
        return {
            "final": result["final_response"],
            "completed": result["completed"],
            "api_calls": result["api_calls"],
            "requests": len(stub.requests),
            "stream": [bool(r.get("stream")) for r in stub.requests],
            "last_user": Conversation(stub.requests[0]).last_user,
            "is_child": Conversation(stub.requests[0]).is_child,
            "errors": stub.errors,
        }


def test_real_agent_replies_hello_through_the_stub() -> None:
    out = run_scenario(scenario_hello, config={"plugins": {"enabled": []}})
    assert out["final"] == "hello"
    assert out["completed"] is True
    assert out["api_calls"] == 1 and out["requests"] == 1
    assert out["stream"] == [True]  # Hermes streams every chat call
    assert out["last_user"] == "Say hello."
    assert out["is_child"] is False
    assert out["errors"] == []


def scenario_delegate_two() -> dict[str, Any]:
    """A parent delegates two tasks synchronously; each child answers from its own goal."""
    from gateway.session_context import declare_stateless_channel

    def script(request: dict[str, Any]) -> list[Action]:
        c = Conversation(request)
        if c.is_child:
            return [text(f"done: {c.goal}")]
        if not c.tool_results:
            # goals of 10+ characters: Hermes 0.20+ refuses shorter ones in a batch
            tasks = [{"goal": "Task A: the intro"}, {"goal": "Task B: the outro"}]
            return [tool_call("delegate_task", tasks=tasks)]
        return [text("parent saw " + str(len(json.loads(c.tool_results[0])["results"])))]

    declare_stateless_channel()
    with StubModel(script) as stub:
        agent = new_agent(stub.base_url, toolsets=["delegation"])
        result = agent.run_conversation("Delegate two tasks.")
        children = [Conversation(r) for r in stub.requests if Conversation(r).is_child]
        return {
            "final": result["final_response"],
            "child_goals": sorted(c.goal or "" for c in children),
            "tool_result": json.loads(
                next(m["content"] for m in result["messages"] if m.get("role") == "tool")
            ),
            "errors": stub.errors,
        }


def test_stub_tells_children_apart_and_runs_parallel_children() -> None:
    out = run_scenario(scenario_delegate_two, config={"plugins": {"enabled": []}})
    assert out["errors"] == []
    assert out["child_goals"] == ["Task A: the intro", "Task B: the outro"]
    summaries = sorted(r["summary"] for r in out["tool_result"]["results"])
    assert summaries == ["done: Task A: the intro", "done: Task B: the outro"]
    assert out["final"] == "parent saw 2"


# -- the wire format itself, without Hermes ---------------------------------------------


def test_sse_shape_for_tool_calls() -> None:
    events = list(stream_events([tool_call("agent_channel", action="read")]))
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    first = events[1]["choices"][0]["delta"]["tool_calls"][0]
    assert first["index"] == 0 and first["type"] == "function" and first["id"]
    args = "".join(
        e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] for e in events[1:-2]
    )
    assert json.loads(args) == {"action": "read"}
    assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == 15


def test_http_endpoints() -> None:
    with StubModel(lambda r: [text("hi there")]) as stub:
        with urllib.request.urlopen(stub.base_url + "/models") as resp:
            models = json.load(resp)
        assert models["data"][0]["id"] == "stub-model"
        assert models["data"][0]["context_length"] == 131072
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{stub.port}/api/tags")
            raise AssertionError("expected 404")
        except urllib.error.HTTPError as e:
            assert e.code == 404
        body = json.dumps(
            {"model": "stub-model", "stream": True, "messages": [{"role": "user", "content": "x"}]}
        ).encode()
        req = urllib.request.Request(
            stub.base_url + "/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req) as resp:
            lines = [ln for ln in resp.read().decode().split("\n") if ln]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
        content = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        assert content == "hi there"
        assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
