"""``redisbus acl`` (docs/security.md#redis-acl-users): a Redis ACL user per agent host, limited to
the key patterns of the channels that host may use. Proven on a real redis-server loaded with
generated users: each host works on its channels and gets NOPERM on the others'."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from redisbus import Bus, BusSettings, InvalidInput, RedisbusError
from redisbus._acl import AGENT_COMMANDS, acl_user
from redisbus.cli import main
from tests.support.deploy_support import REDIS_DIR, run_redis

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


@pytest.fixture(scope="module")
def acl_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    tmp = tmp_path_factory.mktemp("acl-gen")
    pw = {u: secrets.token_hex(12) for u in ("host-a", "host-b", "admin")}
    lines = [
        "user default off resetkeys resetchannels -@all",
        acl_user("host-a", pw["host-a"], ["team-a*"]),
        acl_user("host-b", pw["host-b"], ["team-b*", "shared"]),
        f"user admin on >{pw['admin']} ~* &* +@all",
    ]
    (tmp / "users.acl").write_text("\n".join(lines) + "\n")
    with run_redis(None, tmp, "--aclfile", str(tmp / "users.acl")) as port:
        yield port, pw


def bus_as(port: int, user: str, password: str) -> Bus:
    s = BusSettings(metrics=False, username=user, password=password)
    return Bus.from_url(f"redis://127.0.0.1:{port}/0", settings=s)


def test_a_host_works_on_its_channels_and_nowhere_else(
    acl_port: tuple[int, dict[str, str]],
) -> None:
    port, pw = acl_port
    with bus_as(port, "host-a", pw["host-a"]) as a, bus_as(port, "host-b", pw["host-b"]) as b:
        ch = a.channel("team-a1", **FAST)
        reader, writer = ch.join("reader"), ch.join("writer")
        writer.send("reader", "inside")
        assert [m.body for m in reader.wait(timeout=5).messages] == ["inside"]
        assert b.channel("shared", **FAST).join("bob").name == "bob"
        with pytest.raises(RedisbusError, match=r"(?i)noperm|no permissions"):
            b.channel("team-a1").join("intruder")
        with pytest.raises(RedisbusError, match=r"(?i)noperm|no permissions"):
            a.channel("team-b1")
    raw = redis.Redis(port=port, username="host-b", password=pw["host-b"], decode_responses=True)
    with raw:
        for denied in (
            lambda: raw.xrange("rb:{team-a1}:s"),
            lambda: raw.hgetall("rb:{team-a1}:inbox"),
            lambda: raw.xadd("rb:{team-a1}:s", {"f": "reader", "t": "writer", "b": "x"}),
            lambda: raw.flushall(),
        ):
            with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)noperm|no permissions"):
                denied()
        assert raw.xlen("rb:{shared}:s") >= 0  # its own channel's keys are open


def test_the_generated_commands_are_the_agent_users_of_the_template() -> None:
    line = next(
        x for x in (REDIS_DIR / "users.acl").read_text().splitlines() if x.startswith("user agent")
    )
    assert line.split("-@all ", 1)[1] == AGENT_COMMANDS


def test_the_acl_line_holds_no_password_and_refuses_bad_patterns() -> None:
    line = acl_user("host-a", "pw-in-clear", ["team-[!x]*"])
    assert "pw-in-clear" not in line
    assert "~rb:{team-[^x]*}:*" in line and "~rb:channels" in line
    for bad in (["te{am"], [], ["a b"]):
        with pytest.raises(InvalidInput):
            acl_user("host-a", "pw", bad)


def exit_status(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(argv)
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(e.value.code or 0), out.out + out.err


def test_the_acl_command_reads_the_password_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDISBUS_ACL_PASSWORD", "s3cret")
    status, out = exit_status(["acl", "host-a", "team-a*"], capsys)
    assert status == 0, out
    assert out.startswith("user host-a on #") and "s3cret" not in out
    monkeypatch.setenv("REDISBUS_ACL_PASSWORD", "")
    assert exit_status(["acl", "host-a", "team-a*"], capsys)[0] == 2
    status, out = exit_status(["keygen", str(tmp_path / "k.pem")], capsys)
    assert status == 0 and len(out.strip()) == 44
    assert exit_status(["keygen", str(tmp_path / "k.pem")], capsys)[0] == 2
