"""The synchronous face: ``Bus`` -> ``Channel`` -> ``Agent``.

The code lives in ``redisbus/_sync``, generated from the async face (``redisbus/_async``) by
``scripts/unasync.py``; see docs/architecture.md.

Public API: its ``__all__``, also importable from ``redisbus`` (docs/reference/api.md).
"""

from ._sync.agent import Agent
from ._sync.bus import Bus
from ._sync.channel import Channel

__all__ = ["Agent", "Bus", "Channel"]
