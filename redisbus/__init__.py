"""redisbus: a message bus on Redis Streams for fleets of AI agents.

A parent and the subagents it spawns, siblings, and agents on other hosts talk directly:
receipts, read/unread tracking, blocking waits, inbox caps, rate limits and loop protection
enforced atomically in Lua, crash recovery, and Prometheus metrics of delivery latency.

    from redisbus import Bus
    bus = Bus.embedded()                       # or Bus.from_url("redis://...")
    ch = bus.channel("anime-project-1")
    director, writer = ch.join("director"), ch.join("writer", parent="director")
    writer.send("director", "Script draft v1 ready", subject="draft")
    print(director.wait(timeout=5).messages)

Everything public is in ``__all__`` and importable from here; each of those names says it is
``redisbus.<name>`` (its ``__module__``), wherever it is defined. docs/reference/api.md, "What
is public", lists the public modules besides this one.
"""

from typing import get_type_hints as _type_hints

from ._channels import ChannelConfig, ChannelLimits, SweepReport
from ._errors import (
    AgentClosed,
    AskTimeout,
    BudgetExceeded,
    BusClosed,
    BusConnectionError,
    ChainTooDeep,
    ChannelMismatch,
    ChannelPaused,
    CircuitOpen,
    ClockSkew,
    DeadLettered,
    InboxFull,
    InvalidInput,
    LimitExceeded,
    LoopRefused,
    MessageRejected,
    NotPermitted,
    RateLimited,
    RecipientClosed,
    RedisbusError,
    RoutingRefused,
    ServerFull,
    TooLarge,
    UnknownAgent,
    UnknownChannel,
)
from ._model import (
    ChildrenResult,
    DeadLetter,
    Member,
    Message,
    Receipt,
    Roster,
    SendOptions,
    WaitResult,
)
from ._settings import BusSettings
from .aio import AsyncAgent, AsyncBus, AsyncChannel
from .bus import Agent, Bus, Channel

__all__ = [
    "Agent",
    "AgentClosed",
    "AskTimeout",
    "AsyncAgent",
    "AsyncBus",
    "AsyncChannel",
    "BudgetExceeded",
    "Bus",
    "BusClosed",
    "BusConnectionError",
    "BusSettings",
    "ChainTooDeep",
    "Channel",
    "ChannelConfig",
    "ChannelLimits",
    "ChannelMismatch",
    "ChannelPaused",
    "ChildrenResult",
    "CircuitOpen",
    "ClockSkew",
    "DeadLetter",
    "DeadLettered",
    "InboxFull",
    "InvalidInput",
    "LimitExceeded",
    "LoopRefused",
    "Member",
    "Message",
    "MessageRejected",
    "NotPermitted",
    "RateLimited",
    "Receipt",
    "RecipientClosed",
    "RedisbusError",
    "Roster",
    "RoutingRefused",
    "SendOptions",
    "ServerFull",
    "SweepReport",
    "TooLarge",
    "UnknownAgent",
    "UnknownChannel",
    "WaitResult",
]

__version__ = "0.1.0"

# Each public name is shown, pickled and documented as redisbus.<name>, not by the private
# module that defines it (as httpx does): a module may move without changing what users see.
# Its own annotations are resolved first, where the defining module's names are at hand, so
# typing.get_type_hints (pydantic, FastAPI, cattrs) still reads them afterwards.
__locals = locals()
for __name in __all__:
    __obj = __locals[__name]
    if isinstance(__obj, type) and "__annotations__" in vars(__obj):
        __hints = _type_hints(__obj, include_extras=True)
        __obj.__annotations__ = {k: __hints[k] for k in vars(__obj)["__annotations__"]}
        for __field in getattr(__obj, "__dataclass_fields__", {}).values():
            __field.type = __hints[__field.name]
    setattr(__obj, "__module__", "redisbus")  # noqa: B010
del __locals, __name, __obj, __hints, __field
