"""One OpenTelemetry trace across two processes, printed by each side's ConsoleSpanExporter.

Needs the otel extra and an SDK: pip install 'redisbus[otel]' opentelemetry-sdk

REDISBUS_URL=redis://localhost:6379/0 python examples/trace_two_processes.py
python examples/trace_two_processes.py          # no REDISBUS_URL: a private Redis for the run
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from redisbus import Agent, Bus, Message


def one_line(span: ReadableSpan) -> str:
    """The console exporter's output, one line per span (its default is a JSON document)."""
    ctx, parent = span.context, span.parent
    assert ctx is not None
    up = f"parent={parent.span_id:016x}" if parent else "parent=none     "
    links = "".join(f" link={ln.context.span_id:016x}" for ln in span.links)
    return (
        f"[pid {os.getpid()}] {span.name:<28} {span.kind.name:<9} trace={ctx.trace_id:032x} "
        f"span={ctx.span_id:016x} {up}{links}\n"
    )


def tracing(service: str) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=one_line)))
    trace.set_tracer_provider(provider)
    return provider


def reviewer(url: str, channel: str) -> None:
    """The second process: serves one request; its process span continues the asker's trace."""
    provider = tracing("reviewer")
    bus = Bus.from_url(url)
    me = bus.channel(channel).join("reviewer")
    print("ready", flush=True)
    stop = threading.Event()

    def review(agent: Agent, msg: Message) -> None:
        agent.send(msg.sender, "approved", reply_to=msg.id, type="response")
        stop.set()

    bus.serve({me: review}, stop=stop, poll_s=0.2)
    bus.close()
    provider.shutdown()


def director() -> None:
    provider = tracing("director")
    url = os.environ.get("REDISBUS_URL")
    bus = Bus.from_url(url) if url else Bus.embedded()
    channel = f"example-trace-{uuid.uuid4().hex[:6]}"
    me = bus.channel(channel).join("director")
    other = subprocess.Popen(
        [sys.executable, __file__, "reviewer", str(bus.url), channel],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other.stdout is not None and other.stdout.readline().strip() == "ready"
    tracer = trace.get_tracer("example")
    with tracer.start_as_current_span("plan scene 3") as root:  # the trace starts here
        reply = me.ask("reviewer", "scene 3, take 2: approve?", timeout=30)
    print(f"[pid {os.getpid()}] reply: {reply.body}", flush=True)
    sys.stdout.write(other.communicate(timeout=30)[0])  # the reviewer's spans
    trace_id = root.get_span_context().trace_id
    print(f"one trace, {trace_id:032x}, across pids {os.getpid()} and {other.pid}")
    bus.close()
    provider.shutdown()


if __name__ == "__main__":
    if sys.argv[1:2] == ["reviewer"]:
        reviewer(sys.argv[2], sys.argv[3])
    else:
        director()
