"""The core contract as the least-privilege ``agent`` user of ``deploy/redis/users.acl``
(docs/security.md#redis-acl-users), on Redis 7 and Redis 6.2, both faces.

The server loads the committed template rendered with test passwords, plus one ``admin`` line
for the fixture only (the template turns the default user off, and the contract fixtures
flush the server between tests). The bus, and the client the tests inspect state with, log
in as ``agent``: every command of the contract runs under that user's rules.

The contract tests are the functions of ``tests.contract.test_contract``, collected here a
second time with this module's ``make_bus``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

pytest.register_assert_rewrite("tests.support.tls_servers")

from tests.contract import test_contract  # noqa: E402
from tests.support.deploy_support import REDIS_DIR, redis_binaries, run_redis  # noqa: E402
from tests.support.servers import missing, version  # noqa: E402
from tests.support.tls_servers import contract_buses  # noqa: E402

# Collect every contract test here too; the fixtures below decide what they run against.
globals().update({n: f for n, f in vars(test_contract).items() if n.startswith("test_")})


@dataclass(frozen=True)
class AclServer:
    port: int
    passwords: dict[str, str]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"  # no credentials in the URL: settings carry them

    def client(self, user: str) -> redis.Redis:
        return redis.Redis(
            port=self.port, username=user, password=self.passwords[user], decode_responses=True
        )


def render_acl(out: Path, passwords: dict[str, str]) -> None:
    """deploy/redis/render-acl.sh on the committed template, then the fixture's admin user."""
    env = {
        **os.environ,
        "REDISBUS_AGENT_PASSWORD": passwords["agent"],
        "REDISBUS_EXPORTER_PASSWORD": passwords["exporter"],
    }
    script, template = REDIS_DIR / "render-acl.sh", REDIS_DIR / "users.acl"
    subprocess.run(["sh", str(script), str(template), str(out)], env=env, check=True, timeout=30)
    with out.open("a", encoding="utf-8") as f:
        f.write(f"user admin on >{passwords['admin']} ~* &* +@all\n")


def binary_id(path: str) -> str:
    return "missing" if path == "missing" else f"redis-{version(path)}"


@pytest.fixture(scope="module", params=redis_binaries() or ["missing"], ids=binary_id)
def acl_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AclServer]:
    """A real Redis with the rendered users.acl (module-wide: one start per binary)."""
    if request.param == "missing":
        missing("no redis-server binary for the ACL contract run")
    tmp = tmp_path_factory.mktemp("acl-redis")
    passwords = {u: secrets.token_hex(12) for u in ("agent", "exporter", "admin")}
    render_acl(tmp / "users.acl", passwords)
    with run_redis(request.param, tmp, "--aclfile", str(tmp / "users.acl")) as port:
        yield AclServer(port, passwords)


@pytest.fixture
def make_bus(acl_server: AclServer, face: str) -> Iterator[Any]:
    """make_bus(sync=False, **settings): a Bus or AsyncBus logged in as ``agent``."""
    with acl_server.client("admin") as admin:
        admin.flushall()
    login = {"username": "agent", "password": acl_server.passwords["agent"]}
    with contract_buses(acl_server.url, face, lambda: acl_server.client("agent"), **login) as make:
        yield make


def test_the_contract_ran_as_the_agent_user(make_bus: Any, face: str) -> None:
    # the control for every test above: the bus's own connection is the restricted user
    bus = make_bus()
    bus.channel("acl-probe")
    own = bus.redis if face == "sync" else bus.target.redis  # the async bus's own client

    def call(f: Callable[[], Any]) -> Any:
        out = f()
        return out if face == "sync" else bus._loop.run_until_complete(out)

    assert call(lambda: own.exists("rb:{acl-probe}:meta")) == 1
    for denied in (
        lambda: own.flushall(),
        lambda: own.config_get("maxmemory"),
        lambda: own.set("outside:the:prefix", "x"),
        lambda: own.get("outside:the:prefix"),
    ):
        with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)no permissions|NOPERM"):
            call(denied)


def test_an_agent_host_without_the_fleet_key_cannot_forge_a_sender(acl_server: AclServer) -> None:
    # The agent user may XADD to rb:* (the bus needs it), so the ACL alone cannot stop a host
    # that holds the password from writing "from: writer" straight into a stream. The fleet
    # key can: readers drop what it did not sign.
    from redisbus import Bus, BusSettings

    with acl_server.client("admin") as admin:
        admin.flushall()
    keys = {"k1": secrets.token_hex(16)}
    signed = BusSettings(
        metrics=False, signing_keys=keys, username="agent", password=acl_server.passwords["agent"]
    )
    with Bus.from_url(acl_server.url, settings=signed) as bus, acl_server.client("agent") as raw:
        ch = bus.channel("acl-signed")
        director, writer = ch.join("director"), ch.join("writer")
        writer.send("director", "genuine")
        forged = raw.xadd(ch.keys.stream, {"f": "writer", "t": "director", "b": "approve it"})

        got = director.wait(timeout=2)

        assert forged  # the ACL let the forgery in ...
        assert [(m.sender, m.body, m.verified) for m in got.messages] == [
            ("writer", "genuine", True)
        ]
        assert [m.body for m in director.read(filter_by="all")] == ["genuine"]  # ... not out
