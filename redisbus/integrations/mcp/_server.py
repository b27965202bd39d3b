"""The MCP side: the ``MCPServer`` with the six tools, argument checking, client logging, and
the two transports (stdio, and streamable HTTP behind an optional bearer token)."""

from __future__ import annotations

import contextlib
import functools
import hmac
import re
import sys
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, Literal, ParamSpec

import anyio
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp.types import CallToolResult, EmptyResult, SetLevelRequestParams, TextContent
from pydantic import Field

from ... import AsyncBus, BusSettings, InvalidInput, __version__
from ..._model import SEND_TYPES
from ._exposure import check_exposure
from ._schema import (
    FRAMING,
    TOOL_NAMES,
    WAIT_DEFAULT_S,
    WAIT_MAX_S,
    DiscoverOut,
    DoneOut,
    MessagesOut,
    SendOut,
    WaitOut,
    descriptions,
)
from ._tools import AgentTools, Card, dump, log_sink

P = ParamSpec("P")

Transport = Literal["stdio", "streamable-http", "http"]  # "http" is short for streamable HTTP

# RFC 5424 severities, least severe first (MCP's logging levels)
LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
DEFAULT_CLIENT_LOG_LEVEL = "warning"  # until the client sends logging/setLevel
MAX_SESSIONS = 1024  # log levels remembered

TYPED = re.compile(r"[a-z_]+: ")  # a refusal's typed reason, e.g. "rate_limited: "


def _bounded(description: str, least: float, most: float) -> Any:
    """A numeric tool argument's schema: its description and its inclusive bounds."""
    return Field(description=description, json_schema_extra={"minimum": least, "maximum": most})


Since = Annotated[str | None, Field(description="ISO-8601 time or message id")]


def _result(value: Mapping[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(text=dump(value))], structured_content=dict(value))


class Gate:
    """Server middleware: refuses unknown tool arguments, keeps each session's client log level
    (``logging/setLevel``) and sends a tool call's log notifications to its own session."""

    def __init__(self, schemas: Mapping[str, set[str]]) -> None:
        self.schemas = schemas
        self.levels: dict[str, int] = {}

    @staticmethod
    def session_key(ctx: ServerRequestContext[Any, Any]) -> str:
        headers = getattr(ctx.request, "headers", None)  # HTTP: a Starlette request; stdio: none
        return str(headers.get("mcp-session-id", "")) if headers is not None else ""

    async def set_level(
        self, ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams
    ) -> EmptyResult:
        key = self.session_key(ctx)
        self.levels.pop(key, None)
        self.levels[key] = LEVELS.index(params.level)
        while len(self.levels) > MAX_SESSIONS:  # sessions of HTTP clients long gone
            del self.levels[next(iter(self.levels))]
        return EmptyResult()

    def sink(self, ctx: ServerRequestContext[Any, Any]) -> Callable[[str, str], Awaitable[None]]:
        threshold = self.levels.get(self.session_key(ctx), LEVELS.index(DEFAULT_CLIENT_LOG_LEVEL))

        async def send(level: str, text: str) -> None:
            if LEVELS.index(level) < threshold:
                return
            # Deprecated in the 2026-07-28 protocol (SEP-2577), where the SDK filters by the
            # request's own opt-in; the handshake versions clients speak today still use it.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MCPDeprecationWarning)
                note = ctx.session.send_log_message(
                    level,  # type: ignore[arg-type]
                    text,
                    logger="redisbus",
                    related_request_id=ctx.request_id,
                )
            with contextlib.suppress(Exception):  # a log line must never fail its call
                await note

        return send

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> Any:
        if ctx.method != "tools/call" or not isinstance(ctx.params, Mapping):
            return await call_next(ctx)
        name = ctx.params.get("name")
        args = ctx.params.get("arguments") or {}
        sink = self.sink(ctx)
        known = self.schemas.get(name) if isinstance(name, str) else None
        if known is not None and isinstance(args, Mapping):
            unknown = sorted(str(k) for k in args if k not in known)
            if unknown:
                text = (
                    f"invalid_input: {name} has no argument{'s' if len(unknown) > 1 else ''} "
                    f"{', '.join(repr(u) for u in unknown)}; it takes "
                    f"{', '.join(sorted(known)) or 'none'}"
                )
                await sink("info", f"{name} refused: {text}")
                return CallToolResult(content=[TextContent(text=text)], is_error=True)
        token = log_sink.set(sink)
        try:
            result: HandlerResult = await call_next(ctx)
        finally:
            log_sink.reset(token)
        # the handler's result, already serialised by the SDK (wire field names)
        d = result.model_dump(by_alias=True) if isinstance(result, CallToolResult) else result
        if not isinstance(d, Mapping):
            return result
        if not d.get("isError"):
            await sink("debug", f"{name} done")
            return result
        content = list(d.get("content") or [])
        text = str(content[0].get("text", "")) if content else ""
        # The SDK heads a tool's error with "Error executing tool NAME: "; ours start with
        # their typed reason ("inbox_full: ..."), and that is what a model should read first.
        head = f"Error executing tool {name}: "
        if text.startswith(head) and TYPED.match(text, len(head)):
            text = text[len(head) :]
            result = {**d, "content": [{**content[0], "text": text}, *content[1:]]}
        await sink("info", f"{name} refused: {text}")
        return result


def build_server(tools: AgentTools, *, log_level: str = "WARNING") -> MCPServer[Any]:
    """An ``MCPServer`` with the six tools bound to ``tools.agent``."""
    agent = tools.agent

    async def agent_send_message(
        to: Annotated[
            str | list[str], Field(description="a name, 'parent', a list of names, or 'all'")
        ],
        message: Annotated[str, Field(description="the body (UTF-8 text)")],
        subject: Annotated[str, Field(description="a short subject line")] = "",
        type: Annotated[
            str, Field(description="kind of message", json_schema_extra={"enum": list(SEND_TYPES)})
        ] = "message",
        priority: Annotated[int, _bounded("0 normal, 1 high, 2 urgent", 0, 2)] = 0,
        reply_to: Annotated[str | None, Field(description="id of the message this answers")] = None,
    ) -> Annotated[CallToolResult, SendOut]:
        sent = tools.send_message_out(
            to, message, subject=subject, type=type, priority=priority, reply_to=reply_to
        )
        return _result(await sent)

    async def agent_read_messages(
        filter_by: Annotated[
            str, Field(description="e.g. 'unread', 'all', 'from:NAME to:me'")
        ] = "unread",
        since: Since = None,
        limit: Annotated[int, _bounded("most messages to return", 1, 10000)] = 20,
    ) -> Annotated[CallToolResult, MessagesOut]:
        return _result(await tools.read_messages_out(filter_by, since, limit))

    async def agent_list_messages(
        filter_by: Annotated[
            str, Field(description="e.g. 'all', 'unread', 'subject:draft'")
        ] = "all",
        since: Since = None,
        limit: Annotated[int, _bounded("most headers to return", 1, 10000)] = 50,
    ) -> Annotated[CallToolResult, MessagesOut]:
        return _result(await tools.list_messages_out(filter_by, since, limit))

    async def agent_mark_done(
        message_id: Annotated[str | list[str], Field(description="a message id or a list of ids")],
        result: Annotated[str, Field(description="short note for the sender's receipt")] = "ok",
    ) -> Annotated[CallToolResult, DoneOut]:
        return _result(await tools.mark_done_out(message_id, result))

    async def agent_wait(
        timeout: Annotated[
            float, _bounded(f"seconds to wait, 0..{WAIT_MAX_S:g}", 0, WAIT_MAX_S)
        ] = WAIT_DEFAULT_S,
        cursor: Annotated[
            str | None,
            Field(description="the cursor of your previous agent_wait result, to resume it"),
        ] = None,
        ctx: Context[Any, Any] | None = None,
    ) -> Annotated[CallToolResult, WaitOut]:
        async def progress(elapsed: float, total: float) -> None:
            if ctx is not None:
                await ctx.report_progress(elapsed, total, "waiting for messages")

        return _result(await tools.wait_out(timeout, cursor, progress))

    async def agent_discover(
        query: Annotated[str, Field(description="words describing the help you need")] = "",
        limit: Annotated[int, _bounded("most agents to return", 1, 10000)] = 10,
    ) -> Annotated[CallToolResult, DiscoverOut]:
        return _result(await tools.discover_out(query, limit))

    fns = (
        agent_send_message,
        agent_read_messages,
        agent_list_messages,
        agent_mark_done,
        agent_wait,
        agent_discover,
    )
    assert tuple(f.__name__ for f in fns) == TOOL_NAMES
    desc = descriptions(agent)
    registered = [Tool.from_function(f, name=f.__name__, description=desc[f.__name__]) for f in fns]
    for t in registered:
        # unknown arguments are refused (Gate); the schema a client sees says so too
        t.parameters["additionalProperties"] = False
    server: MCPServer[Any] = MCPServer(
        name="redisbus",
        version=__version__,
        title=f"redisbus agent {agent.name}",
        instructions=(
            f"You are agent '{agent.name}' on the redisbus channel '{agent.channel.name}'. "
            "Use agent_wait or agent_read_messages to see what other agents sent you, "
            "agent_send_message to write to them, agent_mark_done when a message is handled, "
            f"and agent_discover to find who can help. {FRAMING}"
        ),
        tools=registered,
        log_level=log_level,  # type: ignore[arg-type]
    )
    schemas = {t.name: set(t.parameters.get("properties", {})) for t in registered}
    gate = Gate(schemas)
    server.middleware.append(gate)
    # MCPServer has no public hook for logging/setLevel (the 2026-07-28 protocol drops it, and
    # the SDK warns on the low-level constructor's argument); registering the handler also makes
    # the server declare the logging capability in its initialize result.
    server._lowlevel_server.add_request_handler(
        "logging/setLevel", SetLevelRequestParams, gate.set_level
    )
    return server


# -- running ------------------------------------------------------------------------------------


class BearerAuth:
    """ASGI wrapper: every HTTP request must carry ``Authorization: Bearer <token>``; others
    get 401. Compared in constant time; the token never appears in a response or a log."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan: the session manager starts there
            await self.app(scope, receive, send)
            return
        got = b""
        for k, v in scope.get("headers", ()):
            if k.lower() == b"authorization":
                scheme, _, got = bytes(v).partition(b" ")
                if scheme.lower() != b"bearer":
                    got = b""
                break
        if got and hmac.compare_digest(got.strip(), self._token):
            await self.app(scope, receive, send)
            return
        body = dump(
            {
                "jsonrpc": "2.0",
                "id": None,
                "error": {
                    "code": -32001,
                    "message": "unauthorized: a valid bearer token is needed",
                },
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"www-authenticate", b'Bearer realm="redisbus-mcp"'),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


async def _serve_http(
    server: MCPServer[Any], host: str, port: int, token: str | None, log_level: str
) -> None:
    import uvicorn  # only the HTTP transport needs it

    # the SDK turns on DNS-rebinding protection (Host/Origin checks) for loopback hosts
    app: Any = server.streamable_http_app(host=host)
    if token:
        app = BearerAuth(app, token)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower())
    await uvicorn.Server(config).serve()


async def serve_async(
    channel: str,
    as_name: str,
    parent: str | None = None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    url: str | None = None,
    description: str = "",
    skills: Sequence[str] = (),
    *,
    log_level: str = "WARNING",
    token: str | None = None,
    settings: BusSettings | None = None,
) -> None:
    """Join ``channel`` as ``as_name`` and serve the tools until the client goes away."""
    if transport not in ("stdio", "streamable-http", "http"):
        raise InvalidInput(f"unknown transport {transport!r}: stdio or http")
    check_exposure(transport, host, token)
    settings = settings or BusSettings()
    if not (url or settings.url or settings.data_dir):
        print(
            "redisbus mcp: no REDISBUS_URL, so this agent lives on a private embedded Redis "
            "that no other process can reach (REDISBUS_DATA_DIR=DIR shares one between "
            "processes)",
            file=sys.stderr,
        )
    bus = AsyncBus.from_url(url, settings=settings) if url else AsyncBus.from_settings(settings)
    try:
        ch = await bus.channel(channel)
        agent = await ch.join(as_name, parent=parent, description=description, skills=list(skills))
        tools = AgentTools(agent, Card(description, tuple(skills)))
        server = build_server(tools, log_level=log_level)
        try:
            if transport == "stdio":
                await server.run_stdio_async()
            else:
                await _serve_http(server, host, port, token, log_level)
        finally:
            await tools.agent.close()
    finally:
        await bus.aclose()


def _blocking(serve: Callable[P, Awaitable[None]]) -> Callable[P, None]:
    """The blocking form of an async entry point: the same arguments, run in a loop of its own."""

    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        anyio.run(functools.partial(serve, *args, **kwargs))

    run.__doc__ = f"Blocking form of :func:`{serve.__name__}`, with the same arguments."
    return run


serve = _blocking(serve_async)  # what ``redisbus mcp`` runs
