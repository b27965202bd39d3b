"""The console's HTTP side, without a browser: looking changes nothing, the event stream
follows the channel, changes need the token, bad input gets a clear error, and the defaults
are safe (loopback, read-only)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import pytest
import redis

from redisbus.cli import main
from tests.cli.test_console import TOKEN, Film, console, film
from tests.support.servers import Server


@pytest.fixture(scope="module")
def read_only(redis7: Server) -> Iterator[str]:
    with console(redis7.url, "--stuck-after", "0.5") as base:
        yield base


@pytest.fixture(scope="module")
def with_token(redis7: Server) -> Iterator[str]:
    with console(redis7.url, "--token", TOKEN) as base:
        yield base


@pytest.fixture
def conversation(redis_url: str) -> Iterator[Film]:
    f = film(redis_url)
    yield f
    f.bus.close()


def everything(r: redis.Redis) -> dict[str, Any]:
    """Every key's content, consumer groups and pending entries included (minus idle times,
    which move by themselves)."""
    out: dict[str, Any] = {}
    kw = r.connection_pool.connection_kwargs
    raw = redis.Redis(host=kw["host"], port=kw["port"], db=kw.get("db", 0))
    for key in sorted(cast(list[str], r.keys("*"))):  # the client decodes replies
        kind = r.type(key)
        if kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "string":  # may be binary (the packed limits)
            out[key] = raw.get(key)
        elif kind == "stream":
            groups = r.xinfo_groups(key)
            out[key] = {
                "entries": r.xrange(key),
                "groups": groups,
                "consumers": {
                    g["name"]: [
                        (c["name"], c["pending"]) for c in r.xinfo_consumers(key, g["name"])
                    ]
                    for g in groups
                },
                "pending": {
                    g["name"]: [
                        (p["message_id"], p["consumer"], p["times_delivered"])
                        for p in r.xpending_range(key, g["name"], "-", "+", 1000)
                    ]
                    for g in groups
                },
            }
        else:
            out[key] = kind
    return out


def events(base: str, channel: str, want: int, timeout: float = 15) -> list[dict[str, Any]]:
    """The first ``want`` snapshots of the channel's event stream."""
    got: list[dict[str, Any]] = []
    with httpx.stream(
        "GET", f"{base}/api/events", params={"channel": channel}, timeout=timeout
    ) as res:
        assert res.status_code == 200
        assert res.headers["content-type"].startswith("text/event-stream")
        name = ""
        for line in res.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name == "snapshot":
                got.append(json.loads(line[6:]))
                if len(got) == want:
                    break
    return got


def test_looking_at_a_channel_joins_nothing_and_marks_nothing(
    conversation: Film, read_only: str, redis_url: str
) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    before = everything(r)

    def receipts() -> list[tuple[str, object, object]]:
        ids = (conversation.kickoff, conversation.draft, conversation.notes, conversation.xss)
        got = [r for m in ids for r in conversation.writer.receipt(m)]
        return [(r.status, r.read_at, r.done_at) for r in got]

    seen = receipts()

    assert httpx.get(f"{read_only}/api/channels").status_code == 200
    assert httpx.get(f"{read_only}/api/snapshot", params={"channel": "film"}).status_code == 200
    assert httpx.get(f"{read_only}/c/film").status_code == 200
    (first,) = events(read_only, "film", 1)
    assert httpx.get(f"{read_only}/api/snapshot", params={"channel": "no-such"}).status_code == 404

    assert everything(r) == before
    assert receipts() == seen
    assert [a["name"] for a in first["tree"]] == ["director", "designer", "writer"]
    assert first["unread"] == 3  # the kickoff for the designer, the notes, the markup message


def test_the_event_stream_sends_a_new_snapshot_when_a_message_arrives(
    conversation: Film, read_only: str
) -> None:
    f = conversation
    sent: list[str] = []

    def later() -> None:
        time.sleep(1.0)
        sent.append(f.designer.send("director", "Palette chosen: magenta and teal").id)

    t = threading.Thread(target=later)
    t.start()
    first, second = events(read_only, "film", 2)
    t.join()
    ids = [m["id"] for th in second["threads"] for m in th["messages"]]
    assert sent[0] in ids and sent[0] not in [
        m["id"] for th in first["threads"] for m in th["messages"]
    ]


def test_the_event_stream_follows_a_receipt_to_done_without_a_new_message(
    conversation: Film, read_only: str
) -> None:
    f = conversation

    def status(snap: dict[str, Any]) -> str:
        (msg,) = [m for th in snap["threads"] for m in th["messages"] if m["id"] == f.draft]
        return str(msg["receipts"][0]["status"])

    threading.Timer(1.0, lambda: f.director.mark_done(f.draft)).start()
    first, second = events(read_only, "film", 2)
    assert (status(first), status(second)) == ("read", "done")


def test_unfinished_messages_are_flagged_stuck_after_the_threshold(
    conversation: Film, read_only: str
) -> None:
    time.sleep(0.6)  # the console was started with --stuck-after 0.5
    snap = httpx.get(f"{read_only}/api/snapshot", params={"channel": "film"}).json()
    stuck = {m["id"] for th in snap["threads"] for m in th["messages"] if m["stuck"]}
    f = conversation
    assert {f.notes, f.xss, f.kickoff, f.draft} <= stuck
    assert f.render not in stuck  # failed: finished, if badly
    assert snap["stuck"] == len(stuck)


def test_changes_need_the_token(conversation: Film, with_token: str, read_only: str) -> None:
    f = conversation
    url = f"{with_token}/api/pause"
    params = {"channel": "film"}
    assert httpx.post(url, params=params).status_code == 403
    assert (
        httpx.post(url, params=params, headers={"Authorization": "Bearer wrong"}).status_code == 403
    )
    assert httpx.post(url, params=params, headers={"Authorization": TOKEN}).status_code == 403
    assert f.ch.refresh().paused is False
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url, params=params, headers=good).json() == {"paused": True}
    assert f.ch.refresh().paused is True
    assert httpx.post(f"{with_token}/api/resume", params=params, headers=good).status_code == 200
    assert f.ch.refresh().paused is False
    # a console started without a token refuses every change, even one bearing that token
    res = httpx.post(f"{read_only}/api/pause", params=params, headers=good)
    assert (res.status_code, res.json()["error"]) == (403, "read_only")
    assert f.ch.refresh().paused is False


def test_bad_requests_get_clear_errors_and_change_nothing(
    conversation: Film, with_token: str, redis_url: str
) -> None:
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    before = everything(r)
    good = {"Authorization": f"Bearer {TOKEN}"}
    cases = [
        ("/api/replay", {"channel": "film", "id": "not-an-id"}, 400, "invalid_input"),
        ("/api/replay", {"channel": "film", "id": "1-0"}, 400, "invalid_input"),
        ("/api/replay", {"channel": "film"}, 400, "invalid_input"),
        ("/api/pause", {}, 400, "invalid_input"),
        ("/api/pause", {"channel": "no-such"}, 404, "unknown_agent"),
        ("/api/pause", {"channel": "bad{tag}"}, 400, "invalid_input"),
    ]
    for path, params, status, code in cases:
        res = httpx.post(with_token + path, params=params, headers=good)
        assert (res.status_code, res.json()["error"]) == (status, code), (path, params, res.text)
    res = httpx.get(f"{with_token}/api/events", params={"channel": "no-such"})
    assert res.status_code == 404
    assert everything(r) == before


def test_pages_forbid_inline_scripts_and_foreign_hosts(read_only: str) -> None:
    res = httpx.get(f"{read_only}/c/film")
    assert "script-src 'self'" in res.headers["content-security-policy"]
    assert '<script src="/static/console.js"' in res.text
    # a page reached through another name (DNS rebinding) is refused
    assert httpx.get(f"{read_only}/", headers={"Host": "evil.example"}).status_code == 400


def test_defaults_are_loopback_and_read_only_and_bad_options_are_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("REDISBUS_CONSOLE_HOST", "REDISBUS_CONSOLE_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        main(["console", "--help"])
    text = capsys.readouterr().out
    assert re.search(r"--host\s.*\[default: 127\.0\.0\.1\]", text, re.DOTALL)
    assert "read-only without a token" in text
    for bad in (["--token", "short"], ["--messages", "0"], ["--stuck-after", "-1"]):
        with pytest.raises(SystemExit) as done:
            main(["console", "--url", "redis://127.0.0.1:1/0", *bad])
        assert done.value.code == 2, bad
    monkeypatch.setenv("REDISBUS_CONSOLE_TOKEN", "short")  # the variable is the option's
    with pytest.raises(SystemExit) as done:
        main(["console", "--url", "redis://127.0.0.1:1/0"])
    assert done.value.code == 2


def test_the_cli_lists_and_runs_the_console_command() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from redisbus.cli import main; main()", "console", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "--token" in out.stdout and "127.0.0.1" in out.stdout


def test_without_redis_the_api_says_so_plainly() -> None:
    from starlette.testclient import TestClient

    from redisbus import AsyncBus, BusSettings
    from redisbus.console import ConsoleConfig, create_app
    from redisbus.embedded import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    settings = BusSettings(metrics=False, retry_attempts=1, connect_timeout_s=0.5)
    app = create_app(lambda: AsyncBus.from_url(url, settings=settings), ConsoleConfig())
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for path in ("/api/channels", "/api/snapshot?channel=film", "/api/events?channel=film"):
            res = client.get(path)
            assert (res.status_code, res.json()["error"]) == (503, "connection"), path


def test_a_malformed_raw_entry_and_dead_letter_leave_the_console_answering(
    conversation: Film, read_only: str, redis_url: str
) -> None:
    # given: raw entries whose fields are no numbers, in the stream and the dead-letter stream
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    k = conversation.ch.keys
    r.xadd(k.stream, {"f": "writer", "t": "designer", "b": "poison", "x": "abc", "p": "high"})
    r.xadd(k.dlq, {"o": "1-1", "a": "designer", "n": "two", "dead_ms": "soon", "x": "abc"})

    # then: the channel's page, snapshot and dead letters still answer
    assert httpx.get(f"{read_only}/c/film").status_code == 200
    snap = httpx.get(f"{read_only}/api/snapshot", params={"channel": "film"})
    assert snap.status_code == 200
    # (the raw one, whose numbers are none, is no dead letter: passed over, warned once)
    letters = conversation.ch.dead_letters()
    assert len(letters) == 1 and letters[0].original_id != "1-1"
