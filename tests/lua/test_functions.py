"""The two ways the scripts run: a Redis Functions library (FUNCTION LOAD once per server, then
FCALL) where the server has Functions, and each script on its own (SCRIPT LOAD, EVALSHA) where
it has not (Redis 6.2, the in-memory double), or where the bus is told not to, or its user may
not load a library. The whole fast tier runs both ways: Redis 7 and Valkey take the library,
``make test-newest`` runs with ``REDISBUS_FUNCTIONS=false``."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from redisbus import Bus
from redisbus._scripts import function_name, library, scripts
from tests.conftest import settings
from tests.support.servers import Server

OPEN: dict[str, Any] = {"routing": "open", "inbox_cap": 1_000, "pair_rate_burst": 1_000}


def _cycle(bus: Bus, channel: str) -> None:
    """send, wait, mark_done, receipt: every script of the message's life."""
    ch = bus.channel(channel, **OPEN)
    a, b = ch.join("a"), ch.join("b")
    for i in range(3):
        r = a.send("b", f"m{i}")
        got = b.wait(timeout=5).messages
        assert [m.body for m in got] == [f"m{i}"]
        assert b.mark_done(got)
        assert r.id is not None and a.receipt(r.id)[0].status == "done"


def _text(x: Any) -> Any:
    return x.decode() if isinstance(x, bytes) else x


def _libraries(r: redis.Redis) -> dict[str, list[str]]:
    """The libraries the server holds, each with its functions' names (FUNCTION LIST)."""
    out = {}
    for lib in r.execute_command("FUNCTION", "LIST"):
        d = {_text(k): v for k, v in lib.items()}
        names = [_text({_text(k): v for k, v in f.items()}["name"]) for f in d["functions"]]
        out[_text(d["library_name"])] = sorted(names)
    return out


@pytest.mark.parametrize("srv", ["redis7", "valkey"])
def test_a_server_with_functions_runs_the_library(srv: str, request: pytest.FixtureRequest) -> None:
    # given: a server with Functions and no redisbus library yet
    server: Server = request.getfixturevalue(srv)
    r = server.client()
    r.execute_command("FUNCTION", "FLUSH")
    r.config_resetstat()
    with Bus.from_url(server.url, settings=settings(functions=True)) as bus:
        # when: a message lives its life
        _cycle(bus, f"fn-{srv}")
        # then: the calls were FCALLs of the one library, which holds every script
        assert bus._io.verb == "FCALL"
        name, _ = library()
        assert _libraries(r) == {name: sorted(function_name(s) for s in scripts())}
        calls = r.info("commandstats")
        assert "cmdstat_fcall" in calls and "cmdstat_evalsha" not in calls


def test_a_second_bus_finds_the_library_loaded(redis7: Server) -> None:
    r = redis7.client()
    r.execute_command("FUNCTION", "FLUSH")
    on = settings(functions=True)  # (whatever REDISBUS_FUNCTIONS says)
    with Bus.from_url(redis7.url, settings=on) as one:
        _cycle(one, "fn-first")
        with Bus.from_url(redis7.url, settings=on) as two:
            _cycle(two, "fn-second")
            assert two._io.verb == "FCALL"
    assert len(_libraries(r)) == 1


@pytest.mark.parametrize("flush", ["FUNCTION", "SCRIPT"])
def test_a_flushed_library_is_loaded_again(redis7: Server, flush: str) -> None:
    # given: a bus that has run its calls as functions
    with Bus.from_url(redis7.url, settings=settings(functions=True)) as bus:
        _cycle(bus, f"fn-flush-{flush}")
        # when: the server forgets them (as a restart without persistence does)
        redis7.client().execute_command(flush, "FLUSH")
        # then: the next calls load the library again and go on
        _cycle(bus, f"fn-flush-{flush}-after")
        assert bus._io.verb == "FCALL"


def test_functions_off_runs_every_script_by_evalsha(redis7: Server) -> None:
    r = redis7.client()
    r.execute_command("FUNCTION", "FLUSH")
    r.config_resetstat()
    with Bus.from_url(redis7.url, settings=settings(functions=False)) as bus:
        _cycle(bus, "fn-off")
        assert bus._io.verb == "EVALSHA"
    calls = r.info("commandstats")
    assert "cmdstat_evalsha" in calls and "cmdstat_fcall" not in calls
    assert _libraries(r) == {}


def test_a_server_without_functions_falls_back_to_evalsha(redis62: Server) -> None:
    with Bus.from_url(redis62.url, settings=settings()) as bus:
        _cycle(bus, "fn-62")
        assert bus._io.verb == "EVALSHA"


def test_a_user_that_may_not_load_a_library_falls_back_to_evalsha(redis7: Server) -> None:
    # given: an ACL user that may run scripts but not load a library
    r = redis7.client()
    r.execute_command("FUNCTION", "FLUSH")
    r.acl_setuser(
        "no-functions", enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-function"]
    )
    try:
        url = f"redis://no-functions:pw@127.0.0.1:{redis7.port}/0"
        with Bus.from_url(url, settings=settings(functions=True)) as bus:
            # when / then: its calls run by EVALSHA, and the message's life is whole
            _cycle(bus, "fn-acl")
            assert bus._io.verb == "EVALSHA"
        assert _libraries(r) == {}
    finally:
        r.acl_deluser("no-functions")


def test_the_library_names_carry_the_code_digest() -> None:
    name, code = library()
    digest = name.removeprefix("redisbus_")
    assert len(digest) == 12 and code.startswith(f"#!lua name={name}\n")
    assert function_name("send") == f"rb_{digest}_send"
    assert all(f"function_name = '{function_name(s)}'" in code for s in scripts())
