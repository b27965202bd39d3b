"""Outbound: an external A2A agent joins a channel as a member.

The bridge fetches the agent's card from its URL, joins a member under the card's name (its
description and skills become the member's card), and serves that member: each message to it
is sent to the agent through the a2a-sdk client, and the agent's answer comes back on the bus
as a message from the member with ``reply_to`` set; then the original is marked done. The
answer goes through the ordinary send path, so every limit of the channel applies to it.

Each external agent has its own headers (e.g. ``Authorization: Bearer ...`` for a Hermes
gateway with ``A2A_PEER_TOKENS``) and its own ``timeout_s``: how long one answer may take,
which is also the HTTP read timeout (Hermes's ``SendMessage`` holds the request open for its
whole turn); a task answered ``working`` is polled until then. Every request carries the W3C
``traceparent`` of the message it forwards. An empty completed answer (a peer that was not
ready yet) is asked again, and reported as a failure if it stays empty, never posted.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.client import Client
from a2a.types.a2a_pb2 import (
    AgentCard,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
)

from ... import AsyncAgent, AsyncChannel, LimitExceeded, RedisbusError
from ... import Message as BusMessage
from ... import _otel as otel
from ..._outage import Outage
from ._convert import TERMINAL, external_name

__all__ = [
    "TASK_WAIT_S",
    "External",
    "Forwarder",
    "answer_text",
    "fetch_card",
    "load_external_auth",
    "with_auth",
]

log = logging.getLogger("redisbus.a2a")

TASK_WAIT_S = 300.0  # default: how long an external agent's answer may take
CONNECT_S = 10.0
REPLY_RETRIES = 3  # a reply refused by a rate limit is retried after retry_after_s
EMPTY_RETRIES = 3  # an empty completed answer (peer not ready) is asked again, 1 s, 2 s, 4 s

# the trace context of the message being forwarded, for the request hook
_trace: contextvars.ContextVar[str | None] = contextvars.ContextVar("redisbus_a2a_trace")


@dataclass(frozen=True)
class External:
    """An external A2A agent to add: its base URL (the card is at the well-known path below
    it), the member name (default: from the card), its parent, extra HTTP headers (keep
    tokens out of command lines: see ``load_external_auth``), and how long one answer may
    take."""

    url: str
    name: str | None = None
    parent: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = TASK_WAIT_S

    def __repr__(self) -> str:  # headers hold credentials: never in logs or tracebacks
        return f"External(url={self.url!r}, name={self.name!r}, parent={self.parent!r})"


def load_external_auth(text: str) -> dict[str, dict[str, str]]:
    """``{"NAME or URL": "TOKEN" | {"Header": "value"}}`` (JSON) -> headers per external.

    A string is a bearer token; an object is sent as headers as they are. Keys are an
    ``--external``'s NAME (of ``NAME=URL``) or its URL."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg} (line {e.lineno})") from None
    if not isinstance(raw, dict):
        raise ValueError('want a JSON object {"NAME or URL": "TOKEN" or {"Header": "value"}}')
    out: dict[str, dict[str, str]] = {}
    for key, value in raw.items():
        if isinstance(value, str) and value:
            out[key] = {"Authorization": f"Bearer {value}"}
        elif isinstance(value, dict) and all(
            isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
        ):
            out[key] = dict(value)
        else:
            raise ValueError(f"{key!r}: want a token (string) or headers (object of strings)")
    return out


def with_auth(externals: list[External], auth: Mapping[str, Mapping[str, str]]) -> list[External]:
    """Each external with the headers ``auth`` has for its name or URL. A key that matches
    no external is an error (a typo would otherwise send no token)."""
    used: set[str] = set()
    out = []
    for ext in externals:
        headers = dict(ext.headers)
        for key in (ext.url, ext.url.rstrip("/"), ext.name):
            if key and key in auth:
                headers.update(auth[key])
                used.add(key)
        out.append(External(ext.url, ext.name, ext.parent, headers, ext.timeout_s))
    unknown = sorted(set(auth) - used)
    if unknown:
        raise ValueError(f"no --external named or at {', '.join(map(repr, unknown))}")
    return out


async def _add_traceparent(request: httpx.Request) -> None:
    trace = _trace.get(None)
    if trace and "traceparent" not in request.headers:
        parent, _, state = trace.partition(" ")
        request.headers["traceparent"] = parent
        if state:
            request.headers["tracestate"] = state


def _trace_of(span: Any, m: BusMessage) -> str:
    """The forwarded request's trace context: the process span's when tracing, else the
    sender's (the message's ``trace`` field)."""
    if span is not None:
        header = otel.header_of(span)
        if header:
            return header
    if m.trace:
        return m.trace
    # no trace to continue: a fresh, unsampled one still lets both sides' logs be joined
    return f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-00"


async def fetch_card(http: httpx.AsyncClient, url: str) -> AgentCard:
    return await A2ACardResolver(http, url).get_agent_card()


def answer_text(result: Task | Message) -> tuple[bool, str]:
    """(ok, text) from what an A2A agent returned: a message, or a finished task's status
    message and artifacts."""
    if isinstance(result, Message):
        return True, "\n".join(p.text for p in result.parts if p.text)
    texts = [p.text for a in result.artifacts for p in a.parts if p.text]
    status = "\n".join(p.text for p in result.status.message.parts if p.text)
    ok = result.status.state == TaskState.TASK_STATE_COMPLETED
    if not ok:
        name = TaskState.Name(result.status.state).removeprefix("TASK_STATE_").lower()
        return False, f"the A2A agent's task ended {name}" + (f": {status}" if status else "")
    return True, "\n".join(texts) if texts else status


class _Served:
    def __init__(self, agent: AsyncAgent, client: Client, card: AgentCard, wait_s: float) -> None:
        self.agent, self.client, self.card, self.wait_s = agent, client, card, wait_s
        self.contexts: dict[str, str] = {}  # bus sender -> A2A context id (one conversation)


def http_client(ext: External) -> httpx.AsyncClient:
    """The HTTP client for one external agent: its headers, its timeout, traceparent."""
    return httpx.AsyncClient(
        headers=dict(ext.headers),
        timeout=httpx.Timeout(ext.timeout_s, connect=min(CONNECT_S, ext.timeout_s)),
        event_hooks={"request": [_add_traceparent]},
    )


class Forwarder:
    """Serves the members that stand for external A2A agents on one channel."""

    def __init__(self, channel: AsyncChannel, *, replica: str, poll_s: float = 1.0) -> None:
        self.channel, self.replica, self.poll_s = channel, replica, poll_s
        self._stop = asyncio.Event()
        self._runs: list[asyncio.Task[None]] = []
        self._clients: list[httpx.AsyncClient] = []

    async def add(self, ext: External) -> AsyncAgent:
        """Fetch the card, join its member, start forwarding. Returns the member handle."""
        http = http_client(ext)
        self._clients.append(http)
        card = await fetch_card(http, ext.url)
        skills = [external_name(s.name or s.id) for s in card.skills][:32]
        agent = await self.channel.join(
            ext.name or external_name(card.name),
            parent=ext.parent,
            replica=self.replica,
            description=(card.description or card.name)[:2000],
            skills=skills,
        )
        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
        served = _Served(agent, client, card, ext.timeout_s)
        self._runs.append(asyncio.create_task(self._serve(served)))
        log.info("redisbus a2a: %s on %s is the A2A agent at %s", agent.name, self.channel, ext.url)
        return agent

    async def _serve(self, s: _Served) -> None:
        outage = Outage(f"a2a: waiting for {s.agent.name}'s messages", self.poll_s, log)
        while not self._stop.is_set():
            try:
                res = await s.agent.wait(self.poll_s, status="idle")
            except RedisbusError as e:  # an outage: one line when it starts, one when it ends
                outage.failed(e)
                await asyncio.sleep(outage.pause(self.poll_s))
                continue
            outage.succeeded()
            if res.kind == "cancelled":
                return
            for m in res.messages:
                try:
                    if m.type in ("control", "outcome"):
                        await s.agent.mark_done(m, result="not forwarded")
                    else:
                        # a process span when tracing: the reply continues the sender's trace
                        with otel.processing(s.agent, m) as span:
                            token = _trace.set(_trace_of(span, m))
                            try:
                                await self._forward(s, m)
                            finally:
                                _trace.reset(token)
                except Exception:  # left pending: redelivered after its lease
                    log.exception("redisbus a2a: forwarding %s to %s failed", m.id, s.agent.name)

    async def _forward(self, s: _Served, m: BusMessage) -> None:
        ctx = s.contexts.setdefault(m.sender, str(uuid.uuid4()))
        request = Message(
            message_id=str(uuid.uuid4()),
            role=Role.ROLE_USER,
            context_id=ctx,
            parts=[Part(text=m.body)],
        )
        request.metadata.update(
            {"redisbus_from": m.sender, "redisbus_id": m.id, "redisbus_channel": m.channel}
        )
        deadline = time.monotonic() + s.wait_s
        try:
            ok, text = await self._ask(s.client, request, deadline)
            for pause in (1.0, 2.0, 4.0)[:EMPTY_RETRIES]:
                if not ok or text.strip() or time.monotonic() + pause > deadline:
                    break
                # a peer that was not ready yet completes with nothing: ask again
                log.info(
                    "redisbus a2a: %s answered %s with nothing; asking again", s.agent.name, m.id
                )
                await asyncio.sleep(pause)
                request.message_id = str(uuid.uuid4())
                ok, text = await self._ask(s.client, request, deadline)
            if ok and not text.strip():
                ok, text = False, "the A2A agent returned an empty answer"
        except Exception as e:  # an unreachable, refusing or broken agent: the sender hears
            why = _one_line(e)
            log.warning("redisbus a2a: %s failed on %s: %s", s.agent.name, m.id, why)
            ok, text = False, f"the A2A agent {why}"
        reply_type = "response" if ok else "status_update"
        sent = await self._reply(s.agent, m, text, reply_type)
        outcome = ("replied" if ok else "failed") if sent else "reply refused"
        await s.agent.mark_done(m, result=outcome)

    async def _ask(self, client: Client, request: Message, deadline: float) -> tuple[bool, str]:
        result: Task | Message | None = None
        async for event in client.send_message(SendMessageRequest(message=request)):
            if event.HasField("message"):
                result = event.message
            elif event.HasField("task"):
                result = event.task
            elif event.HasField("status_update") and isinstance(result, Task):
                result.status.CopyFrom(event.status_update.status)
        if result is None:
            return False, "the A2A agent answered nothing"
        pause = 0.05
        while isinstance(result, Task) and result.status.state not in TERMINAL:
            if result.status.state in (
                TaskState.TASK_STATE_INPUT_REQUIRED,
                TaskState.TASK_STATE_AUTH_REQUIRED,
            ):
                break
            if time.monotonic() > deadline:
                return False, f"the A2A agent's task {result.id} did not finish in time"
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)
            result = await client.get_task(GetTaskRequest(id=result.id))
        return answer_text(result)

    async def _reply(self, agent: AsyncAgent, m: BusMessage, text: str, type: str) -> bool:
        for attempt in range(REPLY_RETRIES + 1):
            try:
                await agent.send(m.sender, text, subject=m.subject, type=type, reply_to=m.id)
                return True
            except LimitExceeded as e:
                if e.retry_after_s is None or attempt == REPLY_RETRIES:
                    log.warning("redisbus a2a: reply of %s to %s refused: %s", agent.name, m.id, e)
                    return False
                await asyncio.sleep(min(e.retry_after_s, 5.0))
            except RedisbusError as e:
                log.warning("redisbus a2a: reply of %s to %s refused: %s", agent.name, m.id, e)
                return False
        return False

    async def aclose(self) -> None:
        self._stop.set()
        for run in self._runs:
            run.cancel()
        for run in self._runs:
            with contextlib.suppress(asyncio.CancelledError):
                await run
        for http in self._clients:
            await http.aclose()


def _one_line(e: BaseException) -> str:
    """What went wrong with an external agent, in one line: a refusal names its HTTP status
    (the agent was reached: a 401 is a token it does not take), anything else its first line."""
    status = _http_status(e)
    if status is not None:
        return f"refused the request: HTTP {status}"
    first = (str(e).strip().splitlines() or [""])[0]
    return f"could not be reached: {type(e).__name__}: {first}"


def _http_status(e: BaseException) -> str | None:
    """ "401 Unauthorized from URL": the HTTP status of an httpx error in ``e`` or in what
    caused it, else None."""
    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        code = getattr(response, "status_code", None)
        if isinstance(code, int):
            reason = getattr(response, "reason_phrase", "") or ""
            url = getattr(getattr(response, "request", None), "url", "") or ""
            return f"{code} {reason} from {url}".replace("  ", " ")
        seen = seen.__cause__ or seen.__context__
    return None
