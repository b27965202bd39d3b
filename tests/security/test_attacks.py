"""Attacks on identity (docs/security.md#attacks-and-outcomes), each made with raw redis-py against
a real redis-server and a Redis Cluster (channels on several shards): forged, redirected and
replayed entries, replayed control messages and outcomes, names not owned, keys used off
their channels, revoked keys. Each is refused, and leaves inbox counts, statuses and
streams as they were, apart from the rejected entry being acknowledged. Also
docs/security.md#counters-and-repair: a dropped entry counts the inbox down and shows ``rejected``
on the sender's receipt."""

from __future__ import annotations

import base64
import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from redisbus import Bus, BusSettings, NotPermitted
from redisbus._signing import signer_for
from redisbus._trust import generate_key
from redisbus.metrics import BusMetrics

pytest_plugins = ["tests.support.cluster_servers"]

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}
_turn = itertools.count()


class Env:
    """A Redis (standalone or Cluster), a raw client on it, and per-host keys with a trust
    list: host-a speaks for "a-*" agents and the director, host-b for "b-*", both on "atk-*"
    channels; host-c only on "other-*" channels."""

    def __init__(self, url: str, cluster: bool, raw: Any, tmp: Path, shards: list[str]):
        self.url, self.cluster, self.raw, self.tmp, self.shards = url, cluster, raw, tmp, shards
        self.trust = tmp / "trust.json"
        self.doc: dict[str, Any] = {"keys": {}, "revoked": []}
        self.key_files: dict[str, str] = {}
        for host, channels, agents in (
            ("host-a", ["atk-*"], ["a-*", "director"]),
            ("host-b", ["atk-*"], ["b-*"]),
            ("host-c", ["other-*"], ["c-*"]),
        ):
            path = str(tmp / f"{host}.pem")
            public = generate_key(path)
            self.key_files[host] = path
            self.doc["keys"][host] = {"public": public, "channels": channels, "agents": agents}
        self.write_trust()
        self.buses: list[Bus] = []

    def write_trust(self) -> None:
        self.trust.write_text(json.dumps(self.doc))
        # a later write within the same mtime tick must still be seen
        st = self.trust.stat()
        os.utime(self.trust, ns=(st.st_atime_ns, st.st_mtime_ns + next(_turn) * 10_000_000))

    def settings(self, host: str, **kw: Any) -> BusSettings:
        return BusSettings(
            metrics=False,
            host=host,
            trust_file=str(self.trust),
            signing_key_file=self.key_files[host],
            **kw,
        )

    def bus(self, host: str, **kw: Any) -> Bus:
        b = Bus.from_url(self.url, cluster=self.cluster, settings=self.settings(host, **kw))
        self.buses.append(b)
        return b

    def channel_name(self) -> str:
        return self.shards[next(_turn) % len(self.shards)] + f"-{next(_turn)}"


@pytest.fixture(params=["standalone", "cluster"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Env]:
    if request.param == "standalone":
        srv = request.getfixturevalue("redis7")
        srv.client().flushall()
        e = Env(srv.url, False, srv.client(), tmp_path, ["atk-s"])
    else:
        cluster = request.getfixturevalue("redis_cluster")
        cluster.wait_healthy()
        cluster.flush()
        # one channel prefix per primary: the tests' channels land on every shard
        shards = [cluster.channel_on(p, prefix="atk-") for p in cluster.primaries()]
        e = Env(cluster.url, True, cluster.client(), tmp_path, shards)
    yield e
    for b in e.buses:
        b.close()


def snapshot(raw: Any, ch: Any) -> dict[str, Any]:
    k = ch.keys
    groups = {g["name"]: g["pending"] for g in raw.xinfo_groups(k.stream)}
    return {
        "inbox": {n: int(v) for n, v in raw.hgetall(k.inbox).items()},
        "status": raw.hgetall(k.status),
        "pending": groups,
    }


def forge(raw: Any, ch: Any, fields: Any) -> str:
    """XADD ``fields`` to the channel's stream and ring the doorbell of each agent they
    address, as an attacker with raw write access does to reach a waiting agent (a wait
    blocks on its wakeup and is handed what its bell names: an entry no bell names is never
    handed to it)."""
    entry_id = str(raw.xadd(ch.keys.stream, fields))
    for name in str(fields.get("t", "")).split("\n"):
        if name and raw.rpush(ch.keys.bell(name), entry_id) == 1:
            raw.rpush(ch.keys.wakeup(name), "")
    return entry_id


def copy_of(raw: Any, ch: Any, entry_id: str, **changes: str) -> str:
    """XADD a copy of entry ``entry_id`` with ``changes`` to its fields (an attacker with raw
    write access and no key), its recipients' bells rung."""
    ((_, fields),) = raw.xrange(ch.keys.stream, entry_id, entry_id)
    fields.update(changes)
    return forge(raw, ch, fields)


def mark_of(raw: Any, ch: Any, entry_id: str, agent: str) -> str:
    return str(raw.hget(ch.keys.marks, f"{entry_id}\n{agent}") or "")


def test_a_forged_entry_without_a_key_is_refused(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    ch.join("director")
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    before = snapshot(env.raw, ch)
    unsigned = str(forge(env.raw, ch, {"f": "a-writer", "t": "a-reader", "b": "pay"}))
    fake = forge(
        env.raw,
        ch,
        {"f": "a-writer", "t": "a-reader", "b": "pay", "g": "host-a:ab:00:one:a-reader"},
    )
    assert reader.wait(timeout=0.5).kind == "timeout"
    writer.send("a-reader", "genuine")
    got = reader.wait(timeout=5)
    assert [m.body for m in got.messages] == ["genuine"]
    reader.mark_done(got.messages[0])
    reader.flush()
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, unsigned, "a-reader").endswith(":unsigned")
    assert mark_of(env.raw, ch, fake, "a-reader").endswith(":bad_signature")


def test_a_signed_entry_redirected_to_another_agent_is_refused(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    b_reader, c_reader = ch.join("a-b"), ch.join("a-c")
    writer = ch.join("a-writer")
    r = writer.send("a-b", "for b only")
    before = snapshot(env.raw, ch)
    assert r.id is not None
    forged = copy_of(env.raw, ch, r.id, t="a-c")
    assert c_reader.wait(timeout=0.5).kind == "timeout"
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, forged, "a-c").endswith(":misaddressed")
    assert [m.body for m in b_reader.wait(timeout=5).messages] == ["for b only"]


def test_an_exact_replay_is_refused_and_shows_rejected(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    r = writer.send("a-reader", "once")
    got = reader.wait(timeout=5)
    assert [m.body for m in got.messages] == ["once"]
    reader.mark_done(got.messages[0])
    before = snapshot(env.raw, ch)
    env.raw.hincrby(ch.keys.inbox, "a-reader", 1)  # the attacker counts its copy in, too
    assert r.id is not None
    copy = copy_of(env.raw, ch, r.id)
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, copy, "a-reader").endswith(":replay")
    (receipt,) = writer.receipt(copy)
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.reason == "replay"  # type: ignore[attr-defined]


def test_a_replay_is_refused_by_read_and_hidden_from_list(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    r = writer.send("a-reader", "once")
    assert [m.body for m in reader.read()] == ["once"]
    assert r.id is not None
    reader.mark_done(r.id)
    before = snapshot(env.raw, ch)
    env.raw.hincrby(ch.keys.inbox, "a-reader", 1)
    copy = copy_of(env.raw, ch, r.id)
    assert [m.id for m in reader.list(filter_by="all")] == [r.id]
    assert reader.read() == []
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, copy, "a-reader").endswith(":replay")


def test_a_replayed_cancel_cancels_nobody(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), routing="family", **FAST)
    director = ch.join("director")
    one, two = ch.join("a-one", parent="director"), ch.join("a-two", parent="director")
    director.cancel("a-one", reason="changed plan")
    assert one.wait(timeout=5).kind == "cancelled"
    ((ctl_id, _),) = [(i, f) for i, f in env.raw.xrange(ch.keys.stream) if f.get("k") == "control"]
    before = snapshot(env.raw, ch)
    env.raw.hincrby(ch.keys.inbox, "a-two", 1)
    copy_of(env.raw, ch, ctl_id, t="a-two")
    assert two.wait(timeout=0.5).kind == "timeout"
    two.flush()
    after = snapshot(env.raw, ch)
    assert after == before
    assert after["status"]["a-two"] != "cancelled"


def test_a_replayed_outcome_reaches_the_parent_once(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), routing="family", **FAST)
    director = ch.join("director")
    child = ch.join("a-child", parent="director")
    child.complete("all done")
    got = director.wait(timeout=5)
    assert got.kind == "outcome"
    director.mark_done(got.messages[0])
    before = snapshot(env.raw, ch)
    env.raw.hincrby(ch.keys.inbox, "director", 1)
    copy_of(env.raw, ch, got.messages[0].id)
    assert director.wait(timeout=0.5).kind == "timeout"
    director.flush()
    assert snapshot(env.raw, ch) == before


def test_an_entry_no_bell_names_never_reaches_a_waiting_agent(env: Env) -> None:
    # given: a reader past its first wait (which fetches what its group holds), and an
    # attacker's raw XADD addressed to it, counted in, with no ring of its bell
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    assert reader.wait(timeout=0.2).kind == "timeout"
    before = snapshot(env.raw, ch)
    forged = str(env.raw.xadd(ch.keys.stream, {"f": "a-writer", "t": "a-reader", "b": "pay"}))
    # when: the reader waits
    res = reader.wait(timeout=0.5)
    # then: it is not woken by it, is never handed it, and nothing changed; the next genuine
    # message comes alone
    assert res.kind == "timeout"
    reader.flush()
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, forged, "a-reader") == ""
    writer.send("a-reader", "genuine")
    assert [m.body for m in reader.wait(timeout=5).messages] == ["genuine"]
    # and once the reader's cursor is past it, its receipt says it was never handed over (not
    # done: a copy fetched with a genuine message showed done)
    (receipt,) = writer.receipt(forged)
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.reason == "passed_over"  # type: ignore[attr-defined]
    assert receipt.delivered_at is None and receipt.done_at is None


@pytest.mark.parametrize("path", ["read", "wait"])
def test_a_forged_entry_shows_rejected_when_the_call_that_found_it_returns(
    env: Env, path: str
) -> None:
    # given: a genuine message read and done, then a copy with another body and nonce (its
    # signature no longer matches), its recipient's bell rung
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    r = writer.send("a-reader", "genuine")
    reader.mark_done(reader.wait(timeout=5).messages)
    assert r.id is not None
    ((_, fields),) = env.raw.xrange(ch.keys.stream, r.id, r.id)
    kid, _, sig, rest = fields["g"].split(":", 3)
    forged = copy_of(env.raw, ch, r.id, b="evil", g=":".join([kid, "cd" * 12, sig, rest]))
    # when: one call finds it (and nothing else is called after it)
    if path == "read":
        assert reader.read() == []
    else:
        assert reader.wait(timeout=0.5).kind == "timeout"
    # then: the sender's receipt says rejected at once, and the inbox is counted down
    (receipt,) = writer.receipt(forged)
    assert receipt.status == "rejected" and receipt.error is not None
    assert receipt.error.reason == "bad_signature"  # type: ignore[attr-defined]
    assert mark_of(env.raw, ch, forged, "a-reader").endswith(":bad_signature")


def test_a_host_cannot_join_under_a_name_it_does_not_own(env: Env) -> None:
    a, b = env.bus("host-a"), env.bus("host-b")
    name = env.channel_name()
    ch_a = a.channel(name, **FAST)
    ch_a.join("a-alice")
    before = snapshot(env.raw, ch_a)
    with pytest.raises(NotPermitted):
        b.channel(name).join("a-alice")
    with pytest.raises(NotPermitted):
        b.channel(name).join("a-alice", replica="host-b/1")
    assert snapshot(env.raw, ch_a) == before
    assert b.channel(name).join("b-bob").name == "b-bob"  # its own names work


def test_a_key_is_refused_on_a_channel_it_is_not_allowed_on(env: Env) -> None:
    a, c = env.bus("host-a"), env.bus("host-c")
    name = env.channel_name()
    ch = a.channel(name, **FAST)
    reader = ch.join("a-reader")
    with pytest.raises(NotPermitted):
        c.channel(name).join("c-carol")
    # host-c's key, used by hand on this channel for a name it owns elsewhere
    signer = signer_for(env.settings("host-c"))
    fields = {"f": "c-carol", "t": "a-reader", "b": "hello"}
    g, n = signer.sign(name, fields, mode="one", recipients=["a-reader"])
    before = snapshot(env.raw, ch)
    forged = str(forge(env.raw, ch, {**fields, "g": g, "n": n}))
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, forged, "a-reader").endswith(":not_allowed")


def test_a_revoked_key_is_refused_without_a_restart(env: Env) -> None:
    a, b = env.bus("host-a"), env.bus("host-b")
    name = env.channel_name()
    ch_b = b.channel(name, **FAST)
    reader = ch_b.join("b-reader")
    writer = a.channel(name).join("a-writer")
    writer.send("b-reader", "before revocation")
    assert [m.body for m in reader.wait(timeout=5).messages] == ["before revocation"]
    r = writer.send("b-reader", "after revocation")
    env.doc["revoked"] = ["host-a"]
    env.write_trust()
    time.sleep(1.1)  # the trust file is looked at once a second
    before_inbox = int(env.raw.hget(ch_b.keys.inbox, "b-reader"))
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert int(env.raw.hget(ch_b.keys.inbox, "b-reader")) == before_inbox - 1
    assert r.id is not None
    (receipt,) = writer.receipt(r.id)
    assert receipt.status == "rejected"
    assert receipt.error is not None and "revoked" in str(receipt.error)
    with pytest.raises(NotPermitted):  # and host-a may no longer join as its agents
        a.channel(name).join("a-new")


def test_a_signature_made_outside_the_window_is_refused(env: Env) -> None:
    bus = env.bus("host-a")
    name = env.channel_name()
    ch = bus.channel(name, **FAST)
    reader = ch.join("a-reader")
    signer = signer_for(env.settings("host-a"))
    fields = {"f": "a-writer", "t": "a-reader", "b": "signed two minutes ago"}
    old = str(int(time.time() * 1000) - 120_000)
    g, n = signer.sign(name, fields, mode="one", recipients=["a-reader"], ts=old)
    forged = str(forge(env.raw, ch, {**fields, "g": g, "n": n}))
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert mark_of(env.raw, ch, forged, "a-reader").endswith(":stale")


def test_the_shared_hmac_mode_has_the_same_rules(env: Env) -> None:
    keys = {"k1": "fleet-secret"}
    bus = Bus.from_url(
        env.url, cluster=env.cluster, settings=BusSettings(metrics=False, signing_keys=keys)
    )
    env.buses.append(bus)
    ch = bus.channel(env.channel_name(), **FAST)
    b, c, writer = ch.join("b"), ch.join("c"), ch.join("writer")
    r = writer.send("b", "for b")
    assert [m.body for m in b.wait(timeout=5).messages] == ["for b"]
    before = snapshot(env.raw, ch)
    assert r.id is not None
    redirected = copy_of(env.raw, ch, r.id, t="c")
    replayed = copy_of(env.raw, ch, r.id)
    assert c.wait(timeout=0.5).kind == "timeout"
    assert b.wait(timeout=0.5).kind == "timeout"
    b.flush()
    c.flush()
    assert snapshot(env.raw, ch) == before
    assert mark_of(env.raw, ch, redirected, "c").endswith(":replay")
    assert mark_of(env.raw, ch, replayed, "b").endswith(":replay")


def test_rejected_entries_count_the_inbox_down(env: Env) -> None:
    """docs/security.md#counters-and-repair: three unsigned sends to an inbox of 3 no longer fill it
    for good."""
    signed = env.bus("host-a")
    unsigned = Bus.from_url(env.url, cluster=env.cluster, settings=BusSettings(metrics=False))
    env.buses.append(unsigned)
    name = env.channel_name()
    ch = signed.channel(name, inbox_cap=3, **FAST)
    reader = ch.join("a-reader")
    sender = unsigned.channel(name).join("x-sender")
    sent = [sender.send("a-reader", f"unsigned {i}") for i in range(3)]
    assert int(env.raw.hget(ch.keys.inbox, "a-reader")) == 3
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert int(env.raw.hget(ch.keys.inbox, "a-reader")) == 0
    for r in sent:
        assert r.id is not None
        (receipt,) = sender.receipt(r.id)
        assert receipt.status == "rejected"
        assert receipt.error is not None and receipt.error.reason == "unsigned"  # type: ignore[attr-defined]
    ch.join("a-writer").send("a-reader", "now it fits")
    assert [m.body for m in reader.wait(timeout=5).messages] == ["now it fits"]


def test_the_rejections_are_counted_by_reason(redis7: Any, tmp_path: Path) -> None:
    redis7.client().flushall()
    e = Env(redis7.url, False, redis7.client(), tmp_path, ["atk-m"])
    registry = CollectorRegistry()
    bus = Bus.from_url(
        e.url, settings=e.settings("host-a"), metrics=BusMetrics(registry, host="host-a")
    )
    try:
        ch = bus.channel("atk-metrics", **FAST)
        reader, writer = ch.join("a-reader"), ch.join("a-writer")
        r = writer.send("a-reader", "x")
        reader.wait(timeout=5)
        assert r.id is not None
        copy_of(e.raw, ch, r.id)
        forge(e.raw, ch, {"f": "a-writer", "t": "a-reader", "b": "forged"})
        assert reader.wait(timeout=0.5).kind == "timeout"
        sample = registry.get_sample_value
        for reason in ("replay", "unsigned"):
            labels = {"reason": reason, "host": "host-a"}
            assert sample("redisbus_messages_rejected_total", labels) == 1.0
    finally:
        bus.close()


def test_public_keys_in_the_trust_list_are_base64_of_32_bytes(tmp_path: Path) -> None:
    public = generate_key(str(tmp_path / "k.pem"))
    assert len(base64.b64decode(public)) == 32
    assert (tmp_path / "k.pem").stat().st_mode & 0o777 == 0o600


# -- hostile bytes and identity at the edges (docs/security.md#what-a-receiver-refuses) ------


def counts_hold(raw: Any, ch: Any) -> None:
    """No inbox count below zero or below what its agent's group holds pending."""
    pending = {g["name"]: int(g["pending"]) for g in raw.xinfo_groups(ch.keys.stream)}
    for name, n in raw.hgetall(ch.keys.inbox).items():
        assert int(n) >= max(0, pending.get(name, 0)), (name, n, pending)


@pytest.mark.parametrize(
    "poison",
    [{"x": "abc"}, {"x": "inf"}, {"p": "high"}, {"d": "-1"}, {"n": "soon"}, {"r": "nope"}],
    ids=lambda p: "-".join(f"{k}={v}" for k, v in p.items()),
)
def test_a_malformed_entry_is_rejected_on_every_path_and_wedges_nobody(
    env: Env, poison: dict[str, str]
) -> None:
    # given: a signed channel, and a raw entry for the reader whose field is no number
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    bad = str(forge(env.raw, ch, {"f": "a-writer", "t": "a-reader", "b": "x", **poison}))

    # when: every reading path meets it: list, mark_done's fetch-ahead (which takes the bad
    # entry into the reader's pending list with the genuine one after it), wait (which hands
    # out that pending list first), read, a sweep, a fresh replica
    first = writer.send("a-reader", "listed first")
    assert [m.id for m in reader.list(filter_by="all")] == [first.id]
    assert first.id is not None
    assert reader.mark_done(first.id)
    assert reader.read() == []
    assert reader.wait(timeout=0.3).kind == "timeout"
    other = env.bus("host-a").channel(ch.name).join("a-reader", replica="fresh")
    assert other.wait(timeout=0.3).kind == "timeout"
    reader.flush()
    assert mark_of(env.raw, ch, bad, "a-reader").endswith(":malformed")
    counts_hold(env.raw, ch)

    # then: it was finished (rejected): the sweep trims it with the done one before it, and
    # what comes after gets through
    assert ch.sweep().trimmed == 2
    writer.send("a-reader", "genuine")
    got = reader.wait(timeout=5)
    assert [m.body for m in got.messages] == ["genuine"] and got.messages[0].verified


@pytest.mark.parametrize("signing", ["off", "on"])
def test_a_malformed_entry_never_raises_from_a_reader_with_signing_off_or_on(
    redis7: Any, tmp_path: Path, signing: str
) -> None:
    redis7.client().flushall()
    e = Env(redis7.url, False, redis7.client(), tmp_path, ["atk-p"])
    s = e.settings("host-a") if signing == "on" else BusSettings(metrics=False, host="host-a")
    bus = Bus.from_url(e.url, settings=s)
    try:
        ch = bus.channel("atk-poison", **FAST)
        reader, writer = ch.join("a-reader"), ch.join("a-writer")
        bad = forge(e.raw, ch, {"f": "a-writer", "t": "a-reader", "x": "abc", "b": "b"})
        assert reader.list(filter_by="all") == []
        assert reader.read() == []
        assert reader.wait(timeout=0.3).kind == "timeout"
        reader.flush()
        assert mark_of(e.raw, ch, bad, "a-reader").endswith(":malformed")
        assert ch.dead_letters() == []
        writer.send("a-reader", "after")
        assert [m.body for m in reader.wait(timeout=5).messages] == ["after"]
        counts_hold(e.raw, ch)
    finally:
        bus.close()


def test_rejected_entries_are_trimmed_and_never_open_the_inbox_cap(env: Env) -> None:
    # given: a reader with an inbox cap of 3; five genuine messages done; three unsigned raw
    # entries that nobody counted in (the attacker does not bother)
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), inbox_cap=3, **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    for i in range(5):
        writer.send("a-reader", f"m{i}")
        reader.mark_done(reader.wait(timeout=5).messages)
    for i in range(3):
        forge(env.raw, ch, {"f": "a-writer", "t": "a-reader", "b": f"forged {i}"})
    assert reader.wait(timeout=0.3).kind == "timeout"
    reader.flush()

    # when: the janitor sweeps
    report = ch.sweep()

    # then: all eight are finished and trimmed, and the cap still admits exactly 3
    assert report.trimmed == 8
    counts_hold(env.raw, ch)
    assert int(env.raw.hget(ch.keys.inbox, "a-reader")) == 0
    for i in range(3):
        writer.send("a-reader", f"fits {i}")
    with pytest.raises(Exception, match="inbox"):
        writer.send("a-reader", "one too many")


def test_a_cancel_copied_to_another_agent_cancels_nobody(env: Env) -> None:
    # given: a cancel of a-one that a-one has not fetched yet (no replay record of it)
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), routing="family", **FAST)
    director = ch.join("director")
    ch.join("a-one", parent="director")
    two = ch.join("a-two", parent="director")
    director.cancel("a-one", reason="changed plan")
    ((ctl_id, _),) = [(i, f) for i, f in env.raw.xrange(ch.keys.stream) if f.get("k") == "control"]

    # when: the attacker re-addresses a copy of it to a-two
    copy = copy_of(env.raw, ch, ctl_id, t="a-two")

    # then: a-two is not cancelled, and goes on receiving
    assert two.wait(timeout=0.5).kind == "timeout"
    two.flush()
    assert env.raw.hget(ch.keys.status, "a-two") == "running"
    assert mark_of(env.raw, ch, copy, "a-two").endswith(":misaddressed")
    director.send("a-two", "carry on")
    assert [m.body for m in two.wait(timeout=5).messages] == ["carry on"]


def test_an_outcome_copied_to_another_agent_is_refused(env: Env) -> None:
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), routing="family", **FAST)
    ch.join("director")
    other = ch.join("a-other", parent="director")
    child = ch.join("a-child", parent="director")
    out_id = child.complete("done")
    assert out_id is not None
    copy = copy_of(env.raw, ch, out_id, t="a-other")
    assert other.wait(timeout=0.5).kind == "timeout"
    other.flush()
    assert mark_of(env.raw, ch, copy, "a-other").endswith(":misaddressed")


def test_a_rewound_group_hands_out_nothing_again(env: Env) -> None:
    # given: a message done and a child's outcome received and done
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), routing="family", **FAST)
    director = ch.join("director")
    child = ch.join("a-child", parent="director")
    child.send("parent", "a message")
    director.mark_done(director.wait(timeout=5).messages)
    child.complete("finished")
    got = director.wait(timeout=5)
    assert got.kind == "outcome"
    director.mark_done(got.messages)
    before = snapshot(env.raw, ch)

    # when: the attacker rewinds the director's group to the start
    env.raw.xgroup_setid(ch.keys.stream, "director", "0")

    # then: nothing is new: neither wait nor read hands anything out, counts unchanged
    assert director.wait(timeout=0.5).kind == "timeout"
    assert director.read() == []
    director.flush()
    assert snapshot(env.raw, ch) == before


def test_the_janitor_forgets_the_replay_record_past_its_horizon(env: Env) -> None:
    # given: signed traffic with a replay horizon of 2 s (signing window 1 s)
    bus = env.bus("host-a", signing_window_s=1.0, replay_keep_s=1.0)
    ch = bus.channel(env.channel_name(), sender_rate_burst=0, inbox_cap=1000, **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    for i in range(300):
        writer.send("a-reader", f"m{i}")
    got = 0
    while got < 300:
        res = reader.wait(timeout=5)
        got += len(res.messages)
        reader.mark_done(res.messages)
    assert env.raw.zcard(ch.keys.nonce_at) > 100
    # and a janitor pass within the horizon keeps the record, made a hash table (every signed
    # entry handed out looks its pair up: a list would be a scan of them all)
    ch.sweep()
    assert env.raw.hlen(ch.keys.nonces) > 100
    assert env.raw.object("encoding", ch.keys.nonces) == "hashtable"

    # when: the horizon passes and the janitor sweeps
    time.sleep(2.2)
    ch.sweep()

    # then: the record is empty, and gone (keep_table's field with it)
    assert env.raw.zcard(ch.keys.nonce_at) == 0
    assert not env.raw.exists(ch.keys.nonces)


def test_a_dead_letter_replays_under_signing_and_its_copy_does_not(env: Env) -> None:
    # given: a signed message dead-lettered after one hand-out whose lease ran out
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), max_deliveries=1, lease_s=0.3, **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    sent = writer.send("a-reader", "try me again")
    assert [m.id for m in reader.wait(timeout=5).messages] == [sent.id]  # never marked done
    time.sleep(0.4)
    assert reader.wait(timeout=0.5).kind == "timeout"  # the lease ran out: dead-lettered
    (dead,) = ch.dead_letters()
    assert (dead.original_id, dead.recipient, dead.deliveries) == (sent.id, "a-reader", 1)

    # when: a host of the channel (another one, host-b: the replay needs the channel only)
    # replays it
    other = env.bus("host-b").channel(ch.name)
    new_id = other.replay(dead.id)

    # then: the recipient gets it, verified, as the original sender's
    got = reader.wait(timeout=5).messages
    assert [(m.id, m.body, m.sender, m.verified) for m in got] == [
        (new_id, "try me again", "a-writer", True)
    ]
    reader.mark_done(got)
    assert ch.dead_letters() == []

    # and: a raw copy of the replay is a replay, refused
    copy = copy_of(env.raw, ch, new_id)
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert mark_of(env.raw, ch, copy, "a-reader").endswith(":replay")


def test_a_replay_with_forged_content_is_refused(env: Env) -> None:
    # given: a dead letter whose body the attacker changes before a host replays it
    bus = env.bus("host-a")
    ch = bus.channel(env.channel_name(), max_deliveries=1, lease_s=0.3, **FAST)
    reader, writer = ch.join("a-reader"), ch.join("a-writer")
    writer.send("a-reader", "the real words")
    reader.wait(timeout=5)
    time.sleep(0.4)
    reader.wait(timeout=0.5)
    (dead,) = ch.dead_letters()
    ((_, fields),) = env.raw.xrange(ch.keys.dlq, dead.id, dead.id)
    env.raw.xdel(ch.keys.dlq, dead.id)
    forged = str(env.raw.xadd(ch.keys.dlq, {**fields, "b": "words never said"}))

    # when: it is replayed (the replaying host signs what it finds)
    new_id = ch.replay(forged)

    # then: the original sender's signature does not cover it: refused
    assert reader.wait(timeout=0.5).kind == "timeout"
    reader.flush()
    assert mark_of(env.raw, ch, new_id, "a-reader").endswith(":bad_signature")
