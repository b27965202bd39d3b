"""OpenTelemetry tracing (the ``redisbus[otel]`` extra): W3C trace context in each message,
spans per the messaging semantic conventions.

- ``send {channel}`` (PRODUCER) around ``send``/``send_many``; its context is written into
  the message's ``trace`` field as ``TRACEPARENT[ TRACESTATE]`` (W3C header values, one
  space between them) unless the caller gave a ``trace`` of its own.
- ``receive {channel}`` (CONSUMER) when ``wait``/``read``/``ask`` hand messages over, linked
  to each message's producer context.
- ``process {channel}`` (CONSUMER) around a ``serve`` handler (or ``processing(...)``): a child
  of the producer's context, so one trace runs from the sender through the handler, with a
  link to it as the conventions ask.

These spans are the bus's own: the sockets the lanes write to bypass redis-py (and so its
instrumentation), and every send and wake-up on a lane is inside one of them.

Cost: nothing is imported until a bus is made. When ``opentelemetry`` is not installed,
``on`` stays False and the hot paths pay one test of it. When the API is installed but no
SDK is configured, no span is made: the check reads the API's provider slot (see
``tracer()``), and a context someone made current is passed on.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["continued", "load", "on", "processing"]

#: True when opentelemetry is importable (``load()`` looked once): the hot paths' one test
on = False
_loaded = False
_api: Any = None  # opentelemetry.trace
_propagator: Any = None
_get_context: Any = None  # opentelemetry.context.get_current
_no_sdk: tuple[type, ...] = ()
_tracer: Any = None
_NO_SLOT: Any = object()
_next_check = 0.0  # monotonic time of the next look for an SDK provider

SYSTEM = "redis"  # messaging.system: the bus is Redis Streams (no well-known value for it)


def load() -> bool:
    """Import opentelemetry once, if it is installed; every bus constructor calls this."""
    global on, _loaded, _api, _propagator, _no_sdk, _get_context
    if _loaded:
        return on
    _loaded = True
    try:
        from opentelemetry import trace
        from opentelemetry.context import get_current
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError:
        return False
    _api, _propagator, _get_context = trace, TraceContextTextMapPropagator(), get_current
    _no_sdk = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    trace.get_tracer_provider()  # a provider named by OTEL_PYTHON_TRACER_PROVIDER loads here
    on = True
    return True


def tracer() -> Any:
    """The redisbus tracer, or None while no SDK provider is configured.

    OpenTelemetry sets the global provider once per process, so a real tracer is kept for
    good. Until there is one, ``get_tracer_provider()`` would cost microseconds per call (it
    looks the environment up each time): the API module's provider slot is read instead, a
    private name, so when a future API lacks it the public call is made at most once a
    second (a clock read per call meanwhile)."""
    global _tracer, _next_check
    if _tracer is not None:
        return _tracer
    slot = getattr(_api, "_TRACER_PROVIDER", _NO_SLOT)
    if slot is None:
        return None
    if slot is _NO_SLOT:
        now = time.monotonic()
        if now < _next_check:
            return None
        _next_check = now + 1.0
    provider = _api.get_tracer_provider()
    if not isinstance(provider, _no_sdk):
        from . import __version__

        _tracer = provider.get_tracer("redisbus", __version__)
    return _tracer


# -- the trace field -----------------------------------------------------------------------


def header_of(span: Any) -> str | None:
    """The ``trace`` field for a message sent inside ``span``."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, _api.set_span_in_context(span))
    parent = carrier.get("traceparent")
    if not parent:
        return None
    state = carrier.get("tracestate")
    return f"{parent} {state}" if state else parent


def context_of(trace: str | None) -> Any:
    """The producer's span context carried by a message's ``trace`` field, or None."""
    if not trace or not on:
        return None
    parent, _, state = trace.partition(" ")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    ctx = _propagator.extract(carrier)
    sc = _api.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None


# -- spans -----------------------------------------------------------------------------------


def _attrs(operation: str, channel: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "messaging.destination.name": channel,
    }


def start_send(channel: str, sender: str, trace: str | None, batch: int = 0) -> tuple[Any, Any]:
    """(span or None, the trace field to send): a PRODUCER span when an SDK is configured."""
    t = tracer()
    if t is None:
        # no SDK here: still pass on a context someone made current (e.g. ``continued()`` on
        # a caller's traceparent), as the API's no-op tracing does
        if trace is None:
            ctx = _get_context()
            if ctx:  # empty unless something was made current
                current = _api.get_current_span(ctx)
                if current.get_span_context().is_valid:
                    trace = header_of(current)
        return None, trace
    attrs = _attrs("send", channel)
    attrs["messaging.client.id"] = sender
    if batch:
        attrs["messaging.batch.message_count"] = batch
    span = t.start_span(f"send {channel}", kind=_api.SpanKind.PRODUCER, attributes=attrs)
    return span, trace if trace is not None else header_of(span)


def end_send(span: Any, result: Any, error: BaseException | None) -> None:
    if error is not None:
        _fail(span, error)
    else:
        receipts = result if isinstance(result, list) else [result]
        ids = {getattr(r, "id", None) for r in receipts} - {None}
        if len(ids) == 1:  # one entry (a single send, a broadcast)
            span.set_attribute("messaging.message.id", ids.pop())
        refused = [r.error for r in receipts if getattr(r, "error", None) is not None]
        if refused and not ids:
            _fail(span, refused[0])
    span.end()


def with_trace(items: Sequence[Any], header: str) -> list[Any]:
    """send_many's items, each given the batch span's context unless it has a trace."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            item = {"to": item[0], "body": item[1], "trace": header}
        elif isinstance(item, dict) and item.get("trace") is None:
            item = {**item, "trace": header}
        out.append(item)
    return out


def _fail(span: Any, error: BaseException) -> None:
    span.set_attribute("error.type", getattr(error, "code", type(error).__qualname__))
    span.set_status(_api.Status(_api.StatusCode.ERROR, str(error)))


def received(
    channel: str, agent: str, messages: Sequence[Any], start_ns: int | None, operation: str
) -> None:
    """A CONSUMER ``receive`` span for messages just handed to ``agent``, linked to each
    message's producer."""
    t = tracer()
    if t is None or not messages:
        return
    attrs = _attrs("receive", channel)
    attrs["messaging.consumer.group.name"] = agent
    attrs["redisbus.operation"] = operation  # wait, read or ask
    if len(messages) == 1:
        attrs["messaging.message.id"] = messages[0].id
    else:
        attrs["messaging.batch.message_count"] = len(messages)
    links = [_api.Link(sc) for sc in (context_of(m.trace) for m in messages) if sc is not None]
    span = t.start_span(
        f"receive {channel}",
        kind=_api.SpanKind.CONSUMER,
        attributes=attrs,
        links=links,
        start_time=start_ns,
    )
    span.end()


@contextmanager
def processing(agent: Any, message: Any) -> Iterator[Any]:
    """``with processing(agent, message):`` around the work done for a message: a CONSUMER
    ``process {channel}`` span, a child of the sender's span (one trace through the handler)
    and linked to it. Does nothing without an SDK (or without opentelemetry)."""
    t = tracer() if load() else None
    if t is None:
        yield None
        return
    channel = message.channel
    attrs = _attrs("process", channel)
    attrs["messaging.consumer.group.name"] = agent.name
    attrs["messaging.message.id"] = message.id
    if message.reply_to:
        attrs["messaging.message.conversation_id"] = message.reply_to
    producer = context_of(message.trace)
    parent = None
    links = []
    if producer is not None:
        parent = _api.set_span_in_context(_api.NonRecordingSpan(producer))
        links = [_api.Link(producer)]
    with t.start_as_current_span(
        f"process {channel}",
        context=parent,
        kind=_api.SpanKind.CONSUMER,
        attributes=attrs,
        links=links,
        record_exception=True,
        set_status_on_exception=True,
    ) as span:
        yield span


@contextmanager
def continued(headers: Mapping[str, str]) -> Iterator[None]:
    """Make the W3C trace context in ``headers`` (``traceparent``/``tracestate``, e.g. of an
    HTTP request) current for the block: a message sent inside it continues that trace."""
    if not load() or "traceparent" not in headers:
        yield
        return
    from opentelemetry import context

    carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
    token = context.attach(_propagator.extract(carrier))
    try:
        yield
    finally:
        context.detach(token)


def now_ns() -> int:
    return time.time_ns()
