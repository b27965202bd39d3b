"""The console's web app (Starlette): two pages, a JSON API, and a server-sent event stream.

    GET  /                       the channel list            GET /api/channels
    GET  /c/{channel}            one channel's page          GET /api/snapshot?channel=C
    GET  /api/events?channel=C   server-sent events: a "snapshot" on connect and on each change
    POST /api/pause?channel=C    /api/resume?channel=C       /api/replay?channel=C&id=DEAD_ID

Read-only unless a token is configured; then the POSTs need ``Authorization: Bearer TOKEN``
(anything else is a 403). The pages are static files; the data reaches them only as JSON, and
the script puts it in the page with ``textContent``, never as markup.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .._errors import BusConnectionError, InvalidInput, RedisbusError, UnknownAgent
from ..aio import AsyncBus
from ._view import ChannelView, channel_list, open_channel

STATIC = Path(__file__).parent / "static"
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]

# the page may load only its own script and style, and talk only to this server
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class ConsoleConfig:
    token: str | None = None
    limit: int = 200  # messages on one channel's page
    stuck_after_s: float = 60.0
    block_ms: int = 1000  # XREAD BLOCK: also how soon an ack or a mark shows
    keepalive_s: float = 15.0
    allowed_hosts: tuple[str, ...] = tuple(LOOPBACK_HOSTS)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status, headers=SECURITY_HEADERS)


def _failure(e: RedisbusError) -> JSONResponse:
    if isinstance(e, UnknownAgent):
        return _error(404, e.code, str(e))
    if isinstance(e, InvalidInput):
        return _error(400, e.code, str(e))
    if isinstance(e, BusConnectionError):
        return _error(503, e.code, str(e))
    return _error(409, e.code, str(e))


def create_app(bus_factory: Callable[[], AsyncBus], config: ConsoleConfig | None = None) -> Any:
    """The ASGI app. ``bus_factory`` makes the bus when the app starts (inside its loop); the
    app closes it when it stops."""
    cfg = config or ConsoleConfig()
    state: dict[str, AsyncBus] = {}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["bus"] = bus_factory()
        try:
            yield
        finally:
            await state["bus"].aclose()

    def bus() -> AsyncBus:
        return state["bus"]

    def page(name: str) -> Callable[[Request], Awaitable[Response]]:
        """A page: the head both pages share, then ``static/NAME.html`` as its body."""
        html = (
            f'{(STATIC / "_head.html").read_text()}<body data-page="{name}">\n'
            f"{(STATIC / f'{name}.html').read_text()}"
        )

        async def serve(request: Request) -> Response:
            return HTMLResponse(html, headers=SECURITY_HEADERS)

        return serve

    def authorized(request: Request) -> JSONResponse | None:
        if cfg.token is None:
            return _error(403, "read_only", "this console is read-only (start it with --token)")
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode(), cfg.token.encode()
        ):
            return _error(403, "forbidden", "a valid 'Authorization: Bearer TOKEN' is required")
        return None

    def channel_arg(request: Request) -> str:
        name = request.query_params.get("channel")
        if not name:
            raise InvalidInput("the 'channel' query parameter is required")
        return name

    async def loaded_view(request: Request) -> ChannelView:
        ch = await open_channel(bus(), channel_arg(request))
        view = ChannelView(ch, cfg.limit, cfg.stuck_after_s)
        await view.load()
        return view

    async def channels(request: Request) -> Response:
        try:
            rows = await channel_list(bus())
        except RedisbusError as e:
            return _failure(e)
        return JSONResponse(
            {"channels": rows, "writable": cfg.token is not None}, headers=SECURITY_HEADERS
        )

    async def snapshot(request: Request) -> Response:
        try:
            view = await loaded_view(request)
            data = await view.snapshot(cfg.token is not None)
        except RedisbusError as e:
            return _failure(e)
        return JSONResponse(data, headers=SECURITY_HEADERS)

    async def events(request: Request) -> Response:
        try:
            view = await loaded_view(request)
            await view.changed()
            first = await view.snapshot(cfg.token is not None)
        except RedisbusError as e:
            return _failure(e)
        return StreamingResponse(
            _stream(request, view, first, cfg),
            media_type="text/event-stream",
            headers={**SECURITY_HEADERS, "X-Accel-Buffering": "no"},
        )

    def action(
        run: Callable[[Any, Request], Awaitable[dict[str, object]]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            refused = authorized(request)
            if refused is not None:
                return refused
            try:
                ch = await open_channel(bus(), channel_arg(request))
                return JSONResponse(await run(ch, request), headers=SECURITY_HEADERS)
            except RedisbusError as e:
                return _failure(e)

        return handle

    async def pause(ch: Any, request: Request) -> dict[str, object]:
        await ch.pause()
        return {"paused": True}

    async def resume(ch: Any, request: Request) -> dict[str, object]:
        await ch.resume()
        return {"paused": False}

    async def replay(ch: Any, request: Request) -> dict[str, object]:
        dead_id = request.query_params.get("id")
        if not dead_id:
            raise InvalidInput("the 'id' query parameter (a dead letter id) is required")
        return {"replayed": dead_id, "id": await ch.replay(dead_id)}

    routes = [
        Route("/", page("channels")),
        Route("/c/{name:path}", page("channel")),
        Route("/api/channels", channels),
        Route("/api/snapshot", snapshot),
        Route("/api/events", events),
        Route("/api/pause", action(pause), methods=["POST"]),
        Route("/api/resume", action(resume), methods=["POST"]),
        Route("/api/replay", action(replay), methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(cfg.allowed_hosts))],
    )


def _event(name: str, data: object) -> str:
    # json.dumps escapes newlines inside strings, so the payload is one "data:" line
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _stream(
    request: Request, view: ChannelView, first: dict[str, object], cfg: ConsoleConfig
) -> AsyncIterator[str]:
    """Follow the channel: block on its stream for new entries (XREAD from the last id seen),
    and after each wake-up or block timeout check the groups and marks for change; send a
    new snapshot only when something changed. Ends when the browser goes away."""
    writable = cfg.token is not None
    yield "retry: 2000\n\n" + _event("snapshot", first)
    sent = time.monotonic()
    while not await request.is_disconnected():
        try:
            grew = await view.follow(cfg.block_ms)
            moved = await view.changed()
            if grew or moved:
                yield _event("snapshot", await view.snapshot(writable))
                sent = time.monotonic()
            elif time.monotonic() - sent > cfg.keepalive_s:
                yield ": keep-alive\n\n"
                sent = time.monotonic()
        except RedisbusError as e:
            yield _event("problem", {"error": e.code, "message": str(e)})
            await asyncio.sleep(cfg.block_ms / 1000)
