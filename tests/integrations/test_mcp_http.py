"""``redisbus mcp`` over streamable HTTP, guarded: a bearer token on every request, no exposure
beyond loopback without one, and the exit statuses every ``redisbus`` command has. Real server
processes, the official ``mcp`` client, a real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from redisbus.embedded import free_port
from redisbus.integrations.mcp import TOOL_NAMES
from tests.support.mcp_support import ROOT, call, http_server, server_args, server_env

pytestmark = pytest.mark.timeout(120)

TOKEN = "tok-" + "x" * 28

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    },
}
ACCEPT = {"accept": "application/json, text/event-stream"}


async def test_with_a_token_every_request_needs_it_and_the_right_one_gets_through(
    redis_url: str,
) -> None:
    with http_server(redis_url, "h-auth", "carol", REDISBUS_MCP_TOKEN=TOKEN) as endpoint:
        async with httpx2.AsyncClient() as raw:
            bare = await raw.post(endpoint, json=INITIALIZE, headers=ACCEPT)
            wrong = await raw.post(
                endpoint, json=INITIALIZE, headers={**ACCEPT, "authorization": "Bearer nope"}
            )
            basic = await raw.post(
                endpoint, json=INITIALIZE, headers={**ACCEPT, "authorization": f"Basic {TOKEN}"}
            )
            right = await raw.post(
                endpoint, json=INITIALIZE, headers={**ACCEPT, "authorization": f"Bearer {TOKEN}"}
            )

        async with (
            httpx2.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}) as authed,
            streamable_http_client(endpoint, http_client=authed) as (read, write),
            ClientSession(read, write) as carol,
        ):
            await carol.initialize()
            tools = (await carol.list_tools()).tools
            heads = await call(carol, "agent_list_messages")

    for refused in (bare, wrong, basic):
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert TOKEN not in refused.text
    assert right.status_code == 200
    assert sorted(t.name for t in tools) == sorted(TOOL_NAMES)
    assert heads["agent"] == "carol"


def run_mcp(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        env={**os.environ, **env},
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_http_beyond_loopback_without_a_token_is_refused_before_anything_starts() -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"  # never reached: the refusal comes first
    p = run_mcp(
        *server_args("h-open", "dave", "--transport", "http", "--host", "0.0.0.0"),
        **server_env(dead_redis),
    )

    assert p.returncode == 2  # bad input
    [line] = p.stderr.strip().splitlines()
    assert "invalid_input" in line and "0.0.0.0" in line and "REDISBUS_MCP_TOKEN" in line
    assert p.stdout == ""


def test_no_redis_exits_3_with_one_line_like_every_redisbus_command() -> None:
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    p = run_mcp(*server_args("h-dead", "erin"), **server_env(dead_redis))

    assert p.returncode == 3
    [line] = p.stderr.strip().splitlines()
    assert line.startswith("redisbus: connection:"), line


def test_the_mcp_command_shares_the_cli_help_and_environment() -> None:
    env: dict[str, Any] = {"COLUMNS": "200"}
    p = run_mcp("-m", "redisbus.cli", "mcp", "--help", **env)

    assert p.returncode == 0, p.stderr
    for option, var in (
        ("--channel", "REDISBUS_MCP_CHANNEL"),
        ("--as", "REDISBUS_AS"),
        ("--token", "REDISBUS_MCP_TOKEN"),
        ("--url", "REDISBUS_URL"),
    ):
        assert option in p.stdout and var in p.stdout, option
    assert "Usage: redisbus mcp" in " ".join(p.stdout.split())
