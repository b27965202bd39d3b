"""Outbound A2A: tokens per external agent, slow and not-yet-ready peers, traceparent, exits.

The peers are real a2a-sdk agents on loopback (``tests.integrations.test_a2a``'s helpers); a
tokened peer
refuses every request without its bearer token, as a Hermes gateway with ``A2A_PEER_TOKENS``
does. ``redisbus a2a`` runs as a subprocess where its command line and exit status matter.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

if importlib.util.find_spec("a2a") is None:  # the a2a extra: `make test` installs it
    if os.environ.get("CI"):  # in CI its absence fails the run, never a skip
        pytest.fail("CI: the a2a extra is not installed (pip install '.[a2a]')", pytrace=False)
    pytest.skip("the a2a extra is not installed", allow_module_level=True)

from a2a.helpers.proto_helpers import new_task
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types.a2a_pb2 import Part, TaskState
from starlette.types import ASGIApp, Receive, Scope, Send

from redisbus import Bus, BusSettings
from redisbus.embedded import free_port
from redisbus.integrations.a2a import External
from tests.integrations.test_a2a import Echo, bridge, echo_agent

REPO = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-peer-token"


class Tokened:
    """ASGI wrapper: 401 without ``Authorization: Bearer TOKEN``; records every request's
    headers (what a Hermes gateway with A2A_PEER_TOKENS would see)."""

    def __init__(self, app: Any) -> None:
        self.app: ASGIApp = app
        self.seen: list[tuple[str, dict[str, str]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append((scope["path"], headers))
        if headers.get("authorization") != f"Bearer {TOKEN}":
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return None
        return await self.app(scope, receive, send)


class Slow(AgentExecutor):
    """Answers after ``delay_s`` in one blocking SendMessage, as Hermes does for a turn."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None  # the sdk sets them
        await asyncio.sleep(self.delay_s)
        await event_queue.enqueue_event(
            new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED)
        )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.add_artifact([Part(text=f"slow: {context.get_user_input()}")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class NotReady(AgentExecutor):
    """Completes with nothing for its first ``empty`` requests (a peer still starting up)."""

    def __init__(self, empty: int) -> None:
        self.empty, self.calls = empty, 0

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id is not None and context.context_id is not None  # the sdk sets them
        self.calls += 1
        await event_queue.enqueue_event(
            new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED)
        )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if self.calls > self.empty:
            await updater.add_artifact([Part(text=f"ready: {context.get_user_input()}")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    yield b
    b.close()


@pytest.fixture
def chan() -> str:
    return f"out-{uuid.uuid4().hex[:8]}"


def tokened_peer() -> tuple[Any, Tokened]:
    peer = echo_agent(Echo())
    wrapped = Tokened(peer.server.config.app)
    peer.server.config.app = wrapped  # uvicorn loads the app per connection via config
    peer.server.config.loaded_app = wrapped
    return peer, wrapped


def cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_A2A")}
    full.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "redisbus.cli", "a2a", *args],
        cwd=REPO,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_member(bus: Bus, chan: str, name: str, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 20
    while name not in bus.channel(chan).members():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the bridge did not add the external agent"
        time.sleep(0.05)


def test_external_token_comes_from_a_file_or_the_environment_never_the_command_line(
    bus: Bus, redis_url: str, chan: str, tmp_path: Path
) -> None:
    peer, wrapped = tokened_peer()
    auth = tmp_path / "external-auth.json"
    auth.write_text(json.dumps({"peer": TOKEN}))
    ch = bus.channel(chan)
    alice = ch.join("alice")
    base = {"REDISBUS_URL": redis_url, "REDISBUS_A2A_EXTERNAL": f"peer={peer.url}"}
    args = ["--channel", chan, "--port", str(free_port())]
    try:
        # without the token the peer answers 401: one line, exit 2, nothing served
        proc = cli(args, base)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 2
        assert err.strip().splitlines()[-1].startswith("redisbus: a2a: the A2A agent at")
        assert "401" in err and "Traceback" not in err

        for env in (
            {"REDISBUS_A2A_EXTERNAL_AUTH_FILE": str(auth)},
            {"REDISBUS_A2A_EXTERNAL_AUTH": json.dumps({peer.url: TOKEN})},
        ):
            wrapped.seen.clear()
            proc = cli(args, {**base, **env})
            try:
                assert TOKEN not in " ".join(cast(list[str], proc.args))  # cli()'s argv
                _wait_member(bus, chan, "peer", proc)
                sent = alice.send("peer", "ping")
                [reply] = alice.wait(timeout=20).messages
                assert (reply.sender, reply.body, reply.reply_to) == ("peer", "echo: ping", sent.id)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=20)
            assert proc.returncode == 130  # Ctrl-C, as documented
            rpc = [h for path, h in wrapped.seen if "agent-card" not in path]
            assert rpc and all(h["authorization"] == f"Bearer {TOKEN}" for h in rpc)
            # every forwarded request carries a W3C traceparent
            assert all(h.get("traceparent", "").startswith("00-") for h in rpc)
    finally:
        peer.stop()


def test_an_unknown_key_in_the_auth_file_is_refused(redis_url: str, tmp_path: Path) -> None:
    auth = tmp_path / "a.json"
    auth.write_text(json.dumps({"typo": TOKEN}))
    proc = cli(
        ["--channel", "c", "--external", "peer=http://127.0.0.1:1"],
        {"REDISBUS_URL": redis_url, "REDISBUS_A2A_EXTERNAL_AUTH_FILE": str(auth)},
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2 and "'typo'" in err and TOKEN not in err
    assert len(err.strip().splitlines()) == 1


def test_unreachable_external_exits_2_with_one_line(redis_url: str) -> None:
    port = free_port()
    proc = cli(
        ["--channel", "c", "--port", str(free_port()), "--external", f"http://127.0.0.1:{port}"],
        {"REDISBUS_URL": redis_url},
    )
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    lines = [ln for ln in err.strip().splitlines() if "no caller tokens" not in ln]
    assert len(lines) == 1 and f"http://127.0.0.1:{port}" in lines[0], err


def test_a_turn_longer_than_the_timeout_fails_and_a_longer_timeout_waits_for_it(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    alice = ch.join("alice")
    peer = echo_agent(Slow(3.0))
    short = bridge(redis_url, chan, externals=[External(peer.url, "slow", timeout_s=1.5)])
    try:
        sent = alice.send("slow", "the report")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type) == (sent.id, "status_update")
        assert "could not be reached" in reply.body and "Timeout" in reply.body
    finally:
        short.stop()
    patient = bridge(redis_url, chan, externals=[External(peer.url, "slow", timeout_s=10)])
    try:
        sent = alice.send("slow", "the report")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type, reply.body) == (
            sent.id,
            "response",
            "slow: the report",
        )
    finally:
        patient.stop()
        peer.stop()


def test_an_empty_answer_is_asked_again_and_never_posted_empty(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    alice = ch.join("alice")
    starting = echo_agent(NotReady(empty=1))
    never = echo_agent(NotReady(empty=100))
    srv = bridge(
        redis_url,
        chan,
        externals=[
            External(starting.url, "starting", timeout_s=30),
            External(never.url, "never", timeout_s=30),
        ],
    )
    try:
        sent = alice.send("starting", "hello")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type, reply.body) == (sent.id, "response", "ready: hello")
        sent = alice.send("never", "hello")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type) == (sent.id, "status_update")
        assert reply.body == "the A2A agent returned an empty answer"
    finally:
        srv.stop()
        starting.stop()
        never.stop()
