"""A2A 1.0 conformance of the inbound bridge, one behaviour per test, spoken as plain JSON-RPC
by a client of its own (besides the conformance kit, tests/integrations/test_a2a_tck.py): task
states,
terminal tasks, contexts, content types, ListTasks, historyLength, stable reads, the card."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from redisbus import Bus, BusSettings
from tests.integrations.test_a2a import bridge

Json = dict[str, Any]

ERR_INVALID_PARAMS = -32602
ERR_UNSUPPORTED = -32004
ERR_CONTENT_TYPE = -32005


class Caller:
    """alice's JSON-RPC client for one member's endpoint."""

    def __init__(self, url: str, token: str = "tok-alice") -> None:
        self.url = url
        self.http = httpx.Client(
            headers={"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}, timeout=30
        )

    def call(self, method: str, params: Json) -> Json:
        body = {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": method, "params": params}
        r = self.http.post(self.url + "/", json=body)
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            return {"stream": r.text}
        got: Json = r.json()
        return got

    def send(
        self, text: str = "hello", *, configuration: Json | None = None, **message: Any
    ) -> Json:
        msg: Json = {"role": "ROLE_USER", "parts": [{"text": text}], "messageId": _id()}
        msg.update(message)
        config = configuration or {"returnImmediately": True}
        return self.call("SendMessage", {"message": msg, "configuration": config})

    def task(self, text: str = "hello", **message: Any) -> Json:
        got = self.send(text, **message)
        assert "result" in got, got
        task: Json = got["result"]["task"]
        return task

    def get(self, task_id: str, **params: Any) -> Json:
        return self.call("GetTask", {"id": task_id, **params})


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    yield b
    b.close()


@pytest.fixture
def chan() -> str:
    return f"a2a-{uuid.uuid4().hex[:8]}"


def _id() -> str:
    return str(uuid.uuid4())


def _code(reply: Json) -> int | None:
    error = reply.get("error")
    return int(error["code"]) if error else None


def _done(bus: Bus, chan: str, member: str = "bob") -> list[str]:
    """The member finishes every request it has: marks it done (with no reply)."""
    agent = bus.channel(chan).join(member)
    got = agent.wait(timeout=5).messages
    for m in got:
        agent.mark_done(m, result=f"did {m.body}")
    return [m.id for m in got]


def _until(pred: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.02)


# -- 1. canceled is terminal ------------------------------------------------------------------


def test_a_canceled_task_stays_canceled_when_the_member_finishes_it_later(
    bus: Bus, redis_url: str, chan: str
) -> None:
    bus.channel(chan).join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("a long job")
        canceled = alice.call("CancelTask", {"id": task["id"]})
        assert canceled["result"]["status"]["state"] == "TASK_STATE_CANCELED"
        # the member had the request already and finishes it anyway
        assert task["id"] in _done(bus, chan)
        bob = bus.channel(chan).join("bob")
        assert _until(lambda: bob.receipt(task["id"])[0].status == "done")
        reads = [alice.get(task["id"])["result"]["status"]["state"] for _ in range(3)]
        assert reads == ["TASK_STATE_CANCELED"] * 3
        again = alice.call("CancelTask", {"id": task["id"]})
        assert _code(again) == -32002  # TaskNotCancelableError
    finally:
        srv.stop()


# -- 2, 3. a task's follow-ups ----------------------------------------------------------------


def test_a_message_to_a_finished_task_is_refused_and_sends_nothing(
    bus: Bus, redis_url: str, chan: str
) -> None:
    ch = bus.channel(chan)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("one job")
        _done(bus, chan)
        state: Callable[[], str] = lambda: alice.get(task["id"])["result"]["status"]["state"]  # noqa: E731
        assert _until(lambda: state() == "TASK_STATE_COMPLETED")
        follow_up = alice.send("and another thing", taskId=task["id"])
        assert _code(follow_up) == ERR_UNSUPPORTED, follow_up
        assert ch.length() == 1
    finally:
        srv.stop()


def test_a_task_id_with_another_context_id_is_refused(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("first", contextId="ctx-a")
        assert task["contextId"] == "ctx-a"
        mismatch = alice.send("second", taskId=task["id"], contextId="ctx-b")
        assert _code(mismatch) == ERR_INVALID_PARAMS, mismatch
        assert ch.length() == 1
        same = alice.task("second", taskId=task["id"], contextId="ctx-a")
        inferred = alice.task("third", taskId=task["id"])
        assert same["contextId"] == inferred["contextId"] == "ctx-a"
    finally:
        srv.stop()


# -- 4. SubscribeToTask ---------------------------------------------------------------------


def test_subscribing_to_a_finished_task_is_refused(bus: Bus, redis_url: str, chan: str) -> None:
    bus.channel(chan).join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("quick one")
        _done(bus, chan)
        assert _until(
            lambda: alice.get(task["id"])["result"]["status"]["state"] == "TASK_STATE_COMPLETED"
        )
        sub = alice.call("SubscribeToTask", {"id": task["id"]})
        text = sub.get("stream", "")
        assert _code(sub) == ERR_UNSUPPORTED or str(ERR_UNSUPPORTED) in text, sub
        assert "TASK_STATE_COMPLETED" not in text
    finally:
        srv.stop()


# -- 5. content types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "part",
    [
        {"raw": "dGNr", "mediaType": "application/octet-stream"},
        {"url": "https://example.com/report.txt", "mediaType": "text/plain"},
        {"raw": "dGNr"},
    ],
    ids=["undeclared-media-type", "file-url-of-text", "raw-without-media-type"],
)
def test_a_file_part_is_content_type_not_supported(
    bus: Bus, redis_url: str, chan: str, part: Json
) -> None:
    ch = bus.channel(chan)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        got = alice.send(parts=[{"text": "see attached"}, part])
        assert _code(got) == ERR_CONTENT_TYPE, got
        assert ch.length() == 0
    finally:
        srv.stop()


# -- 6. ListTasks ---------------------------------------------------------------------------


def test_list_tasks_filters_pages_and_validates(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan, pair_rate_burst=0)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        in_a = [alice.task(f"a{i}", contextId="ctx-a")["id"] for i in range(3)]
        in_b = [alice.task(f"b{i}", contextId="ctx-b")["id"] for i in range(2)]

        def listed(**params: Any) -> Json:
            got = alice.call("ListTasks", params)
            assert "result" in got, got
            result: Json = got["result"]
            return result

        assert {t["id"] for t in listed(contextId="ctx-a")["tasks"]} == set(in_a)
        assert {t["id"] for t in listed(contextId="ctx-b")["tasks"]} == set(in_b)
        assert len(listed()["tasks"]) == 5
        # bob finishes everything; the status filter sees the states as they are now
        _done(bus, chan)
        _until(lambda: len(listed(status="TASK_STATE_COMPLETED").get("tasks", [])) == 5)
        assert listed(status="TASK_STATE_SUBMITTED").get("tasks", []) == []
        # pages of two, through all five, the last with an empty token
        seen: list[str] = []
        token = ""
        for _ in range(3):
            page = listed(pageSize=2, pageToken=token) if token else listed(pageSize=2)
            seen += [t["id"] for t in page["tasks"]]
            token = page.get("nextPageToken", "")
        assert sorted(seen) == sorted(in_a + in_b) and token == ""
        for bad in ({"pageSize": -1}, {"pageSize": 0}, {"pageSize": 101}, {"pageToken": "nope"}):
            assert _code(alice.call("ListTasks", bad)) == ERR_INVALID_PARAMS, bad
    finally:
        srv.stop()


# -- 7. historyLength -----------------------------------------------------------------------


def test_history_length_limits_the_history_of_get_and_send(
    bus: Bus, redis_url: str, chan: str
) -> None:
    bus.channel(chan).join("bob")
    srv = bridge(redis_url, chan, send_wait_s=0.2)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("remember me")
        _done(bus, chan)
        full = _until(
            lambda: (
                (g := alice.get(task["id"])["result"])["status"]["state"] == "TASK_STATE_COMPLETED"
                and g
            )
        )
        assert len(full["history"]) == 2
        assert "history" not in alice.get(task["id"], historyLength=0)["result"]
        assert len(alice.get(task["id"], historyLength=1)["result"]["history"]) == 1
        assert _code(alice.get(task["id"], historyLength=-1)) == ERR_INVALID_PARAMS
        sent = alice.send("again", configuration={"historyLength": 0})
        assert "history" not in sent["result"]["task"], sent
    finally:
        srv.stop()


# -- 8. messageId, stable reads, the card ----------------------------------------------------


def test_a_message_without_message_id_is_refused(bus: Bus, redis_url: str, chan: str) -> None:
    ch = bus.channel(chan)
    ch.join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        message = {"role": "ROLE_USER", "parts": [{"text": "who am I"}]}
        got = alice.call("SendMessage", {"message": message})
        assert _code(got) == ERR_INVALID_PARAMS, got
        assert ch.length() == 0
    finally:
        srv.stop()


def test_reading_a_task_twice_shows_the_same_status(bus: Bus, redis_url: str, chan: str) -> None:
    bus.channel(chan).join("bob")
    srv = bridge(redis_url, chan)
    try:
        alice = Caller(f"{srv.url}/agents/bob")
        task = alice.task("stable please")
        first = alice.get(task["id"])["result"]["status"]
        time.sleep(0.05)
        assert alice.get(task["id"])["result"]["status"] == first  # same state, same stamp
        _done(bus, chan)
        done = _until(
            lambda: (
                (s := alice.get(task["id"])["result"]["status"])["state"] == "TASK_STATE_COMPLETED"
                and s
            )
        )
        assert done["timestamp"] != first["timestamp"]  # a new state is stamped anew
        time.sleep(0.05)
        again = alice.get(task["id"])["result"]["status"]
        assert again == done
        assert again["message"]["messageId"] == done["message"]["messageId"]
    finally:
        srv.stop()


def test_the_card_has_caching_headers_and_0_3_clients_see_its_security(
    bus: Bus, redis_url: str, chan: str
) -> None:
    bus.channel(chan).join("bob")
    srv = bridge(redis_url, chan)
    try:
        url = f"{srv.url}/agents/bob/.well-known/agent-card.json"
        r = httpx.get(url)
        assert "max-age=" in r.headers["cache-control"]
        assert r.headers["etag"]
        assert httpx.get(url, headers={"If-None-Match": r.headers["etag"]}).status_code == 304
        # the 1.0 card: exactly the 1.0 fields (its schema admits no others)
        assert r.json()["securityRequirements"] == [{"schemes": {"bearer": {}}}]
        assert "security" not in r.json()
        # a 0.3 client (the 0.3 path, or A2A-Version 0.3) also reads the 0.3 name
        legacy = httpx.get(f"{srv.url}/agents/bob/.well-known/agent.json").json()
        asked = httpx.get(url, headers={"A2A-Version": "0.3"}).json()
        assert legacy["security"] == asked["security"] == [{"bearer": []}]
    finally:
        srv.stop()
