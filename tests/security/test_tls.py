"""The core contract over TLS (docs/security.md#tls): a TLS-only redis-server with generated
certificates, client certificates required, reached with ``rediss://`` and the CA and client
files in ``BusSettings``; plaintext and unauthenticated clients are refused.

The contract tests are the functions of ``tests.contract.test_contract``, collected here a
second time with this module's ``make_bus``: both faces, over TLS.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from redisbus import AsyncBus, Bus, BusConnectionError, BusSettings

pytest.register_assert_rewrite("tests.support.tls_servers")

from tests.contract import test_contract  # noqa: E402
from tests.support.tls_servers import TLSServer, contract_buses  # noqa: E402

pytest_plugins = ["tests.support.tls_servers"]

# Collect every contract test here too; the fixtures below decide what they run against.
globals().update({n: f for n, f in vars(test_contract).items() if n.startswith("test_")})


@pytest.fixture
def make_bus(tls_redis: TLSServer, face: str) -> Iterator[Any]:
    """make_bus(sync=False, **settings): a Bus or AsyncBus on the TLS server, flushed first."""
    with tls_redis.client() as admin:
        admin.flushall()
    with contract_buses(tls_redis.url, face, tls_redis.client, **tls_redis.ssl_settings()) as make:
        yield make


def first_call(face: str, url: str, **kw: Any) -> None:
    """Open a bus on ``url`` and make its first round trip (creating a channel)."""
    s = BusSettings(metrics=False, retry_attempts=0, connect_timeout_s=3, socket_timeout_s=3, **kw)
    if face == "sync":
        with Bus.from_url(url, settings=s) as bus:
            bus.channel("tls-probe")
        return

    async def run() -> None:
        async with AsyncBus.from_url(url, settings=s) as bus:
            await bus.channel("tls-probe")

    asyncio.run(run())


def test_the_server_speaks_no_plaintext(tls_redis: TLSServer) -> None:
    # A raw socket: no client library in between that could retry or upgrade.
    with socket.create_connection(("127.0.0.1", tls_redis.port), timeout=5) as s:
        s.sendall(b"PING\r\n")
        try:
            reply = s.recv(200)
        except (ConnectionResetError, TimeoutError):  # dropped, or never answered
            reply = b""
    assert not reply.startswith(b"+PONG"), reply


def test_a_plaintext_bus_is_refused_with_a_typed_error(tls_redis: TLSServer, face: str) -> None:
    plain = f"redis://127.0.0.1:{tls_redis.port}/0"
    with pytest.raises(BusConnectionError):
        first_call(face, plain)


@pytest.mark.parametrize(
    "which", ["no client certificate", "untrusted client certificate", "server not verified"]
)
def test_clients_without_the_right_certificates_are_refused(
    tls_redis: TLSServer, face: str, which: str
) -> None:
    c = tls_redis.certs
    kw = {
        "no client certificate": {"ssl_ca_certs": c.ca},
        "untrusted client certificate": {
            "ssl_ca_certs": c.ca,
            "ssl_certfile": c.rogue_cert,
            "ssl_keyfile": c.rogue_key,
        },
        # the test CA is not in the system store: rediss:// must verify the server by default
        "server not verified": {"ssl_certfile": c.client_cert, "ssl_keyfile": c.client_key},
    }[which]
    with pytest.raises(BusConnectionError):
        first_call(face, tls_redis.url, **kw)


def test_the_certified_client_gets_through(tls_redis: TLSServer, face: str) -> None:
    # the control for the refusals above: the same call with the right files works
    with tls_redis.client() as admin:
        admin.flushall()
    first_call(face, tls_redis.url, **tls_redis.ssl_settings())
    with tls_redis.client() as admin:
        assert admin.sismember("rb:channels", "tls-probe") or admin.exists("rb:{tls-probe}:meta")


def test_a_rediss_sentinel_url_builds_tls_connections_with_the_certificates(
    tls_redis: TLSServer, face: str
) -> None:
    # No sentinel runs here: building a connection object does no I/O.
    url = "rediss+sentinel://127.0.0.1:1/mymaster"
    s = BusSettings(metrics=False, **tls_redis.ssl_settings())  # type: ignore[arg-type]
    bus: Any = (
        Bus.from_url(url, settings=s) if face == "sync" else AsyncBus.from_url(url, settings=s)
    )
    pool = bus.redis.connection_pool
    to_master = pool.make_connection()
    assert "SSL" in type(to_master).__name__
    for sentinel in pool.sentinel_manager.sentinels:
        kw = sentinel.connection_pool.connection_kwargs
        assert kw.get("ssl_ca_certs") == tls_redis.certs.ca
        assert kw.get("ssl_certfile") == tls_redis.certs.client_cert
