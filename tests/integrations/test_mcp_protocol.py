"""The MCP server's manners, as an MCP client sees them: who it says it is, what it declares,
what it refuses, the shape of its results, its log, and waits that fit a client's patience.
Real ``redisbus mcp`` processes, the official ``mcp`` client, a real Redis."""

from __future__ import annotations

import anyio
import pytest
from mcp.types import LoggingMessageNotificationParams

import redisbus
from redisbus.integrations.mcp import TOOL_NAMES
from tests.support.mcp_support import call, mcp_agent, refused

pytestmark = pytest.mark.timeout(120)


async def test_the_server_names_its_version_and_every_tool_returns_structured_content(
    redis_url: str,
) -> None:
    async with (
        mcp_agent(redis_url, "p-shape", "alice", "--skill", "maths") as alice,
        mcp_agent(redis_url, "p-shape", "bob") as bob,
    ):
        init = alice.initialize_result
        tools = {t.name: t for t in (await alice.list_tools()).tools}
        sent = await call(alice, "agent_send_message", to="bob", message="2+2?", subject="q")
        waited = await call(bob, "agent_wait", timeout=10)
        listed = await call(bob, "agent_list_messages")
        read = await call(bob, "agent_read_messages", filter_by="all")
        done = await call(bob, "agent_mark_done", message_id=sent["message_id"])
        found = await call(bob, "agent_discover", query="maths")

    assert init is not None
    assert (init.server_info.name, init.server_info.version) == ("redisbus", redisbus.__version__)
    assert init.capabilities.tools is not None
    assert init.capabilities.logging is not None
    assert set(tools) == set(TOOL_NAMES)
    for t in tools.values():
        assert t.output_schema is not None and t.output_schema["type"] == "object", t.name
        assert t.input_schema.get("additionalProperties") is False, t.name
    # call() checked that each structured result equals its JSON text; here, that it is data
    assert sent["delivered_to"] == ["bob"] and sent["receipts"][0]["status"] == "queued"
    assert [m["body"] for m in waited["messages"]] == ["2+2?"] and waited["cursor"]
    assert [m["id"] for m in listed["messages"]] == [sent["message_id"]]
    assert read["messages"][0]["from"] == "alice"
    assert done == {"done": [sent["message_id"]], "changed": True, "result": "ok"}
    assert [a["name"] for a in found["agents"]] == ["alice"]
    for name, out in (
        ("agent_send_message", sent),
        ("agent_wait", waited),
        ("agent_read_messages", read),
        ("agent_discover", found),
    ):
        assert set(tools[name].output_schema["required"]) <= set(out), name  # type: ignore[index]


async def test_unknown_arguments_are_refused_with_their_names_and_nothing_is_sent(
    redis_url: str,
) -> None:
    async with (
        mcp_agent(redis_url, "p-args", "alice") as alice,
        mcp_agent(redis_url, "p-args", "bob") as bob,
    ):
        text = await refused(
            alice, "agent_send_message", to="bob", message="hi", **{"from": "bob", "urgent": True}
        )
        assert text.startswith("invalid_input: agent_send_message has no arguments")
        assert "'from'" in text and "'urgent'" in text and "message" in text

        text = await refused(alice, "agent_wait", timeout=0, timout=5)
        assert text.startswith("invalid_input: agent_wait has no argument 'timout'")

        assert (await call(bob, "agent_list_messages"))["messages"] == []


# logging/setLevel is deprecated from protocol 2026-07-28 on; clients and servers speak 2025-11-25
@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
async def test_logging_set_level_decides_which_log_notifications_a_session_gets(
    redis_url: str,
) -> None:
    got: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        got.append(params)

    async with mcp_agent(redis_url, "p-log", "alice", logging_callback=on_log) as alice:
        await call(alice, "agent_list_messages")
        before = list(got)  # default level: warning, and nothing went wrong

        await alice.set_logging_level("debug")
        await call(alice, "agent_list_messages")
        await refused(alice, "agent_read_messages", filter_by="colour:blue")
        with anyio.fail_after(10):
            while len(got) < 2:
                await anyio.sleep(0.05)
        debug = list(got)

        await alice.set_logging_level("error")
        await call(alice, "agent_list_messages")
        await refused(alice, "agent_read_messages", filter_by="colour:blue")
        await call(alice, "agent_list_messages")  # one more round trip for stragglers

    assert before == []
    assert [(p.level, p.logger) for p in debug] == [("debug", "redisbus"), ("info", "redisbus")]
    assert "agent_list_messages" in str(debug[0].data)
    assert "invalid_input" in str(debug[1].data)
    assert got == debug  # at "error" the info and debug lines are dropped


async def test_waits_fit_a_client_time_limit_and_resume_without_losing_or_repeating(
    redis_url: str,
) -> None:
    async with (
        mcp_agent(redis_url, "p-resume", "alice") as alice,
        mcp_agent(redis_url, "p-resume", "bob") as bob,
    ):
        wait = next(t for t in (await bob.list_tools()).tools if t.name == "agent_wait")
        timeout = wait.input_schema["properties"]["timeout"]
        assert (timeout["default"], timeout["maximum"]) == (25, 100)
        text = await refused(bob, "agent_wait", timeout=100.5)
        assert text.startswith("invalid_input: timeout must be 0..100 seconds")
        assert "cursor" in text

        # a client that asks for progress hears from a long wait (and may extend its limit)
        ticks: list[tuple[float, float | None]] = []

        # (mcp's ProgressFnT protocol: the parameters' names too)
        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            ticks.append((progress, total))

        res = await bob.call_tool("agent_wait", {"timeout": 6}, progress_callback=on_progress)
        assert res.structured_content is not None
        assert res.structured_content["kind"] == "timeout"
        assert ticks and all(total == 6 and 5 <= done <= 6 for done, total in ticks), ticks

        quiet = await call(bob, "agent_wait", timeout=0.2)
        assert quiet["kind"] == "timeout"
        c0 = quiet["cursor"]

        # the client gives up on a wait (as MCP clients do after ~120 s): the message that
        # arrives meanwhile goes to a call nobody reads any more
        async def gives_up() -> None:
            with anyio.move_on_after(1.0):
                await bob.call_tool("agent_wait", {"timeout": 20, "cursor": c0})

        async with anyio.create_task_group() as tg:
            tg.start_soon(gives_up)
            await anyio.sleep(1.5)
            m1 = await call(alice, "agent_send_message", to="bob", message="one")

        # resuming from the last cursor bob saw hands it over
        w1 = await call(bob, "agent_wait", timeout=10, cursor=c0)
        assert [m["id"] for m in w1["messages"]] == [m1["message_id"]]

        # a result lost on the way: the same cursor gives the same messages again, flagged
        again = await call(bob, "agent_wait", timeout=10, cursor=c0)
        assert [m["id"] for m in again["messages"]] == [m1["message_id"]]
        assert again["replayed"] is True and again["cursor"] == w1["cursor"]

        # from the new cursor: only what is new, once
        m2 = await call(alice, "agent_send_message", to="bob", message="two")
        w2 = await call(bob, "agent_wait", timeout=10, cursor=w1["cursor"])
        assert [m["id"] for m in w2["messages"]] == [m2["message_id"]]
        assert "replayed" not in w2
        w3 = await call(bob, "agent_wait", timeout=0.3, cursor=w2["cursor"])
        assert (w3["kind"], w3["messages"]) == ("timeout", [])

        text = await refused(bob, "agent_wait", timeout=0, cursor="not a cursor")
        assert text.startswith("invalid_input: cursor")
