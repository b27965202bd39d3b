"""What the type checker knows of the public API: checked by mypy (tests/codebase/test_public_api.py
runs it on this file), never run. ``assert_type`` is exact, so an ``Any`` where a type should
be (a return type left open, a limit taken as ``**kwargs: Any``) fails the check; each
``type: ignore`` must be needed (``warn_unused_ignores``), so a call that should be refused
and is not fails it too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_type

from redisbus import (
    Agent,
    AsyncAgent,
    AsyncBus,
    Bus,
    ChannelConfig,
    ChannelLimits,
    Message,
    Receipt,
    SendOptions,
)


def sync_face(bus: Bus, agent: Agent, name: str, names: list[str], either: str | list[str]) -> None:
    # send: one Receipt for one name, a list for "all" or a list of names
    assert_type(agent.send("bob", "hi"), Receipt)
    assert_type(agent.send("parent", "hi", subject="s", priority=2), Receipt)
    assert_type(agent.send(name, "hi"), Receipt)
    assert_type(agent.send("all", "hi"), list[Receipt])
    assert_type(agent.send(["a", "b"], "hi"), list[Receipt])
    assert_type(agent.send(("a", "b"), "hi"), list[Receipt])
    assert_type(agent.send(names, "hi", durable=True), list[Receipt])
    assert_type(agent.send(either, "hi"), Receipt | list[Receipt])
    some: Sequence[str] = names
    assert_type(agent.send(some, "hi"), Receipt | list[Receipt])
    assert_type(agent.send("bob", "hi").id, str | None)
    assert_type(agent.send_many([("bob", "hi")]), list[Receipt | list[Receipt]])
    agent.send("bob", "hi", priority="high")  # type: ignore[call-overload]
    agent.send("bob", "hi", subjet="s")  # type: ignore[call-overload]
    options: SendOptions = {"subject": "s", "priority": 2}
    assert_type(agent.send("bob", "hi", **options), Receipt)
    assert_type(agent.ask("bob", "hi", timeout=5, subject="s"), Message)
    agent.ask("bob", "hi", priority="high")  # type: ignore[arg-type]

    # channel limits: named, typed, and on the stored configuration as attributes
    ch = bus.channel("team", inbox_cap=3, lease_s=0.5, auto_reply_deny=["bot"])
    assert_type(ch.config, ChannelConfig)
    assert_type(ch.config.inbox_cap, int | None)
    assert_type(ch.config.lease_s, float | None)
    assert_type(ch.configure(max_deliveries=2), ChannelConfig)
    limits: ChannelLimits = {"pair_rate_burst": 10, "pair_rate_per_s": 5.0}
    bus.channel("team", **limits)
    bus.channel("team", inbox_cap="3")  # type: ignore[arg-type]
    bus.channel("team", inbox_kap=3)  # type: ignore[call-arg]
    ch.configure(lease="1s")  # type: ignore[call-arg]
    ch.config.no_such_limit  # type: ignore[attr-defined]  # noqa: B018


async def async_face(bus: AsyncBus, agent: AsyncAgent, name: str) -> None:
    assert_type(await agent.send("bob", "hi"), Receipt)
    assert_type(await agent.send(name, "hi"), Receipt)
    assert_type(await agent.send("all", "hi"), list[Receipt])
    assert_type(await agent.send(["a", "b"], "hi"), list[Receipt])
    assert_type(await agent.send_many([("bob", "hi")]), list[Receipt | list[Receipt]])
    ch = await bus.channel("team", max_members=5)
    assert_type(ch.config.max_members, int | None)
    assert_type(await ch.configure(retention_s=60.0), ChannelConfig)
    await bus.channel("team", max_members=5.5)  # type: ignore[arg-type]
