"""The cost of tracing: a case run in a fresh process per OpenTelemetry setup.

- ``off``: opentelemetry cannot be imported (as when the ``otel`` extra is not installed);
- ``api``: the API is there, no SDK is configured (the API's no-op tracing);
- ``sdk``: an SDK ``TracerProvider`` with a ``BatchSpanProcessor`` and an exporter that drops
  the spans, so what is measured is making and ending them, not shipping them.

A tracer provider can be set once per process, so each setup runs in a spawned process of its
own; processes a case spawns itself (the wake-up's sender) inherit the setup through
``REDISBUS_BENCH_OTEL`` and call :func:`apply` first.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import Ctx, Metrics

ENV = "REDISBUS_BENCH_OTEL"
MODES = ("off", "api", "sdk")


def apply() -> None:
    """Set this process up for the tracing mode named in ``REDISBUS_BENCH_OTEL`` (if any)."""
    mode = os.environ.get(ENV)
    if mode == "off":
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]  # import fails
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropped(SpanExporter):
            def export(self, spans: Sequence[Any]) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        trace.set_tracer_provider(provider)


def _child(mode: str, fn: Callable[[Ctx], Metrics], ctx: Ctx, out: Any) -> None:
    os.environ[ENV] = mode
    apply()
    try:
        from redisbus import _otel

        metrics = fn(ctx)
        traced = _otel.load() and _otel.tracer() is not None
        expected = {"off": False, "api": False, "sdk": True}[mode]
        if traced != expected or (_otel.on != (mode != "off")):
            raise RuntimeError(f"tracing mode {mode!r} not in effect")
        out.send((metrics, ctx.notes, None))
    except Exception as e:  # reported by the parent
        out.send(({}, [], f"{type(e).__name__}: {e}"))


def isolated(mode: str, fn: Callable[[Ctx], Metrics]) -> Callable[[Ctx], Metrics]:
    """``fn`` run in a fresh process set up for ``mode``."""

    def run(ctx: Ctx) -> Metrics:
        spawn = mp.get_context("spawn")
        parent, child = spawn.Pipe(duplex=False)
        # a name space of its own, under the run's prefix (so the run's reset drops it)
        sub = dataclasses.replace(ctx, run_id=f"{ctx.run_id}{mode}", notes=[])
        proc = spawn.Process(target=_child, args=(mode, fn, sub, child))
        proc.start()
        try:
            if not parent.poll(1_100):
                raise RuntimeError(f"tracing mode {mode!r}: no result")
            metrics, notes, error = parent.recv()
        finally:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        if error:
            raise RuntimeError(error)
        for n in notes:
            ctx.note(n)
        return metrics  # type: ignore[no-any-return]

    run.__name__ = f"{getattr(fn, '__name__', 'case')}_{mode}"
    return run
