"""The A2A bridge, both ways: the a2a-sdk client against the bridge's server, and the bridge's
client against a real a2a-sdk server, over HTTP on loopback, with a real redis-server."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.client.errors import AgentCardResolutionError
from a2a.helpers.proto_helpers import new_task, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from starlette.applications import Starlette

from redisbus import Agent, Bus, BusSettings
from redisbus.embedded import free_port
from redisbus.integrations.a2a import BridgeConfig, External, build_app

TOKENS = {"tok-alice": "alice", "tok-carol": "carol"}


class Served:
    """An ASGI app under uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def bridge(redis_url: str, channel: str, **kw: Any) -> Served:
    port = free_port()
    cfg = BridgeConfig(
        channel=channel,
        tokens=TOKENS,
        public_url=f"http://127.0.0.1:{port}",
        settings=BusSettings(url=redis_url, metrics=False),
        send_wait_s=kw.pop("send_wait_s", 10.0),
        **kw,
    )
    app = build_app(cfg)
    s = Served.__new__(Served)
    s.port, s.url = port, f"http://127.0.0.1:{port}"
    s.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    s.thread = threading.Thread(target=s.server.run, daemon=True)
    s.thread.start()
    deadline = time.monotonic() + 15
    while not s.server.started:
        assert s.thread.is_alive() and time.monotonic() < deadline, "bridge did not start"
        time.sleep(0.01)
    return s


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    yield b
    b.close()


@pytest.fixture
def chan() -> str:
    return f"a2a-{uuid.uuid4().hex[:8]}"


async def client_for(url: str, token: str | None, streaming: bool = False) -> Client:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=30)
    card = await A2ACardResolver(http, url).get_agent_card()
    return ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create(card)


def text_request(text: str, *, immediately: bool = False, task_id: str = "") -> SendMessageRequest:
    msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if task_id:
        msg.task_id = task_id
    return SendMessageRequest(
        message=msg, configuration=SendMessageConfiguration(return_immediately=immediately)
    )


async def one_task(client: Client, req: SendMessageRequest) -> Task:
    events = [e async for e in client.send_message(req)]
    assert len(events) == 1 and events[0].HasField("task"), events
    return events[0].task


def answer_in_thread(agent: Agent, reply: str, delay_s: float = 0.0) -> threading.Thread:
    """The member's side: wait for the request, reply to it, mark it done."""

    def run() -> None:
        got = agent.wait(timeout=10)
        for m in got.messages:
            time.sleep(delay_s)
            agent.send(m.sender, f"{reply} ({m.body})", reply_to=m.id, type="response")
            agent.mark_done(m, result="answered")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# -- inbound ------------------------------------------------------------------------------------


def test_each_member_has_its_card_at_the_well_known_path(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    ch.join("bob", description="answers questions about trains", skills=["trains", "timetables"])
    srv = bridge(redis_url, chan)
    try:

        async def fetch() -> AgentCard:
            async with httpx.AsyncClient() as http:
                return await A2ACardResolver(http, f"{srv.url}/agents/bob").get_agent_card()

        card = asyncio.run(fetch())
        assert card.name == "bob"
        assert card.description == "answers questions about trains"
        assert [s.id for s in card.skills] == ["trains", "timetables"]
        assert card.capabilities.streaming
        assert card.supported_interfaces[0].url == f"{srv.url}/agents/bob"
        assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
        listing = httpx.get(f"{srv.url}/agents").json()
        assert [m["name"] for m in listing] == ["bob"]
    finally:
        srv.stop()


def test_send_delivers_from_the_token_identity_and_completes_with_the_reply(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    bob = ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        answering = answer_in_thread(bob, "hello alice")

        async def talk() -> Task:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            return await one_task(client, text_request("hi bob"))

        task = asyncio.run(talk())
        answering.join(5)
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.status.message.parts[0].text == "hello alice (hi bob)"
        assert task.artifacts[0].parts[0].text == "hello alice (hi bob)"
        # on the bus: one message from "alice" (the token's name), answered and done
        [sent] = [m for m in bob.list(filter_by="from:alice") if m.type == "request"]
        assert sent.id == task.id and sent.body == "hi bob"
        [receipt] = bob.receipt(task.id)
        assert receipt.status == "done"
        # the reply was handed over through the task: done on the bus, nothing left unread
        alice = ch.join("alice")
        assert alice.read(filter_by="unread") == []
    finally:
        srv.stop()


def test_stream_follows_the_receipt_until_the_reply(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan)
    bob = ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> list[tuple[int, str]]:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice", streaming=True)
            seen: list[tuple[int, str]] = []
            async for event in client.send_message(text_request("stream please")):
                if event.HasField("task"):
                    status = event.task.status
                    answer_in_thread(bob, "streamed", delay_s=1.5)  # bob starts only now
                else:
                    status = event.status_update.status
                text = status.message.parts[0].text if status.message.parts else ""
                seen.append((status.state, text))
            return seen

        seen = asyncio.run(talk())
        states = [s for s, _ in seen]
        assert states == [
            TaskState.TASK_STATE_SUBMITTED,
            TaskState.TASK_STATE_WORKING,
            TaskState.TASK_STATE_COMPLETED,
        ]
        assert seen[-1][1] == "streamed (stream please)"
    finally:
        srv.stop()


def test_get_and_cancel_a_task(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan)
    bob = ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> None:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            task = await one_task(client, text_request("long job", immediately=True))
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED
            got = await client.get_task(GetTaskRequest(id=task.id))
            assert got.status.state == TaskState.TASK_STATE_SUBMITTED
            assert got.history[0].parts[0].text == "long job"
            cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
            assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
            with pytest.raises(TaskNotCancelableError):
                await client.cancel_task(CancelTaskRequest(id=task.id))
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id="1-1"))
            # another caller cannot see alice's task
            other = await client_for(f"{srv.url}/agents/bob", "tok-carol")
            with pytest.raises(TaskNotFoundError):
                await other.get_task(GetTaskRequest(id=task.id))
            # the member was told, in the task's thread
            msgs = bob.read(filter_by="from:alice")
            assert msgs[0].body == "long job"
            assert msgs[1].subject == "cancel" and msgs[1].reply_to == task.id

        asyncio.run(talk())
    finally:
        srv.stop()


# -- refusals -----------------------------------------------------------------------------------


def test_rate_limit_and_pause_refuse_as_a2a_errors_and_send_nothing(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan, pair_rate_burst=1, pair_rate_per_s=0.01)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> None:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            await one_task(client, text_request("first", immediately=True))
            with pytest.raises(UnsupportedOperationError) as refused:
                await one_task(client, text_request("second", immediately=True))
            assert refused.value.data is not None
            assert refused.value.data["reason"] == "rate_limited"
            assert float(refused.value.data["retry_after_s"]) > 0
            ch.pause()
            carol = await client_for(f"{srv.url}/agents/bob", "tok-carol")
            with pytest.raises(UnsupportedOperationError) as paused:
                await one_task(carol, text_request("while paused", immediately=True))
            assert paused.value.data is not None
            assert paused.value.data["reason"] == "channel_paused"

        asyncio.run(talk())
        assert ch.length() == 1  # only "first" reached the stream
    finally:
        srv.stop()


def test_unknown_member_and_unauthenticated_caller_are_refused(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> None:
            async with httpx.AsyncClient() as http:
                with pytest.raises(AgentCardResolutionError) as nocard:
                    await A2ACardResolver(http, f"{srv.url}/agents/ghost").get_agent_card()
                assert nocard.value.status_code == 404
                card = await A2ACardResolver(http, f"{srv.url}/agents/bob").get_agent_card()
            # a caller that knows the ghost's URL still reaches nobody
            ghost = AgentCard()
            ghost.CopyFrom(card)
            del ghost.supported_interfaces[:]
            ghost.supported_interfaces.append(
                AgentInterface(
                    url=f"{srv.url}/agents/ghost",
                    protocol_binding="JSONRPC",
                    protocol_version="1.0",
                )
            )
            http = httpx.AsyncClient(headers={"Authorization": "Bearer tok-alice"})
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(ghost)
            with pytest.raises(InvalidParamsError) as unknown:
                await one_task(client, text_request("anyone?"))
            assert unknown.value.data is not None
            assert unknown.value.data["reason"] == "unknown_agent"
            for token in (None, "forged"):
                anon = await client_for(f"{srv.url}/agents/bob", token)
                with pytest.raises(A2AClientError, match="401"):
                    await one_task(anon, text_request("let me in"))

        asyncio.run(talk())
        assert ch.length() == 0
        assert set(ch.members()) == {"bob"}  # nobody joined under a name of its choosing
    finally:
        srv.stop()


def test_a2a_0_3_method_names_work_on_the_same_endpoint(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    bob = ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        answering = answer_in_thread(bob, "old client")
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "message/send",
            "params": {
                "message": {
                    "kind": "message",
                    "messageId": str(uuid.uuid4()),
                    "role": "user",
                    "parts": [{"kind": "text", "text": "v0.3 hello"}],
                }
            },
        }
        r = httpx.post(
            f"{srv.url}/agents/bob/",
            json=body,
            headers={"Authorization": "Bearer tok-alice"},
            timeout=15,
        )
        answering.join(5)
        result = r.json()["result"]
        assert result["status"]["state"] == "completed"
        assert result["status"]["message"]["parts"][0]["text"] == "old client (v0.3 hello)"
    finally:
        srv.stop()


# -- outbound -----------------------------------------------------------------------------------


class Echo(AgentExecutor):
    """A real a2a-sdk agent: answers each message with one text message."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        await event_queue.enqueue_event(new_text_message(f"echo: {text}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


class Worker(AgentExecutor):
    """A real a2a-sdk agent that works in a task: working, an artifact, then completed (or
    failed when asked to fail)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        text = context.get_user_input()
        await event_queue.enqueue_event(
            new_task(context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED)
        )
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        await asyncio.sleep(0.2)
        if "fail" in text:
            await updater.failed(new_text_message("cannot do that"))
            return
        await updater.add_artifact([Part(text=f"worked on: {text}")])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def echo_agent(executor: AgentExecutor | None = None) -> Served:
    port = free_port()
    card = AgentCard(
        name="Echo Agent",
        description="repeats what it is told",
        version="1.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["echo"])],
    )
    handler = DefaultRequestHandler(executor or Echo(), InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    s = Served.__new__(Served)
    s.port, s.url = port, f"http://127.0.0.1:{port}"
    s.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    s.thread = threading.Thread(target=s.server.run, daemon=True)
    s.thread.start()
    deadline = time.monotonic() + 15
    while not s.server.started:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return s


def test_external_agent_joins_and_answers_with_replies(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan)
    alice = ch.join("alice")
    echo = echo_agent()
    srv = bridge(redis_url, chan, externals=[External(url=echo.url)])
    try:
        member = ch.members()["echo-agent"]
        assert member.description == "repeats what it is told"
        assert member.skills == ("echo",)
        r = alice.send("echo-agent", "ping")
        got = alice.wait(timeout=15)
        [reply] = got.messages
        assert (reply.sender, reply.body, reply.reply_to) == ("echo-agent", "echo: ping", r.id)
        assert reply.type == "response"
        assert r.id is not None
        deadline = time.monotonic() + 5
        while alice.receipt(r.id)[0].status != "done" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alice.receipt(r.id)[0].status == "done"
    finally:
        srv.stop()
        echo.stop()


def test_external_agents_reply_obeys_the_inbox_cap(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan, inbox_cap=1)
    alice = ch.join("alice")
    carol = ch.join("carol")
    echo = echo_agent()
    srv = bridge(redis_url, chan, externals=[External(url=echo.url, name="echo")])
    try:
        r = alice.send("echo", "fill your answer in")
        assert r.id is not None
        carol.send("alice", "alice's inbox is now full")
        deadline = time.monotonic() + 15
        while alice.receipt(r.id)[0].status != "done" and time.monotonic() < deadline:
            time.sleep(0.05)
        [receipt] = alice.receipt(r.id)
        # the reply went through the normal send path and was refused like any other
        assert (receipt.status, receipt.result) == ("done", "reply refused")
        assert [m.sender for m in alice.read(filter_by="unread")] == ["carol"]
    finally:
        srv.stop()
        echo.stop()


def test_inbox_cap_and_chain_depth_refuse_bridged_sends(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan, inbox_cap=2, max_chain_depth=1)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> None:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            first = await one_task(client, text_request("one", immediately=True))
            # a follow-up in a task is a reply to it on the bus: chain depth 1, then 2
            second = await one_task(client, text_request("two", immediately=True, task_id=first.id))
            with pytest.raises(UnsupportedOperationError) as deep:
                await one_task(client, text_request("three", immediately=True, task_id=second.id))
            assert deep.value.data is not None
            assert deep.value.data["reason"] == "chain_too_deep"
            with pytest.raises(UnsupportedOperationError) as full:
                await one_task(client, text_request("three again", immediately=True))
            assert full.value.data is not None
            assert full.value.data["reason"] == "inbox_full"

        asyncio.run(talk())
        assert ch.length() == 2
    finally:
        srv.stop()


def test_expired_request_fails_the_task_with_the_reason(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    ch.join("bob")  # never reads
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> Task:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            req = text_request("only worth it for a moment", immediately=True)
            req.message.metadata.update({"ttl_s": 0.2})
            task = await one_task(client, req)
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED
            await asyncio.sleep(0.5)
            return await client.get_task(GetTaskRequest(id=task.id))

        task = asyncio.run(talk())
        assert task.status.state == TaskState.TASK_STATE_FAILED
        assert task.status.message.parts[0].text.startswith("expired")
    finally:
        srv.stop()


def test_unreachable_external_agent_is_reported_to_the_sender(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    alice = ch.join("alice")
    echo = echo_agent()
    srv = bridge(redis_url, chan, externals=[External(url=echo.url, name="echo")])
    try:
        echo.stop()  # joined with its card, then gone
        r = alice.send("echo", "anyone home?")
        [reply] = alice.wait(timeout=30).messages
        assert reply.reply_to == r.id and reply.type == "status_update"
        assert reply.body.startswith("the A2A agent could not be reached")
        assert r.id is not None
        deadline = time.monotonic() + 5
        while alice.receipt(r.id)[0].status != "done" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert alice.receipt(r.id)[0].result == "failed"
    finally:
        srv.stop()


def test_done_without_reply_completes_with_the_result_and_tasks_are_listed(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    bob = ch.join("bob")
    srv = bridge(redis_url, chan)
    try:

        async def talk() -> None:
            client = await client_for(f"{srv.url}/agents/bob", "tok-alice")
            task = await one_task(client, text_request("just do it", immediately=True))
            streaming = await client_for(f"{srv.url}/agents/bob", "tok-alice", streaming=True)
            events = streaming.subscribe(SubscribeToTaskRequest(id=task.id))
            first = await anext(events)
            assert first.task.status.state == TaskState.TASK_STATE_SUBMITTED
            [m] = bob.wait(timeout=10).messages
            bob.mark_done(m, result="did it, nothing to say")
            rest = [e async for e in events]
            last = rest[-1].status_update.status
            assert last.state == TaskState.TASK_STATE_COMPLETED
            assert last.message.parts[0].text == "did it, nothing to say"
            listed = await client.list_tasks(ListTasksRequest())
            assert [t.id for t in listed.tasks] == [task.id]
            other = await client_for(f"{srv.url}/agents/bob", "tok-carol")
            assert list((await other.list_tasks(ListTasksRequest())).tasks) == []

        asyncio.run(talk())
    finally:
        srv.stop()


def test_command_refuses_bad_tokens_and_externals(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from redisbus._commands import program
    from redisbus.cli.a2a import a2a

    def main(argv: list[str]) -> int:
        return program(a2a, "a2a", argv)

    monkeypatch.setenv("REDISBUS_A2A_TOKENS", '["not", "a", "mapping"]')
    assert main(["--channel", "c"]) == 2
    assert "token -> member name" in capsys.readouterr().err
    monkeypatch.setenv("REDISBUS_A2A_TOKENS", '{"t": "all"}')  # a reserved name
    assert main(["--channel", "c"]) == 2
    monkeypatch.setenv("REDISBUS_A2A_TOKENS", '{"t": "alice"}')
    assert main(["--channel", "c", "--external", "ftp://nowhere"]) == 2
    assert "http(s) URL" in capsys.readouterr().err


def test_external_agent_working_in_a_task_answers_with_its_artifact_or_failure(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    alice = ch.join("alice")
    worker = echo_agent(Worker())
    srv = bridge(redis_url, chan, externals=[External(url=worker.url, name="worker")])
    try:
        ok = alice.send("worker", "the report")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type, reply.body) == (
            ok.id,
            "response",
            "worked on: the report",
        )
        bad = alice.send("worker", "please fail")
        [reply] = alice.wait(timeout=30).messages
        assert (reply.reply_to, reply.type) == (bad.id, "status_update")
        assert reply.body == "the A2A agent's task ended failed: cannot do that"
    finally:
        srv.stop()
        worker.stop()


def test_command_is_on_the_one_cli_with_env_vars_and_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from redisbus.cli import app, main

    assert "a2a" in {c.name for c in app.registered_commands}  # a typer command, not a plugin
    monkeypatch.delenv("REDISBUS_A2A_CHANNEL", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["a2a"])  # no channel: a usage error, one line
    assert e.value.code == 2
    assert "--channel" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["a2a", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for var in ("REDISBUS_A2A_CHANNEL", "REDISBUS_A2A_PORT", "REDISBUS_A2A_EXTERNAL"):
        assert var in out
    monkeypatch.setenv("REDISBUS_A2A_CHANNEL", "c")
    monkeypatch.setenv("REDISBUS_A2A_TOKENS", '{"t": "alice"}')
    monkeypatch.setenv("REDISBUS_A2A_EXTERNAL", "ok=http://127.0.0.1:1,ftp://nowhere")
    with pytest.raises(SystemExit) as e:
        main(["a2a"])  # the environment's second external is refused: bad input
    assert e.value.code == 2
    assert "ftp://nowhere" in capsys.readouterr().err
