"""Signed envelopes (docs/security.md#signed-envelopes): forged senders are dropped; keys rotate
without losing messages."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from redis.typing import EncodableT, FieldT

from redisbus import Bus, BusSettings
from tests.support.servers import Server

FAST: dict[str, Any] = {"pair_rate_burst": 1000, "pair_rate_per_s": 1000}
KEY1 = {"k1": "first-fleet-secret"}
KEY2 = {"k2": "second-fleet-secret"}


def bus_with(server: Server, keys: dict[str, str], unsigned: str = "reject", **kw: Any) -> Bus:
    return Bus.from_url(
        server.url, settings=BusSettings(metrics=False, signing_keys=keys, unsigned=unsigned, **kw)
    )


def forge(server: Server, ch: Any, sender: str, to: str, body: str, sig: str = "") -> str:
    """A client without the key writes straight into the stream, claiming to be `sender`, and
    rings the recipient's doorbell (a wait hands over only what a bell names)."""
    fields: dict[FieldT, EncodableT] = {"f": sender, "t": to, "b": body}
    if sig:
        fields.update({"g": sig, "n": "1"})
    r = server.client()
    entry_id = str(r.xadd(ch.keys.stream, fields))
    if r.rpush(ch.keys.bell(to), entry_id) == 1:
        r.rpush(ch.keys.wakeup(to), "")
    return entry_id


def test_a_raw_xadd_without_the_key_is_rejected_on_read(redis7: Server) -> None:
    redis7.client().flushall()
    bus = bus_with(redis7, KEY1)
    ch = bus.channel("signed", **FAST)
    director = ch.join("director")
    writer = ch.join("writer")
    writer.send("director", "genuine")
    forge(redis7, ch, "writer", "director", "approve the budget, says writer")
    forge(redis7, ch, "writer", "director", "with a made-up signature", sig="k1:" + "0" * 64)
    got = director.wait(timeout=2)
    assert [(m.sender, m.body, m.verified) for m in got.messages] == [("writer", "genuine", True)]
    assert director.wait(timeout=0.2).kind == "timeout"  # the forgeries never arrive
    assert [m.body for m in director.list(filter_by="all")] == ["genuine"]
    assert [m.body for m in director.read(filter_by="all")] == ["genuine"]
    bus.close()


def test_flag_mode_delivers_unverified_messages_marked(redis7: Server) -> None:
    redis7.client().flushall()
    bus = bus_with(redis7, KEY1, unsigned="flag")
    ch = bus.channel("flagged", **FAST)
    director = ch.join("director")
    ch.join("writer")
    forge(redis7, ch, "writer", "director", "unsigned")
    (m,) = director.wait(timeout=2).messages
    assert (m.body, m.verified) == ("unsigned", False)
    bus.close()


def test_signing_off_means_verified_is_none(redis7: Server) -> None:
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False))
    ch = bus.channel("plain", **FAST)
    a, b = ch.join("a"), ch.join("b")
    a.send("b", "hi")
    assert b.read()[0].verified is None
    bus.close()


def test_key_rotation_keeps_old_messages_readable_during_the_overlap(redis7: Server) -> None:
    redis7.client().flushall()
    old = bus_with(redis7, KEY1)
    ch = old.channel("rotate", **FAST)
    ch.join("reader")
    old_writer = ch.join("writer")
    old_writer.send("reader", "signed with k1")
    # the fleet rolls out k2 first, keeping k1 to verify
    both = bus_with(redis7, {**KEY2, **KEY1})
    ch2 = both.channel("rotate")
    ch2.join("writer").send("reader", "signed with k2")
    reader = ch2.join("reader")
    got = reader.read()
    assert [(m.body, m.verified) for m in got] == [
        ("signed with k1", True),
        ("signed with k2", True),
    ]
    sigs = [f["g"].split(":")[0] for _, f in both.redis.xrange(ch.keys.stream)]
    assert sigs == ["k1", "k2"]
    # after the overlap k1 is dropped: k1 messages no longer verify
    new_only = bus_with(redis7, KEY2)
    late = new_only.channel("rotate").join("late-reader")
    assert [m.body for m in late.list(filter_by="all")] == ["signed with k2"]
    for b in (old, both, new_only):
        b.close()


def test_outcomes_and_cancellations_are_signed_too(redis7: Server) -> None:
    redis7.client().flushall()
    bus = bus_with(redis7, KEY1)
    ch = bus.channel("fam", routing="family", **FAST)
    lead = ch.join("lead")
    kid = ch.join("kid", parent="lead")
    grandkid = ch.join("grandkid", parent="kid")
    lead.cancel("kid", reason="stop")
    assert grandkid.wait(timeout=2).kind == "cancelled"
    (outcome,) = lead.wait(timeout=2).messages
    assert (outcome.type, outcome.subject, outcome.verified) == ("outcome", "cancelled", True)
    # a forged cancellation (no key) does not cancel anyone
    other = ch.join("other", parent="lead")
    forge_fields: dict[FieldT, EncodableT]
    forge_fields = {"f": "lead", "t": "other", "b": "stop", "s": "cancel", "k": "control"}
    redis7.client().xadd(ch.keys.stream, forge_fields)
    assert other.wait(timeout=0.3).kind == "timeout"
    assert kid.wait(timeout=0.1).kind == "cancelled"
    bus.close()


@pytest.mark.parametrize("raw", ['{"k1": "s"}', '{"a": "x", "b": "y"}'])
def test_signing_keys_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("REDISBUS_SIGNING_KEYS", raw)
    keys = BusSettings().signing_keys
    assert {k: v.get_secret_value() for k, v in keys.items()} == json.loads(raw)


def test_secrets_never_show_in_a_repr() -> None:
    s = BusSettings(password="hunter2-pw", signing_keys={"k1": "hmac-secret-xyz"})
    for text in (repr(s), str(s), repr(s.model_dump()), s.model_dump_json()):
        assert "hunter2-pw" not in text
        assert "hmac-secret-xyz" not in text
    assert s.password is not None and s.password.get_secret_value() == "hunter2-pw"


@pytest.mark.parametrize("field", ["u", "r"])
def test_the_fields_a_chain_is_derived_from_are_signed(redis7: Server, field: str) -> None:
    # given a signed message sent while its sender handles another (it carries "u", the cause)
    redis7.client().flushall()
    bus = Bus.from_url(redis7.url, settings=BusSettings(metrics=False, signing_keys={"k1": "s"}))
    ch = bus.channel("chain-signed")
    a, b = ch.join("a"), ch.join("b")
    first = a.send("b", "job")
    (got,) = b.wait(timeout=2).messages
    forwarded = b.send("a", "new work", reply_to=got.id if field == "r" else None)
    assert forwarded.id is not None
    raw = redis7.client()
    # the client decodes replies (decode_responses=True)
    stream = cast(
        list[tuple[str, dict[str, str]]], raw.xrange(ch.keys.stream, forwarded.id, forwarded.id)
    )
    ((_, fields),) = stream
    assert fields.get(field) == first.id  # the chain's parent is on the entry
    # when a raw writer re-points the chain at another message, as a fresh entry
    other = a.send("b", "other")
    assert other.id is not None
    forged = {**fields, field: other.id}
    # then the signature no longer holds for it, whatever else is left intact
    from redisbus._signing import signer_for

    signer = signer_for(bus.settings)
    assert signer.verdict(ch.name, forwarded.id, fields, "a") == (True, "")
    assert signer.verdict(ch.name, forwarded.id, forged, "a") == (False, "bad_signature")
    bus.close()
