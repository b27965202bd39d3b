"""The asynchronous face: ``AsyncBus`` -> ``AsyncChannel`` -> ``AsyncAgent`` (same names,
awaited; ``aclose()`` and ``async with``).

The code lives in ``redisbus/_async``, the one source of both faces; see docs/architecture.md.

Public API: its ``__all__``, also importable from ``redisbus`` (docs/reference/api.md).
"""

from ._async.agent import AsyncAgent
from ._async.bus import AsyncBus
from ._async.channel import AsyncChannel

__all__ = ["AsyncAgent", "AsyncBus", "AsyncChannel"]
