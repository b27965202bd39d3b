"""The A2A bridge both ways: an A2A client calls a bus member, a bus member calls an A2A agent.

Runs `redisbus a2a` (a separate process) for the channel, with one caller token for "alice"
and an external A2A agent (a tiny a2a-sdk server started here) added as member "echo-agent".

    pip install 'redisbus[a2a]'
    REDISBUS_URL=redis://localhost:6379/0 python examples/a2a_bridge.py
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import httpx
import uvicorn
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from starlette.applications import Starlette

from redisbus import Bus
from redisbus.embedded import free_port

CHANNEL = f"example-a2a-{uuid.uuid4().hex[:6]}"


class Echo(AgentExecutor):
    """The external A2A agent: answers every message with one text message."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message(f"echo: {context.get_user_input()}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError


def serve_echo(port: int) -> uvicorn.Server:
    card = AgentCard(
        name="Echo Agent",
        description="repeats what it is told",
        version="1.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="echoes", tags=["echo"])],
    )
    handler = DefaultRequestHandler(Echo(), InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    return server


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing answers at {url}")
        time.sleep(0.05)


async def call_bob(bridge: str) -> str:
    """The inbound way: an a2a-sdk client, authenticated as alice, asks bus member bob."""
    async with httpx.AsyncClient(headers={"Authorization": "Bearer alice-token"}) as http:
        card = await A2ACardResolver(http, f"{bridge}/agents/bob").get_agent_card()
        print(f"[a2a client] card of {card.name}: {card.description!r}")
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        msg = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text="hi")])
        async for event in client.send_message(SendMessageRequest(message=msg)):
            status = event.task.status
            return f"{TaskState.Name(status.state)}: {status.message.parts[0].text}"
    return "no answer"


def main() -> None:
    url = os.environ.get("REDISBUS_URL")
    bus = Bus.from_url(url) if url else Bus.embedded()
    ch = bus.channel(CHANNEL)
    bob = ch.join("bob", description="a bus member that greets", skills=["greeting"])

    echo_port, bridge_port = free_port(), free_port()
    echo = serve_echo(echo_port)
    bridge = f"http://127.0.0.1:{bridge_port}"
    env = dict(os.environ, REDISBUS_URL=str(bus.url))
    env["REDISBUS_A2A_TOKENS"] = json.dumps({"alice-token": "alice"})
    external = f"http://127.0.0.1:{echo_port}"
    cmd = ["redisbus", "a2a", "--channel", CHANNEL, "--port", str(bridge_port)]
    cmd += ["--external", external]
    print("$", " ".join(cmd))
    proc = subprocess.Popen([sys.executable, "-m", "redisbus.cli", *cmd[1:]], env=env)
    try:
        wait_http(f"{bridge}/agents/bob/.well-known/agent-card.json")

        def bob_answers() -> None:
            for m in bob.wait(timeout=10).messages:
                print(f"[bus] bob got {m.body!r} from {m.sender} (the token's name)")
                bob.send(m.sender, "hello from the bus", reply_to=m.id, type="response")
                bob.mark_done(m)

        t = threading.Thread(target=bob_answers)
        t.start()
        print("[a2a client] task", asyncio.run(call_bob(bridge)))
        t.join()

        # the outbound way: the external agent is a member; bob talks to it on the bus
        while "echo-agent" not in ch.members():
            time.sleep(0.05)
        sent = bob.send("echo-agent", "are you there?")
        reply = bob.wait(timeout=10).messages[0]
        print(
            f"[bus] {reply.sender} replied {reply.body!r} (reply_to matches: "
            f"{reply.reply_to == sent.id})"
        )
    finally:
        proc.terminate()
        proc.wait(10)
        echo.should_exit = True
        bus.close()


if __name__ == "__main__":
    main()
