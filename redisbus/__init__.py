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
"""

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
from ._model import ChildrenResult, Member, Message, Receipt, Roster, WaitResult
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
    "ChannelMismatch",
    "ChannelPaused",
    "ChildrenResult",
    "CircuitOpen",
    "ClockSkew",
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
    "ServerFull",
    "TooLarge",
    "UnknownAgent",
    "UnknownChannel",
    "WaitResult",
]

__version__ = "0.1.0"
