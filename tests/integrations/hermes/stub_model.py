"""A scripted OpenAI-compatible chat server for driving real Hermes agents in tests.

Standard library only. It listens on 127.0.0.1 (a free port), serves

- ``GET /v1/models`` with one model (``stub-model``, with a context length, so Hermes does
  not spend seconds probing other endpoints), 404 for any other ``GET``;
- ``POST /v1/chat/completions``: asks a *script* what to answer, then streams it as
  server-sent events the way OpenAI does (role delta, content pieces, tool-call deltas with
  the arguments split over several chunks, a ``finish_reason`` chunk, a usage chunk with
  ``choices: []``, ``data: [DONE]``). A non-streaming request gets one ``chat.completion``.

A script is a callable ``respond(request_json) -> list of actions``, where an action is
``text("...")`` (a final reply) or ``tool_call(name, **arguments)`` (one or more per reply).
``Conversation(request_json)`` tells a parent from a subagent (Hermes builds a child's system
prompt from "You are a focused subagent working on a specific delegated task.") and exposes
what the script usually decides on: the goal (0.19 puts it in that system prompt after
``YOUR TASK:\\n``; 0.20+ makes it the child's first user message), the user messages, the
tool results so far.

Hermes 0.20+ hides plugin tools behind tool search (the request offers ``tool_search``,
``tool_describe``, ``tool_call``). By default the stub then routes a scripted call of a tool
the request does not offer through ``tool_call``, in the shape that request's ``tool_call``
schema advertises (a model that knows the bridge), and ``Conversation.tool_calls`` reads
such calls back as calls of the underlying tool. ``StubModel(script, bridge=False)`` sends
exactly what the script says (a model that knows only what it was told).

The server is threaded (subagents run in parallel) and records every request, so a test can
assert on exactly what each model call saw.
"""

from __future__ import annotations

import json
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL_ID = "stub-model"
CONTEXT_LENGTH = 131072
CHILD_PROMPT_MARK = "You are a focused subagent working on a specific delegated task."
HOOK_TEXT_MARK = "\n\n[agent_channel]"  # where the plugin's turn text starts in a user message
BRIDGE_CALL = "tool_call"  # Hermes 0.20+'s tool search: invokes a deferred tool

Action = dict[str, Any]
Script = Callable[[dict[str, Any]], list[Action]]


def text(content: str) -> Action:
    """A final assistant reply."""
    return {"type": "text", "content": content}


def tool_call(name: str, /, **arguments: Any) -> Action:
    """One tool call; several in one reply are parallel tool calls."""
    return {"type": "tool_call", "name": name, "arguments": arguments}


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


@dataclass
class Conversation:
    """Read-only view of one chat request, for scripts."""

    request: dict[str, Any]
    messages: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.messages = list(self.request.get("messages") or [])

    @property
    def system(self) -> str:
        return "\n".join(
            _content_text(m.get("content")) for m in self.messages if m.get("role") == "system"
        )

    @property
    def is_child(self) -> bool:
        return CHILD_PROMPT_MARK in self.system

    @property
    def goal(self) -> str | None:
        """The delegated goal of a subagent (None for a parent), wherever Hermes put it."""
        if not self.is_child:
            return None
        m = re.search(
            r"YOUR TASK:\n(.*?)(?:\n\nCONTEXT:|\n\nWORKSPACE PATH:|\n\nComplete this)",
            self.system,
            re.S,
        )
        if m:  # Hermes 0.19
            return m.group(1).strip()
        users = self.user_messages
        if not users:
            return None
        # Hermes 0.20+: the first user message; a pre_llm_call hook's text follows it
        return users[0].split(HOOK_TEXT_MARK, 1)[0].strip()

    @property
    def user_messages(self) -> list[str]:
        return [_content_text(m.get("content")) for m in self.messages if m.get("role") == "user"]

    @property
    def last_user(self) -> str:
        users = self.user_messages
        return users[-1] if users else ""

    @property
    def tool_results(self) -> list[str]:
        """Contents of the tool-result messages so far, oldest first."""
        return [_content_text(m.get("content")) for m in self.messages if m.get("role") == "tool"]

    @property
    def raw_tool_calls(self) -> list[dict[str, Any]]:
        """Tool calls the assistant made so far, as sent: ``{"name", "arguments" (dict)}``."""
        out = []
        for m in self.messages:
            for tc in m.get("tool_calls") or []:
                fn = tc.get("function") or {}
                try:
                    args = json.loads(fn.get("arguments") or "{}")
                except ValueError:
                    args = {"_raw": fn.get("arguments")}
                out.append({"name": fn.get("name"), "arguments": args})
        return out

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """Tool calls made so far, a ``tool_call`` bridge call read as its underlying call
        (``"via": "tool_call"``)."""
        out: list[dict[str, Any]] = []
        for call in self.raw_tool_calls:
            if call["name"] == BRIDGE_CALL:
                out.extend({**inner, "via": BRIDGE_CALL} for inner in unwrap_bridge(call))
            else:
                out.append(call)
        return out

    @property
    def tool_names(self) -> list[str]:
        return sorted(
            {(t.get("function") or {}).get("name", "") for t in self.request.get("tools") or []}
        )

    def tool_schema(self, name: str) -> dict[str, Any] | None:
        """The function schema the request offers under ``name``."""
        for t in self.request.get("tools") or []:
            fn = t.get("function") or {}
            if fn.get("name") == name:
                return dict(fn)
        return None

    def call(self, name: str, /, **arguments: Any) -> Action:
        """A call of ``name``: direct when the request offers it, else through the tool
        search bridge when the request offers ``tool_call``."""
        if name in self.tool_names or BRIDGE_CALL not in self.tool_names:
            return tool_call(name, **arguments)
        return bridge_call(self.tool_schema(BRIDGE_CALL) or {}, name, arguments)


def bridge_call(schema: dict[str, Any], name: str, arguments: dict[str, Any]) -> Action:
    """``tool_call`` of ``name`` in the shape ``schema`` (the request's ``tool_call``) takes:
    ``calls=[{name, arguments}]`` (iot) or ``name=, arguments=`` (axisrow)."""
    props = (schema.get("parameters") or {}).get("properties") or {}
    if "calls" in props or not props:
        return tool_call(BRIDGE_CALL, calls=[{"name": name, "arguments": arguments}])
    return tool_call(BRIDGE_CALL, name=name, arguments=arguments)


def unwrap_bridge(call: dict[str, Any]) -> list[dict[str, Any]]:
    """The underlying ``{"name", "arguments"}`` calls of one ``tool_call`` bridge call."""
    args = call.get("arguments") or {}
    calls = args.get("calls")
    if calls is None:
        calls = [{"name": args.get("name"), "arguments": args.get("arguments")}]
    if isinstance(calls, dict):
        calls = [calls]
    out = []
    for c in calls if isinstance(calls, list) else []:
        inner = c.get("arguments") if isinstance(c, dict) else None
        if isinstance(inner, str):
            try:
                inner = json.loads(inner)
            except ValueError:
                inner = {"_raw": inner}
        out.append(
            {"name": c.get("name") if isinstance(c, dict) else None, "arguments": inner or {}}
        )
    return out


def reply_hello(_request: dict[str, Any]) -> list[Action]:
    """The trivial script: every call answers "hello"."""
    return [text("hello")]


# ---------------------------------------------------------------------------------------
# Server-sent events


def _chunk(
    cid: str, created: int, delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL_ID,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _pieces(s: str, n: int) -> list[str]:
    if not s:
        return [""]
    size = max(1, -(-len(s) // n))
    return [s[i : i + size] for i in range(0, len(s), size)]


def stream_events(actions: list[Action]) -> Iterator[dict[str, Any]]:
    """The chat.completion.chunk objects for one reply (without the final ``[DONE]``)."""
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    created = int(time.time())
    yield _chunk(cid, created, {"role": "assistant", "content": ""})
    calls = [a for a in actions if a["type"] == "tool_call"]
    for a in actions:
        if a["type"] == "text":
            for piece in _pieces(a["content"], 3):
                yield _chunk(cid, created, {"content": piece})
    for i, a in enumerate(calls):
        args = json.dumps(a["arguments"], ensure_ascii=False)
        call_id = a.get("id") or f"call_{uuid.uuid4().hex[:12]}"
        yield _chunk(
            cid,
            created,
            {
                "tool_calls": [
                    {
                        "index": i,
                        "id": call_id,
                        "type": "function",
                        "function": {"name": a["name"], "arguments": ""},
                    }
                ]
            },
        )
        for piece in _pieces(args, 2):
            yield _chunk(
                cid,
                created,
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "function": {"arguments": piece},
                        }
                    ]
                },
            )
    yield _chunk(cid, created, {}, "tool_calls" if calls else "stop")
    yield {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": MODEL_ID,
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def completion(actions: list[Action]) -> dict[str, Any]:
    """The non-streaming form of one reply."""
    calls = [a for a in actions if a["type"] == "tool_call"]
    content = "".join(a["content"] for a in actions if a["type"] == "text")
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": a.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": a["name"], "arguments": json.dumps(a["arguments"])},
            }
            for a in calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": MODEL_ID,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


# ---------------------------------------------------------------------------------------
# The server


class StubModel:
    """``with StubModel(script) as stub: AIAgent(base_url=stub.base_url, ...)``."""

    def __init__(self, script: Script = reply_hello, *, bridge: bool = True) -> None:
        self.script = script
        self.bridge = bridge
        self.requests: list[dict[str, Any]] = []
        self.replies: list[list[Action]] = []
        self.errors: list[str] = []
        self.probes: list[str] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> StubModel:
        stub = self

        class Handler(_Handler):
            pass

        Handler.stub = stub
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="stub-model", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> StubModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- called by the handler
    def decide(self, request: dict[str, Any]) -> list[Action]:
        try:
            actions = list(self.script(request))
            if not actions:
                raise ValueError("script returned no actions")
            for a in actions:
                if a.get("type") not in ("text", "tool_call"):
                    raise ValueError(f"bad action {a!r}")
            if self.bridge:
                c = Conversation(request)
                actions = [
                    c.call(a["name"], **a["arguments"]) if a["type"] == "tool_call" else a
                    for a in actions
                ]
        except Exception:
            err = traceback.format_exc()
            with self._lock:
                self.errors.append(err)
            actions = [text("stub script error: " + err.strip().splitlines()[-1])]
        with self._lock:
            self.requests.append(request)
            self.replies.append(actions)
        return actions


class _Handler(BaseHTTPRequestHandler):
    stub: StubModel
    protocol_version = "HTTP/1.0"  # one response per connection; SSE ends with the close

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": MODEL_ID,
                            "object": "model",
                            "owned_by": "stub",
                            "context_length": CONTEXT_LENGTH,
                        }
                    ],
                },
            )
            return
        with self.stub._lock:
            self.stub.probes.append("GET " + self.path)
        self._json(404, {"error": {"message": "not found", "type": "not_found"}})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path != "/v1/chat/completions":
            with self.stub._lock:
                self.stub.probes.append("POST " + self.path)
            self._json(404, {"error": {"message": "not found", "type": "not_found"}})
            return
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            self._json(400, {"error": {"message": "bad json", "type": "invalid_request"}})
            return
        actions = self.stub.decide(request)
        if not request.get("stream"):
            self._json(200, completion(actions))
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            for event in stream_events(actions):
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass
