"""Worker processes for the race tests: each opens its own Bus and hammers one channel."""

from __future__ import annotations

import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

from redisbus import Bus, BusSettings, InboxFull, RateLimited


def send_many(
    url: str, channel: str, sender: str, to: str, n: int, barrier: Barrier, out: Queue[Any]
) -> None:
    bus = Bus.from_url(url, settings=BusSettings(metrics=False))
    agent = bus.channel(channel).join(sender)
    barrier.wait()
    counts = {"ok": 0, "inbox_full": 0, "rate_limited": 0}
    for i in range(n):
        try:
            agent.send(to, f"{sender}-{i}")
            counts["ok"] += 1
        except InboxFull:
            counts["inbox_full"] += 1
        except RateLimited:
            counts["rate_limited"] += 1
    bus.close()
    out.put(counts)


def send_for(
    url: str, channel: str, sender: str, to: str, seconds: float, barrier: Barrier, out: Queue[Any]
) -> None:
    bus = Bus.from_url(url, settings=BusSettings(metrics=False, replica=f"r-{time.time_ns()}"))
    agent = bus.channel(channel).join(sender)
    barrier.wait()
    start = time.monotonic()
    ok = refused = 0
    while time.monotonic() - start < seconds:
        try:
            agent.send(to, "x")
            ok += 1
        except RateLimited:
            refused += 1
    bus.close()
    out.put({"ok": ok, "refused": refused, "start": start})


def send_alternating(
    url: str, channel: str, sender: str, to: list[str], n: int, barrier: Barrier, out: Queue[Any]
) -> None:
    """Send ``n`` messages, the i-th to ``to[i % len(to)]``; report the ids per recipient."""
    bus = Bus.from_url(url, settings=BusSettings(metrics=False))
    agent = bus.channel(channel).join(sender)
    barrier.wait()
    ids: dict[str, list[str]] = {name: [] for name in to}
    for i in range(n):
        name = to[i % len(to)]
        receipt = agent.send(name, f"{sender}-{i}")
        assert receipt.id is not None
        ids[name].append(receipt.id)
    bus.close()
    out.put(ids)


def take_until_quiet(
    url: str, channel: str, agent_name: str, min_s: float, barrier: Barrier, out: Queue[Any]
) -> None:
    """One replica of ``agent_name``: wait() and mark_done() what comes, for at least
    ``min_s`` and until three waits in a row come back empty; report what it was handed."""
    bus = Bus.from_url(url, settings=BusSettings(metrics=False, replica=f"r-{time.time_ns()}"))
    agent = bus.channel(channel).join(agent_name)
    barrier.wait()
    got: list[str] = []
    start, quiet = time.monotonic(), 0
    while time.monotonic() - start < min_s or quiet < 3:
        msgs = agent.wait(timeout=0.3).messages
        quiet = 0 if msgs else quiet + 1
        got.extend(m.id for m in msgs)
        if msgs:
            agent.mark_done(msgs)
    bus.close()
    out.put({"replica": True, "got": got})


def join_many(
    url: str, channel: str, prefix: str, n: int, barrier: Barrier, out: Queue[Any]
) -> None:
    """Join ``n`` agents named ``prefix0``.. as fast as one client can; report how many."""
    bus = Bus.from_url(url, settings=BusSettings(metrics=False, heartbeat_s=600))
    ch = bus.channel(channel)
    barrier.wait()
    for i in range(n):
        ch.join(f"{prefix}{i}")
    bus.close()
    out.put({"joined": n})


def broadcast_until(
    url: str, channel: str, sender: str, members: int, barrier: Barrier, out: Queue[Any]
) -> None:
    """Broadcast from ``sender`` until the channel has ``members`` members, and twice more;
    report, per broadcast, the members there before the call, its recipients, the members
    there after it, and its entry id; and any error."""
    import redis

    bus = Bus.from_url(url, settings=BusSettings(metrics=False, heartbeat_s=600))
    agent = bus.channel(channel).join(sender)
    parents = agent.channel.keys.parents
    r = redis.Redis.from_url(url, decode_responses=True)
    barrier.wait()
    made: list[tuple[list[Any], list[str], list[Any], Any]] = []
    errors: list[str] = []
    after_all = 0
    while after_all < 2:
        before = r.hkeys(parents)
        try:
            got = agent.send("all", f"b{len(made)}")
        except Exception as e:  # (reported, not raised: the test names it)
            errors.append(f"{type(e).__name__}: {e}")
            if len(errors) > 200:
                break
            continue
        ids = {x.id for x in got}
        made.append((before, [x.to for x in got], r.hkeys(parents), ids.pop() if ids else ""))
        after_all += len(before) >= members
    bus.close()
    out.put({"made": made, "errors": errors})


def spawn_under(
    url: str,
    channel: str,
    prefix: str,
    parents: list[str],
    n: int,
    barrier: Barrier,
    out: Queue[Any],
) -> None:
    """Join up to ``n`` agents named ``prefix0``.. as fast as one client can, each a child of
    the first of ``parents`` that has not ended; report how many."""
    from redisbus import AgentClosed

    bus = Bus.from_url(url, settings=BusSettings(metrics=False, heartbeat_s=600))
    ch = bus.channel(channel)
    barrier.wait()
    joined = refused = 0
    open_parents = list(parents)
    for i in range(n):
        if not open_parents:
            break
        try:
            ch.join(f"{prefix}{i}", parent=open_parents[0])
            joined += 1
        except AgentClosed:
            refused += 1
            open_parents.pop(0)
    bus.close()
    out.put({"joined": joined, "refused": refused})


def cancel_each(
    url: str, channel: str, parent: str, children: list[str], barrier: Barrier, out: Queue[Any]
) -> None:
    """As ``parent``, cancel each of ``children`` in turn (once the channel has grown a little);
    report the errors."""
    import redis

    bus = Bus.from_url(url, settings=BusSettings(metrics=False, heartbeat_s=600))
    agent = bus.channel(channel).join(parent)
    r = redis.Redis.from_url(url)
    barrier.wait()
    while r.hlen(agent.channel.keys.parents) < 40:
        time.sleep(0.001)
    errors: list[str] = []
    for child in children:
        try:
            agent.cancel(child, "stop")
        except Exception as e:  # (reported, not raised: the test names it)
            errors.append(f"{type(e).__name__}: {e}")
    bus.close()
    out.put({"errors": errors})


def role_of_joining(what: str, args: tuple[Any, ...], barrier: Barrier, out: Queue[Any]) -> None:
    """``join_many``, ``broadcast_until``, ``spawn_under`` or ``cancel_each``, by ``what``."""
    work: Any = {
        "join": join_many,
        "broadcast": broadcast_until,
        "spawn": spawn_under,
        "cancel": cancel_each,
    }[what]
    work(*args, barrier, out)


def role(
    send: tuple[str, str, str, list[str], int] | None,
    serve: tuple[str, str, str, float],
    barrier: Barrier,
    out: Queue[Any],
) -> None:
    """A sender (``send``: send_alternating's arguments) or a replica (``serve``)."""
    if send is not None:
        send_alternating(*send, barrier, out)
    else:
        take_until_quiet(*serve, barrier, out)


def run_all(target: Any, arglists: list[tuple[Any, ...]]) -> list[Any]:
    """Run target(*args, barrier, queue) in one spawned process each; return their results."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(arglists))
    queue: Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, queue)) for a in arglists]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0, p.exitcode
    return results
