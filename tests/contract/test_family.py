"""Agent families (docs/concepts.md#families-and-outcomes): routing, roster, outcomes, cancellation,
loss."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from redisbus import (
    AgentClosed,
    AsyncBus,
    BudgetExceeded,
    Bus,
    BusSettings,
    InvalidInput,
    NotPermitted,
    RecipientClosed,
    RoutingRefused,
)
from tests.support.servers import Server

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}


def family(bus: Any, name: str, siblings: bool = False, **limits: Any) -> dict[str, Any]:
    """root -> (a -> (a1, a2), b -> (b1)); a second root r2."""
    ch = bus.channel(name, routing="family", siblings=siblings, **{**FAST, **limits})
    out = {"ch": ch, "root": ch.join("root"), "r2": ch.join("r2")}
    out["a"] = ch.join("a", parent="root")
    out["b"] = ch.join("b", parent="root")
    out["a1"] = ch.join("a1", parent="a")
    out["a2"] = ch.join("a2", parent="a")
    out["b1"] = ch.join("b1", parent="b")
    return out


def test_family_routing_reaches_parent_and_children_only(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    f["a"].send("root", "up")
    f["a"].send("parent", "up again")
    f["a"].send("a1", "down")
    for target in ("b", "b1"):  # sibling (siblings off), cousin
        with pytest.raises(RoutingRefused):
            f["a"].send(target, "x")
    with pytest.raises(RoutingRefused):
        f["a1"].send("root", "grandparent")
    with pytest.raises(RoutingRefused):
        f["root"].send("a1", "grandchild")
    with pytest.raises(RoutingRefused):
        f["a1"].send(f["b1"].id, "cousin by id")  # known ids do not help
    with pytest.raises(RoutingRefused):
        f["a1"].send(f["root"].id, "grandparent by id")


def test_siblings_opt_in_and_roots_are_siblings(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name, siblings=True)
    f["a1"].send("a2", "sibling ok")
    f["root"].send("r2", "roots are siblings")
    with pytest.raises(RoutingRefused):
        f["a1"].send("b1", "cousin still refused")


def test_broadcast_is_the_reachable_family_in_roster_order(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name, siblings=True)
    assert [r.to for r in f["a"].send("all", "hi")] == ["root", "b", "a1", "a2"]
    assert [m.name for m in f["a"].agents().family] == ["root", "b", "a1", "a2"]
    assert [(m.relationship, m.name) for m in f["a1"].agents().family] == [
        ("parent", "a"),
        ("sibling", "a2"),
    ]


def test_tree_rebuilds_the_whole_hierarchy(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    tree = f["ch"].tree()
    assert [(m.name, m.parent, m.depth) for m in tree] == [
        ("r2", None, 0),
        ("root", None, 0),
        ("a", "root", 1),
        ("a1", "a", 2),
        ("a2", "a", 2),
        ("b", "root", 1),
        ("b1", "b", 2),
    ]
    ids = {m.name: m.id for m in tree}
    assert len(set(ids.values())) == len(ids)


def test_only_a_parent_cancels_its_direct_child(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name, siblings=True)
    with pytest.raises(NotPermitted):
        f["b"].cancel("a")  # sibling
    with pytest.raises(NotPermitted):
        f["root"].cancel("a1")  # grandchild
    with pytest.raises(NotPermitted):
        f["a1"].cancel("a")  # child cancelling its parent
    assert {m.name: m.status for m in f["ch"].tree()}["a"] == "running"


def test_cancel_cascades_and_reports_only_the_subtree_root(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    f["root"].cancel("a", reason="changed plan")
    statuses = {m.name: m.status for m in f["ch"].tree()}
    assert statuses["a"] == statuses["a1"] == statuses["a2"] == "cancelled"
    assert statuses["b"] == statuses["b1"] == "running"
    assert f["a1"].wait(timeout=2).kind == "cancelled"
    assert f["a"].wait(timeout=2).kind == "cancelled"
    got = f["root"].wait(timeout=2)
    assert got.kind == "outcome"
    assert [(m.sender, m.subject, m.body) for m in got.messages] == [
        ("a", "cancelled", "changed plan")
    ]
    with pytest.raises(RecipientClosed):
        f["root"].send("a", "are you there")
    with pytest.raises(AgentClosed):
        f["a1"].send("a", "I was cancelled")


def test_outcomes_flow_to_the_parent_and_failure_cancels_descendants(
    bus: Any, chan_name: str
) -> None:
    f = family(bus, chan_name)
    f["b1"].complete("storyboard done")
    f["a"].fail("model quota exhausted")
    statuses = {m.name: m.status for m in f["ch"].tree()}
    assert statuses["a"] == "failed" and statuses["a1"] == statuses["a2"] == "cancelled"
    assert statuses["b1"] == "completed"
    got = f["b"].wait(timeout=2)
    assert (got.kind, got.messages[0].subject, got.messages[0].body) == (
        "outcome",
        "completed",
        "storyboard done",
    )
    f["b"].complete("b done")
    outcomes = f["root"].wait_children(timeout=5)
    assert sorted((m.sender, m.subject) for m in outcomes) == [("a", "failed"), ("b", "completed")]
    with pytest.raises(AgentClosed):
        f["a"].complete("too late")


def test_completed_agents_take_follow_ups(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    f["a1"].complete("first pass")
    r = f["a"].send("a1", "one more thing")
    assert r.status == "queued"
    assert f["a1"].wait(timeout=2).messages[0].body == "one more thing"


def test_wait_children_times_out_with_what_arrived(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    f["a1"].complete("done")
    t0 = time.monotonic()
    outcomes = f["a"].wait_children(timeout=0.5)
    assert [m.sender for m in outcomes] == ["a1"]
    assert 0.4 < time.monotonic() - t0 < 2.5


def test_team_budgets(bus: Any, chan_name: str) -> None:
    ch = bus.channel(
        chan_name, routing="family", max_depth=1, max_members=3, max_messages=2, **FAST
    )
    root = ch.join("root")
    ch.join("kid", parent="root")
    with pytest.raises(BudgetExceeded):
        ch.join("grandkid", parent="kid")
    ch.join("kid2", parent="root")
    with pytest.raises(BudgetExceeded):
        ch.join("kid3", parent="root")
    root.send("kid", "1")
    root.send("kid2", "2")
    with pytest.raises(BudgetExceeded):
        root.send("kid", "3")


def test_outcome_and_control_types_cannot_be_forged(bus: Any, chan_name: str) -> None:
    f = family(bus, chan_name)
    for t in ("control", "outcome"):
        with pytest.raises(InvalidInput):
            f["a"].send("a1", "cancel", subject="cancel", type=t)


def test_serve_runs_follow_up_turns_and_acks_after_the_handler(redis_url: str) -> None:
    bus = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    ch = bus.channel("serve", routing="family", **FAST)
    parent = ch.join("director")
    writer = ch.join("writer", parent="director")
    writer.complete("draft v1")
    seen: list[str] = []
    stop = threading.Event()

    def handle(agent: Any, msg: Any) -> None:
        seen.append(msg.body)
        # mid-handler, the message is delivered but not done
        assert parent.receipt(msg.id)[0].status in ("delivered", "read")
        agent.send("parent", f"revised: {msg.body}")
        if len(seen) == 2:
            stop.set()

    t = threading.Thread(
        target=bus.serve, args=({writer: handle},), kwargs={"stop": stop, "poll_s": 0.2}
    )
    t.start()
    r1 = parent.send("writer", "add wardrobe notes")
    r2 = parent.send("writer", "neo-80s please")
    t.join(10)
    assert seen == ["add wardrobe notes", "neo-80s please"]
    assert r1.id is not None and r2.id is not None
    assert [x.status for x in parent.receipt(r1.id)] == ["done"]
    assert [x.status for x in parent.receipt(r2.id)] == ["done"]
    replies = [m.body for m in parent.read() if m.type != "outcome"]
    assert replies == ["revised: add wardrobe notes", "revised: neo-80s please"]
    bus.close()


async def test_async_wait_releases_the_team_slot(redis_url: str) -> None:
    bus = AsyncBus.from_url(redis_url, settings=BusSettings(metrics=False))
    ch = await bus.channel("slots", routing="family", **FAST)
    slots = asyncio.Semaphore(1)
    lead = await ch.join("lead", slots=slots)
    helper = await ch.join("helper", parent="lead", slots=slots)
    await slots.acquire()  # lead is running and holds the only slot

    async def helper_turn() -> None:
        async with slots:  # can only run while lead waits
            await helper.send("parent", "ran while you waited")

    task = asyncio.create_task(helper_turn())
    res = await lead.wait(timeout=5)
    assert res.messages[0].body == "ran while you waited"
    assert slots.locked()  # lead holds its slot again after waking
    await task
    await bus.aclose()


# -- across processes ---------------------------------------------------------------------------


def spawn(url: str, channel: str, name: str, parent: str, mode: str) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.support.family_workers", url, channel, name, parent, mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    assert json.loads(p.stdout.readline()) == {"ready": name}
    return p


def test_cancel_crosses_processes_and_wakes_the_leaf_fast(redis7: Server) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("three-level", routing="family", **FAST)
    root = ch.join("root")
    middle = spawn(redis7.url, "three-level", "middle", "root", "wait")
    leaf = spawn(redis7.url, "three-level", "leaf", "middle", "wait")
    time.sleep(0.3)  # both are blocked in wait()
    # when the root cancels the middle agent
    t0 = time.time()
    root.cancel("middle", reason="stop")
    # then the leaf, in another process, returns "cancelled" well under a second later
    assert leaf.stdout is not None and middle.stdout is not None
    got = json.loads(leaf.stdout.readline())
    assert got["kind"] == "cancelled" and got["at"] - t0 < 1.0
    assert json.loads(middle.stdout.readline())["kind"] == "cancelled"
    leaf.wait(10)
    middle.wait(10)
    # and the root receives exactly one cancellation outcome
    res = root.wait(timeout=1)
    assert [(m.sender, m.type, m.subject) for m in res.messages] == [
        ("middle", "outcome", "cancelled")
    ]
    assert root.wait(timeout=0.5).kind == "timeout"
    assert {m.name: m.status for m in ch.tree()} == {
        "root": "running",
        "middle": "cancelled",
        "leaf": "cancelled",
    }
    bus.close()


def test_sigkilled_child_is_reported_lost_within_its_lease(redis7: Server) -> None:
    redis7.client().flushall()
    settings = BusSettings(metrics=False, heartbeat_s=0.1, agent_lease_s=0.6)
    bus = Bus.from_url(redis7.url, settings=settings)
    ch = bus.channel("lost", routing="family", **FAST)
    parent = ch.join("lead")
    child = spawn(redis7.url, "lost", "child", "lead", "sleep")
    time.sleep(0.3)
    assert {m.name: m.status for m in ch.tree()}["child"] == "running"
    child.kill()  # SIGKILL: no goodbye
    child.wait()
    t0 = time.monotonic()
    res = parent.wait(timeout=5)
    assert res.kind == "outcome"
    assert [(m.sender, m.subject) for m in res.messages] == [("child", "lost")]
    assert time.monotonic() - t0 < 0.6 + 0.5  # the lease plus a heartbeat or two
    assert {m.name: m.status for m in ch.tree()}["child"] == "lost"
    bus.close()
