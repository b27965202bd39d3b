"""MCP servers outlive their Redis: when it comes back empty, the next tool call joins the
agent (and its channel) again. Real ``redisbus mcp`` processes, the official ``mcp`` client, and
a redis-server of this test's own that it kills and replaces with an empty one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mcp.types import LoggingMessageNotificationParams

from redisbus._keys import ChannelKeys
from tests.support.mcp_support import call, mcp_agent
from tests.support.servers import Server, start_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def doomed_redis(tmp_path: Path) -> Iterator[Server]:
    """A Redis without persistence, for this test alone."""
    s = start_server("redis7", tmp_path)
    yield s
    s.stop()


def restart_empty(srv: Server) -> None:
    """SIGKILL the server and start a new, empty one on the same port."""
    srv.kill()
    srv.start()
    assert srv.client().dbsize() == 0


async def test_after_redis_comes_back_empty_the_next_call_rejoins_the_agent(
    doomed_redis: Server,
) -> None:
    url = doomed_redis.url
    logs: list[LoggingMessageNotificationParams] = []

    async def on_log(params: LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async with (
        mcp_agent(url, "r-team", "alice", logging_callback=on_log) as alice,
        mcp_agent(url, "r-team", "bob", "--description", "reviews", "--skill", "review") as bob,
    ):
        before = await call(alice, "agent_send_message", to="bob", message="before")
        assert [m["id"] for m in (await call(bob, "agent_wait", timeout=10))["messages"]] == [
            before["message_id"]
        ]

        restart_empty(doomed_redis)

        # bob's next call finds him gone and joins again: his board is empty, not an error
        listed = await call(bob, "agent_list_messages")
        assert listed["messages"] == []
        # alice's next call joins her again, and she can reach bob, card and all
        found = await call(alice, "agent_discover", query="review")
        assert [(a["name"], a.get("skills")) for a in found["agents"]] == [("bob", ["review"])]
        after = await call(alice, "agent_send_message", to="bob", message="after")

        heads = await call(bob, "agent_list_messages")
        assert [(m["id"], m["from"]) for m in heads["messages"]] == [(after["message_id"], "alice")]
        w = await call(bob, "agent_wait", timeout=10)
        assert [m["body"] for m in w["messages"]] == ["after"]

    members = doomed_redis.client().hkeys(ChannelKeys.build("rb", "r-team").members)
    assert sorted(members) == ["alice", "bob"]
    # the client was told, at the default level (warning)
    assert any(p.level == "warning" and "joined again" in str(p.data) for p in logs), logs
