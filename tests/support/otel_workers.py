"""One side of the OpenTelemetry tests, run as its own OS process with the SDK's in-memory
exporter; it prints its finished spans as one JSON line at the end.

    python -m tests.support.otel_workers serve URL CHANNEL   # the member: answers one request
    python -m tests.support.otel_workers ask URL CHANNEL     # the client: asks the member once
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from redisbus import Agent, Bus, BusSettings, Message

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def span_json(span: Any) -> dict[str, Any]:
    ctx, parent = span.context, span.parent
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{ctx.trace_id:032x}",
        "span_id": f"{ctx.span_id:016x}",
        "parent_span_id": f"{parent.span_id:016x}" if parent else None,
        "links": [
            {"trace_id": f"{ln.context.trace_id:032x}", "span_id": f"{ln.context.span_id:016x}"}
            for ln in span.links
        ],
        "attributes": dict(span.attributes or {}),
    }


def main(mode: str, url: str, channel: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)

    bus = Bus.from_url(url, settings=BusSettings(metrics=False))
    ch = bus.channel(channel, **FAST)
    if mode == "serve":
        me = ch.join("worker")
        print("ready", flush=True)
        stop = threading.Event()

        def handle(agent: Agent, m: Message) -> None:
            agent.send(m.sender, f"done: {m.body}", reply_to=m.id, type="response")
            stop.set()

        bus.serve({me: handle}, stop=stop, poll_s=0.2)
    else:
        me = ch.join("client")
        reply = me.ask("worker", "hello", timeout=30)
        print(f"reply: {reply.body}", flush=True)
    bus.close()
    provider.force_flush()
    print(json.dumps([span_json(s) for s in exporter.get_finished_spans()]), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
