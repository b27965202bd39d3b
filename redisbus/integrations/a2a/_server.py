"""The bridge as one ASGI app: cards and JSON-RPC per member, bearer tokens, external agents.

GET  /agents                                        the members, with their card URLs
GET  /agents/{member}/.well-known/agent-card.json   the member's A2A card (public; also at
                                                    the 0.3 path .well-known/agent.json)
POST /agents/{member}/                              A2A JSON-RPC (1.0; 0.3 method names too)
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from a2a.auth.user import UnauthenticatedUser, User
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.response_helpers import build_error_response
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH, VERSION_HEADER
from a2a.utils.errors import ContentTypeNotSupportedError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ... import AsyncBus, BusSettings
from ..._validate import agent_name, channel_name
from ._convert import card_for, card_json
from ._inbound import BusRequestHandler, Named
from ._outbound import External, Forwarder

__all__ = ["BridgeConfig", "build_app"]

log = logging.getLogger("redisbus.a2a")


@dataclass
class BridgeConfig:
    """What ``redisbus a2a`` serves. ``tokens`` maps each caller's bearer token to the member
    name it speaks as on the channel."""

    channel: str
    tokens: Mapping[str, str] = field(default_factory=dict)
    public_url: str = "http://127.0.0.1:8700"
    externals: Sequence[External] = ()
    settings: BusSettings | None = None
    replica: str | None = None
    send_wait_s: float = 30.0

    def __post_init__(self) -> None:
        channel_name(self.channel)
        for name in self.tokens.values():
            agent_name(name)
        self.public_url = self.public_url.rstrip("/")


CARD_MAX_AGE_S = 60  # a member's card changes only when it joins again
LEGACY_CARD_PATH = "/.well-known/agent.json"  # where A2A 0.3 clients look


def _bearer(request: Request, tokens: Mapping[str, str]) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        return None
    found = None
    for known, name in tokens.items():  # constant time per token: no early exit
        if hmac.compare_digest(known.encode(), token.strip().encode()):
            found = name
    return found


class _Context(DefaultServerCallContextBuilder):
    def __init__(self, tokens: Mapping[str, str]) -> None:
        self.tokens = tokens

    def build(self, request: Request) -> ServerCallContext:
        ctx = super().build(request)
        ctx.state["member"] = request.path_params.get("member", "")
        headers = ctx.state.get("headers")
        if isinstance(headers, dict):
            headers.pop("authorization", None)  # never keep the token around
        return ctx

    def build_user(self, request: Request) -> User:
        name = _bearer(request, self.tokens)
        return Named(name) if name is not None else UnauthenticatedUser()


def build_app(config: BridgeConfig, bus: AsyncBus | None = None) -> Starlette:
    """The bridge's ASGI app. It connects (``bus``, else from ``config.settings``) when it
    starts and closes what it opened when it stops."""
    state: dict[str, Any] = {}

    def card_url(name: str) -> str:
        return f"{config.public_url}/agents/{quote(name, safe='')}"

    async def card(request: Request) -> Response:
        ch = state["channel"]
        name = request.path_params["member"]
        members = await ch.members()
        if name not in members:
            return JSONResponse({"error": f"no member {name!r} on {ch.name!r}"}, status_code=404)
        # a 0.3 client asks at the 0.3 path, or says so in A2A-Version
        v0_3 = request.url.path.endswith(LEGACY_CARD_PATH) or request.headers.get(
            VERSION_HEADER, ""
        ).startswith("0.")
        body = json.dumps(card_json(card_for(members[name], ch.name, card_url(name)), v0_3=v0_3))
        headers = {
            "Cache-Control": f"public, max-age={CARD_MAX_AGE_S}",
            "ETag": '"' + hashlib.sha256(body.encode()).hexdigest()[:32] + '"',
        }
        if request.headers.get("if-none-match") == headers["ETag"]:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    async def directory(request: Request) -> Response:
        members = await state["channel"].members()
        return JSONResponse(
            [
                {
                    "name": n,
                    "status": m.status,
                    "url": card_url(n),
                    "card": card_url(n) + AGENT_CARD_WELL_KNOWN_PATH,
                }
                for n, m in members.items()
            ]
        )

    async def rpc(request: Request) -> Response:
        if _bearer(request, config.tokens) is None:
            # A2A leaves authentication to HTTP: 401 with the scheme the card declares
            return JSONResponse(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "unauthenticated: a bearer token"},
                },
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="redisbus"'},
            )
        content_type = request.headers.get("content-type", "").partition(";")[0].strip()
        if content_type.lower() != "application/json":  # JSON-RPC over HTTP is JSON only
            return JSONResponse(
                build_error_response(
                    None,
                    ContentTypeNotSupportedError(
                        f"JSON-RPC requests are application/json, not {content_type!r}"
                    ),
                ),
                status_code=415,
            )
        response: Response = await state["dispatcher"].handle_requests(request)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        owned = bus is None
        b = bus if bus is not None else AsyncBus.from_settings(config.settings)
        ch = await b.channel(config.channel)
        replica = config.replica or f"{b.settings.host}/a2a"
        handler = BusRequestHandler(ch, replica=replica, send_wait_s=config.send_wait_s)
        state["channel"] = ch
        state["dispatcher"] = JsonRpcDispatcher(
            handler, context_builder=_Context(config.tokens), enable_v0_3_compat=True
        )
        forwarder = Forwarder(ch, replica=replica)
        for ext in config.externals:
            await forwarder.add(ext)
        try:
            yield
        finally:
            await forwarder.aclose()
            if owned:
                await b.aclose()

    well_known = AGENT_CARD_WELL_KNOWN_PATH
    return Starlette(
        routes=[
            Route("/agents", directory, methods=["GET"]),
            Route("/agents/{member}" + well_known, card, methods=["GET"]),
            Route("/agents/{member}" + LEGACY_CARD_PATH, card, methods=["GET"]),
            Route("/agents/{member}", rpc, methods=["POST"]),
            Route("/agents/{member}/", rpc, methods=["POST"]),
        ],
        lifespan=lifespan,
    )
