"""What the MCP tests share: a ``redisbus mcp`` server process serving one agent and the
official ``mcp`` client on it (stdio or streamable HTTP), and result helpers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

# the mcp SDK is a dev dependency: missing, the import below fails the run (never a skip)
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from redisbus.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]


def server_args(channel: str, name: str, *extra: str) -> list[str]:
    return ["-m", "redisbus.integrations.mcp", "--channel", channel, "--as", name, *extra]


def server_env(redis_url: str, **extra: str) -> dict[str, str]:
    return {
        "REDISBUS_URL": redis_url,
        "REDISBUS_METRICS": "false",
        "PYTHONPATH": str(ROOT),
        **extra,
    }


@asynccontextmanager
async def mcp_agent(
    redis_url: str, channel: str, name: str, *extra: str, **session_kw: Any
) -> AsyncIterator[ClientSession]:
    """A ``python -m redisbus.integrations.mcp`` process serving ``name``, and a client on it."""
    params = StdioServerParameters(
        command=sys.executable,
        args=server_args(channel, name, *extra),
        env=server_env(redis_url),
        cwd=str(ROOT),
    )
    async with (
        stdio_client(params) as (read, write),
        ClientSession(read, write, **session_kw) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **args: Any) -> dict[str, Any]:
    res = await session.call_tool(tool, args)
    text = res.content[0].text  # type: ignore[union-attr]
    assert not res.is_error, text
    out: dict[str, Any] = json.loads(text)
    assert res.structured_content == out  # the same result, structured
    return out


async def refused(session: ClientSession, tool: str, **args: Any) -> str:
    res = await session.call_tool(tool, args)
    text: str = res.content[0].text  # type: ignore[union-attr]
    assert res.is_error, text
    return text


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(
                f"server exited: {proc.stderr.read().decode() if proc.stderr else ''}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listening on port {port}")


@contextmanager
def http_server(redis_url: str, channel: str, name: str, *extra: str, **env: str) -> Iterator[str]:
    """A ``redisbus mcp --transport http`` process; yields its endpoint URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            *server_args(channel, name, "--transport", "http", "--port", str(port), *extra),
        ],
        env={**os.environ, **server_env(redis_url, **env)},
        cwd=str(ROOT),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for_port(port, proc)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
