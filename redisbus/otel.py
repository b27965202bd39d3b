"""OpenTelemetry for code that handles messages itself (``redisbus[otel]``; see docs/tracing.md).

``bus.serve`` opens a ``process {channel}`` span around each handler on its own; around
work done after a ``wait()`` of your own, use::

    from redisbus.otel import processing

    for msg in agent.wait(timeout=30).messages:
        with processing(agent, msg):      # a child of the sender's span, linked to it
            handle(msg)

Without opentelemetry (or without an SDK) it does nothing.

Public API: ``processing`` (docs/reference/api.md).
"""

from ._otel import processing

__all__ = ["processing"]
