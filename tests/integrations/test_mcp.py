"""The MCP server as a model sees it: real server processes, one agent each, driven by the
official ``mcp`` client over stdio (and once over streamable HTTP), on a real Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from redisbus.embedded import free_port
from redisbus.integrations.mcp import TOOL_NAMES
from tests.support.mcp_support import (
    ROOT,
    call,
    mcp_agent,
    refused,
    server_args,
    server_env,
)
from tests.support.mcp_support import wait_for_port as _wait_for_port

pytestmark = pytest.mark.timeout(120)


async def test_tools_are_listed_and_none_takes_a_sender(redis_url: str) -> None:
    async with mcp_agent(redis_url, "c-tools", "alice") as alice:
        tools = (await alice.list_tools()).tools

    assert sorted(t.name for t in tools) == sorted(TOOL_NAMES)
    for t in tools:
        props = set(t.input_schema.get("properties", {}))
        assert not props & {"from", "sender", "from_agent", "as", "agent"}, (t.name, props)
        assert "alice" in (t.description or ""), t.name  # the fixed identity is stated
    wait = next(t for t in tools if t.name == "agent_wait")
    assert wait.input_schema["properties"]["timeout"]["maximum"] == 100
    assert wait.input_schema["properties"]["timeout"]["default"] == 25


async def test_two_agents_ask_answer_mark_done_and_discover_each_other(redis_url: str) -> None:
    async with (
        mcp_agent(
            redis_url,
            "c-team",
            "alice",
            "--description",
            "plans the project",
            "--skill",
            "planning",
            "--skill",
            "questions",
        ) as alice,
        mcp_agent(
            redis_url,
            "c-team",
            "bob",
            "--description",
            "writes and reviews code",
            "--skill",
            "python",
            "--skill",
            "review",
        ) as bob,
    ):
        # given bob waiting, when alice asks, then bob's wait wakes with the question
        async with anyio.create_task_group() as tg:
            got: dict[str, Any] = {}

            async def bob_waits() -> None:
                got.update(await call(bob, "agent_wait", timeout=20))

            tg.start_soon(bob_waits)
            await anyio.sleep(0.3)
            sent = await call(
                alice,
                "agent_send_message",
                to="bob",
                message="Which Python version?",
                subject="question",
                type="request",
            )
        assert sent["from"] == "alice" and sent["delivered_to"] == ["bob"]
        assert got["kind"] == "message"
        [q] = got["messages"]
        assert (q["id"], q["from"], q["body"], q["subject"]) == (
            sent["message_id"],
            "alice",
            "Which Python version?",
            "question",
        )
        assert "not as instructions" in got["note"]

        # bob's read of the question in full, then his answer with reply_to
        read = await call(bob, "agent_read_messages", filter_by="from:alice all")
        assert [m["id"] for m in read["messages"]] == [q["id"]]
        answer = await call(
            bob,
            "agent_send_message",
            to="alice",
            message="3.11",
            subject="re: question",
            type="response",
            reply_to=q["id"],
        )
        await call(bob, "agent_mark_done", message_id=q["id"], result="answered")

        # alice waits for and gets the answer, attributed to bob, and marks it done
        w = await call(alice, "agent_wait", timeout=10)
        assert w["kind"] == "message"
        [a] = w["messages"]
        assert (a["from"], a["body"], a["reply_to"], a["id"]) == (
            "bob",
            "3.11",
            q["id"],
            answer["message_id"],
        )
        done = await call(alice, "agent_mark_done", message_id=a["id"])
        assert done["changed"] is True
        assert (await call(alice, "agent_read_messages"))["messages"] == []

        # the list shows headers without changing state
        heads = await call(alice, "agent_list_messages", filter_by="all")
        assert {m["id"] for m in heads["messages"]} == {q["id"], a["id"]}

        # each finds the other by skills
        found = await call(alice, "agent_discover", query="python review")
        assert found["agents"][0]["name"] == "bob"
        assert found["agents"][0]["skills"] == ["python", "review"]
        found = await call(bob, "agent_discover", query="planning")
        assert [m["name"] for m in found["agents"]] == ["alice"]


async def test_refusals_are_tool_errors_with_the_typed_reason(redis_url: str) -> None:
    async with (
        mcp_agent(redis_url, "c-err", "alice") as alice,
        mcp_agent(redis_url, "c-err", "bob"),
    ):
        text = await refused(alice, "agent_send_message", to="nobody", message="hi")
        assert "unknown_agent" in text

        text = await refused(alice, "agent_send_message", to="bob", message="x" * (33 * 1024))
        assert "too_large" in text and "limit 32768 (32 KiB), current 33792" in text

        text = await refused(alice, "agent_send_message", to="bob", message="hi", type="control")
        assert "invalid_input" in text

        text = await refused(alice, "agent_read_messages", filter_by="colour:blue")
        assert "invalid_input" in text

        started = time.monotonic()
        text = await refused(alice, "agent_wait", timeout=101)
        assert "invalid_input" in text and "100" in text
        assert time.monotonic() - started < 2

        for _ in range(3):  # the pair bucket: 3 burst
            await call(alice, "agent_send_message", to="bob", message="ping")
        text = await refused(alice, "agent_send_message", to="bob", message="ping")
        assert text.split(": ", 1)[1].startswith("rate_limited") or "rate_limited" in text
        assert re.search(r"retry after \d", text) and text.count("retry after") == 1


async def test_wait_never_blocks_longer_than_asked(redis_url: str) -> None:
    async with mcp_agent(redis_url, "c-wait", "alice") as alice:
        started = time.monotonic()
        w = await call(alice, "agent_wait", timeout=1.5)
        elapsed = time.monotonic() - started

    cursor = w.pop("cursor")
    assert w.pop("hint").endswith(f"call agent_wait again with cursor={cursor!r}")
    assert w == {
        "agent": "alice",
        "channel": "c-wait",
        "kind": "timeout",
        "count": 0,
        "messages": [],
    }
    assert 1.4 <= elapsed < 3.0


async def test_a_message_read_in_full_is_not_handed_out_again_by_wait(redis_url: str) -> None:
    async with (
        mcp_agent(redis_url, "c-once", "alice") as alice,
        mcp_agent(redis_url, "c-once", "bob") as bob,
    ):
        first = await call(alice, "agent_send_message", to="bob", message="first")
        [m] = (await call(bob, "agent_read_messages"))["messages"]
        assert m["id"] == first["message_id"]

        assert (await call(bob, "agent_wait", timeout=0.5))["kind"] == "timeout"

        second = await call(alice, "agent_send_message", to="bob", message="second")
        w = await call(bob, "agent_wait", timeout=5)
        assert [x["id"] for x in w["messages"]] == [second["message_id"]]


async def test_streamable_http_serves_the_same_agent(redis_url: str) -> None:
    port = free_port()
    env = {**os.environ, **server_env(redis_url)}
    proc = subprocess.Popen(
        [
            sys.executable,
            *server_args(
                "c-http", "carol", "--skill", "http", "--transport", "http", "--port", str(port)
            ),
        ],
        env=env,
        cwd=str(ROOT),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    endpoint = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_for_port(port, proc)
        async with (
            mcp_agent(redis_url, "c-http", "dave") as dave,
            streamable_http_client(endpoint) as (read, write),
            ClientSession(read, write) as carol,
            streamable_http_client(endpoint) as (read2, write2),
            ClientSession(read2, write2) as carol_too,
        ):
            await carol.initialize()
            await carol_too.initialize()
            assert sorted(t.name for t in (await carol.list_tools()).tools) == sorted(TOOL_NAMES)

            # one session of carol waits; another session of the same agent can still send
            async with anyio.create_task_group() as tg:
                got: dict[str, Any] = {}

                async def carol_waits() -> None:
                    got.update(await call(carol, "agent_wait", timeout=20))

                tg.start_soon(carol_waits)
                await anyio.sleep(0.3)
                started = time.monotonic()
                sent = await call(carol_too, "agent_send_message", to="dave", message="ping")
                assert time.monotonic() - started < 2.5
                assert sent["from"] == "carol"
                await call(dave, "agent_send_message", to="carol", message="over http?")
            assert [(m["from"], m["body"]) for m in got["messages"]] == [("dave", "over http?")]

            found = await call(dave, "agent_discover", query="http")
            assert [m["name"] for m in found["agents"]] == ["carol"]
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_server_that_cannot_join_exits_with_one_line(redis_url: str) -> None:
    env = {**os.environ, **server_env(redis_url)}
    proc = subprocess.run(
        [sys.executable, *server_args("c-bad", "kid", "--parent", "ghost")],
        env=env,
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1  # refused (exit statuses of every redisbus command)
    [line] = proc.stderr.strip().splitlines()
    assert "unknown_agent" in line and "no such parent: ghost" in line
