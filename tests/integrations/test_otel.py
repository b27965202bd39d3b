"""OpenTelemetry: one trace from a sender's span to the receiver's processing span, across two
OS processes (each with the SDK's in-memory exporter), and from an A2A caller through the
bridge; spans named and attributed per the messaging semantic conventions."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

ROOT = Path(__file__).resolve().parents[2]


def worker(mode: str, redis_url: str, channel: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.otel_workers", mode, redis_url, channel],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def started(p: subprocess.Popen[str]) -> None:
    assert p.stdout is not None
    line = p.stdout.readline()
    assert line.strip() == "ready", line + (p.stderr.read() if p.stderr else "")


def spans_of(p: subprocess.Popen[str]) -> list[dict[str, Any]]:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    spans: list[dict[str, Any]] = json.loads(out.strip().splitlines()[-1])
    return spans


def one(spans: list[dict[str, Any]], name: str, **attrs: Any) -> dict[str, Any]:
    found = [
        s
        for s in spans
        if s["name"] == name and all(s["attributes"].get(k) == v for k, v in attrs.items())
    ]
    assert len(found) == 1, (name, attrs, spans)
    return found[0]


def test_one_trace_runs_from_the_senders_span_through_the_receivers_processing(
    redis_url: str,
) -> None:
    channel = f"otel-{uuid.uuid4().hex[:6]}"
    # given a member serving in one process and a client asking from another
    server = worker("serve", redis_url, channel)
    started(server)
    client = worker("ask", redis_url, channel)
    client_spans, server_spans = spans_of(client), spans_of(server)

    # the client's send: a PRODUCER span per the conventions
    send = one(client_spans, f"send {channel}", **{"messaging.client.id": "client"})
    assert send["kind"] == "PRODUCER"
    request_id = send["attributes"]["messaging.message.id"]
    assert (
        send["attributes"]
        | {
            "messaging.system": "redis",
            "messaging.destination.name": channel,
            "messaging.operation.type": "send",
        }
        == send["attributes"]
    )
    producer = {"trace_id": send["trace_id"], "span_id": send["span_id"]}

    # the member's receive (linked) and processing span (child and link): the same trace
    receive = one(server_spans, f"receive {channel}", **{"messaging.message.id": request_id})
    assert receive["kind"] == "CONSUMER" and producer in receive["links"]
    assert receive["attributes"]["messaging.operation.type"] == "receive"
    process = one(server_spans, f"process {channel}")
    assert process["kind"] == "CONSUMER"
    assert process["trace_id"] == send["trace_id"]
    assert process["parent_span_id"] == send["span_id"] and producer in process["links"]
    assert process["attributes"]["messaging.message.id"] == request_id
    assert process["attributes"]["messaging.consumer.group.name"] == "worker"

    # the reply, sent inside the handler, continues the trace back to the client
    reply = one(server_spans, f"send {channel}", **{"messaging.client.id": "worker"})
    assert reply["trace_id"] == send["trace_id"]
    assert reply["parent_span_id"] == process["span_id"]
    got = one(client_spans, f"receive {channel}")
    assert {"trace_id": reply["trace_id"], "span_id": reply["span_id"]} in got["links"]
    assert got["attributes"]["messaging.message.id"] == reply["attributes"]["messaging.message.id"]


def test_an_a2a_callers_traceparent_continues_into_the_members_processing_span(
    redis_url: str,
) -> None:
    from tests.integrations.test_a2a import bridge, one_task, text_request

    channel = f"otel-a2a-{uuid.uuid4().hex[:6]}"
    server = worker("serve", redis_url, channel)
    started(server)
    srv = bridge(redis_url, channel)  # this process has no SDK: the API passes context on
    trace_id, span_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    try:

        async def call() -> Any:
            # an A2A caller inside a trace of its own: W3C traceparent on its HTTP requests
            http = httpx.AsyncClient(
                headers={
                    "Authorization": "Bearer tok-alice",
                    "traceparent": f"00-{trace_id}-{span_id}-01",
                },
                timeout=30,
            )
            url = f"{srv.url}/agents/worker"
            card = await A2ACardResolver(http, url).get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
            return await one_task(client, text_request("from a2a"))

        task = asyncio.run(call())
        assert task.status.message.parts[0].text == "done: from a2a"
    finally:
        srv.stop()
    process = one(spans_of(server), f"process {channel}")
    assert process["trace_id"] == trace_id and process["parent_span_id"] == span_id


PROBE = """
import sys
if sys.argv[2] == "absent":
    sys.modules["opentelemetry"] = None  # as when the otel extra is not installed
from redisbus import Bus, BusSettings, _otel
bus = Bus.from_url(sys.argv[1], settings=BusSettings(metrics=False))
ch = bus.channel(sys.argv[3])
a, b = ch.join("a"), ch.join("b")
a.send("b", "plain")
if sys.argv[2] == "api":  # no SDK: a context made current still travels
    with _otel.continued({"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"}):
        a.send("b", "inside a caller's trace")
got = b.wait(timeout=5).messages
print(_otel.on, _otel.tracer() if _otel.on else None, [m.trace for m in got])
bus.close()
"""


@pytest.mark.parametrize("mode", ["absent", "api"])
def test_without_an_sdk_no_span_is_made_and_only_a_current_context_travels(
    redis_url: str, mode: str
) -> None:
    channel = f"otel-{mode}-{uuid.uuid4().hex[:6]}"
    p = subprocess.run(
        [sys.executable, "-c", PROBE, redis_url, mode, channel],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert p.returncode == 0, p.stderr
    if mode == "absent":  # the flag is off: the hot paths skip tracing with one test
        assert p.stdout.strip() == "False None [None]"
    else:  # the API without an SDK: no tracer, the plain send carries nothing
        expected = f"00-{'ab' * 16}-{'cd' * 8}-01"
        assert p.stdout.strip() == f"True None [None, '{expected}']"
