"""send.lua's two paths decide alike: a single send to one member named as such takes a
straight path of its own, everything else the general routine (send_message()). Both call the
same check helpers; this pins them to the same decisions over random limits and states.

Twin channels get the same random operations; on one, each send names its recipient as such
(``send("kid", ...)``: the straight path), on the other in a list of one (``send(["kid"],
...)``: the general routine, refusals per recipient). Every send must accept or refuse alike,
with the same refusal code, and leave the same stream and counters.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any, cast

import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from redisbus import Bus, RedisbusError
from tests.support.servers import Server

#: boss -> mid -> kid, sib under boss; ext a second root
PARENTS = {"boss": "", "mid": "boss", "sib": "boss", "kid": "mid", "ext": ""}
NAMES = list(PARENTS)
_channels = itertools.count()

LIMITS = st.fixed_dictionaries(
    {
        "routing": st.sampled_from(["family", "open"]),
        "siblings": st.booleans(),
        "inbox_cap": st.sampled_from([2, 4, 1_000]),
        "pair_rate_burst": st.sampled_from([0, 2, 1_000]),
        # buckets too slow to refill between the twins' sends: a refill is timing, not a
        # decision, and a fast one made the twins' token counts differ by one now and then
        "pair_rate_per_s": st.just(0.001),
        "sender_rate_burst": st.sampled_from([0, 3, 1_000]),
        "sender_rate_per_s": st.just(0.001),
        "max_messages": st.sampled_from([0, 9]),
        "dampen_turns": st.sampled_from([0, 1, 3]),
        "max_chain_depth": st.sampled_from([1, 2, 10]),
        "max_chain_messages": st.sampled_from([0, 2, 100]),
        "max_body_bytes": st.just(64),
        "max_name_chars": st.just(8),
    }
)
SEND = st.tuples(
    st.just("send"),
    st.sampled_from(NAMES),  # sender
    st.sampled_from([*NAMES, "nobody", "id:kid", "id:boss"]),  # recipient
    st.sampled_from(["hi", "x" * 65, ""]),  # body (one too large)
    st.sampled_from(["", "status", "été", "a\x01b", "far too long"]),  # subject
    st.sampled_from(["message", "request", "auto_reply"]),
    st.sampled_from([None, None, 0, 1, -1]),  # reply_to: the n-th entry of the stream
)
STATE = st.one_of(
    st.tuples(st.just("status"), st.sampled_from(NAMES), st.sampled_from(["failed", "lost"])),
    st.tuples(st.just("breaker"), st.sampled_from(["boss", "mid", "kid"])),
    st.tuples(st.just("drain"), st.sampled_from(NAMES)),
    st.tuples(st.just("pause"), st.booleans()),
)
OPS = st.lists(st.one_of(SEND, SEND, STATE), min_size=1, max_size=20)
#: a breaker opened between two sends of a pair that would pass otherwise
BREAKER = [("send", "boss", "mid", "hi", "", "message", None), ("breaker", "mid")] * 2


def _twin(bus: Bus, name: str, limits: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    ch = bus.channel(name, **limits)
    agents: dict[str, Any] = {}
    for n in NAMES:  # parents join first
        agents[n] = ch.join(n, parent=PARENTS[n] or None)
    return ch, agents


def _apply(
    r: redis.Redis, ch: Any, agents: dict[str, Any], op: tuple[Any, ...], general: bool
) -> Any:
    k = ch.keys
    kind = op[0]
    if kind == "status":
        r.hset(k.status, op[1], op[2])
        return None
    if kind == "breaker":  # open for a minute: "failures first_ms until_ms"
        now = int(r.time()[0]) * 1000
        r.hset(k.rate, f"b\n{op[1]}", f"0 {now} {now + 60_000}")
        return None
    if kind == "drain":
        r.hset(k.inbox, op[1], 0)
        return None
    if kind == "pause":
        ch.pause() if op[1] else ch.resume()
        return None
    _, sender, to, body, subject, mtype, nth = op
    if to.startswith("id:"):
        to = agents[to[3:]].id
    ids = [i for i, _ in cast(Entries, r.xrange(k.stream))]
    reply_to = ids[nth] if nth is not None and len(ids) > abs(nth) else None
    try:
        res = agents[sender].send(
            [to] if general else to, body, subject=subject, type=mtype, reply_to=reply_to
        )
    except RedisbusError as e:
        return e.code
    receipts = res if isinstance(res, list) else [res]
    (one,) = receipts
    return one.error.code if one.error else one.status


#: a stream's entries, as the tests' clients (decode_responses=True) return them
Entries = list[tuple[str, dict[str, str]]]


def _state(r: redis.Redis, ch: Any) -> Any:
    """The stream and counters, entry ids as their place in the stream (twins differ only in
    ids and clock readings)."""
    k = ch.keys
    entries = cast(Entries, r.xrange(k.stream))
    place = {i: str(n) for n, (i, _) in enumerate(entries)}

    def same(text: str) -> str:
        for i, n in place.items():
            text = text.replace(i, f"#{n}")
        return text

    stream = [{f: same(v) for f, v in fields.items() if f != "n"} for _, fields in entries]
    rate: dict[str, Any] = {}
    for field, value in cast(dict[str, str], r.hgetall(k.rate)).items():
        if field.startswith(("p\n", "s\n")):
            rate[field] = int(float(value.split(" ")[0]))  # whole tokens (the rest is refill)
        elif field.startswith("d\n"):
            turns, _, last = value.split(" ", 2)
            rate[field] = (turns, last)
        elif field.startswith("b\n"):
            rate[field] = "set"
        else:
            rate[same(field)] = same(value)
    return stream, r.hgetall(k.inbox), rate


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=LIMITS, ops=OPS)
@example(limits={"routing": "open", "inbox_cap": 1_000, "pair_rate_burst": 1_000}, ops=BREAKER)
def test_the_straight_path_and_the_general_routine_decide_alike(
    redis7: Server, limits: dict[str, Any], ops: list[tuple[Any, ...]]
) -> None:
    r = redis.Redis(port=redis7.port, decode_responses=True)
    with Bus.from_url(redis7.url) as bus:
        # given twin channels with the same random limits
        n = next(_channels)
        straight, sa = _twin(bus, f"paths-straight-{n}-{uuid.uuid4().hex[:8]}", limits)
        general, ga = _twin(bus, f"paths-general-{n}-{uuid.uuid4().hex[:8]}", limits)
        # when the same operations run on both, sends naming the recipient as such on one and
        # in a list of one on the other
        for op in ops:
            a = _apply(r, straight, sa, op, general=False)
            b = _apply(r, general, ga, op, general=True)
            # then each send is accepted or refused alike, for the same reason
            assert a == b, (limits, ops, op, a, b)
        # and the stream and counters are the same
        assert _state(r, straight) == _state(r, general), (limits, ops)


#: a batch's items: recipient, body, subject, type, reply_to (the n-th entry before the batch)
ITEMS = st.lists(
    st.tuples(
        st.sampled_from([*NAMES, "nobody", "id:kid"]),
        st.sampled_from(["hi", "x" * 65, ""]),
        st.sampled_from(["", "", "status", "far too long"]),
        st.sampled_from(["message", "message", "auto_reply"]),
        st.sampled_from([None, None, 0, -1]),
    ),
    min_size=1,
    max_size=25,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=LIMITS, sender=st.sampled_from(NAMES), items=ITEMS, before=OPS)
def test_a_batch_decides_as_the_same_sends_one_by_one(
    redis7: Server,
    limits: dict[str, Any],
    sender: str,
    items: list[tuple[Any, ...]],
    before: list[tuple[Any, ...]],
) -> None:
    # A batch's message to one member named as such takes a path of its own in send.lua (and a
    # (to, body) pair one of its own in the planner); sent one by one in lists of one, the same
    # messages take the general routine. Each must be accepted or refused alike, each seeing
    # what the ones before it did, and leave the same stream and counters.
    r = redis.Redis(port=redis7.port, decode_responses=True)
    with Bus.from_url(redis7.url) as bus:
        # given twin channels with the same random limits (buckets too slow to refill between
        # the sends one by one: a batch reads the clock once) and the same history
        limits = {**limits, "pair_rate_per_s": 0.001}
        n = next(_channels)
        batch, ba = _twin(bus, f"paths-batch-{n}-{uuid.uuid4().hex[:8]}", limits)
        single, sa = _twin(bus, f"paths-single-{n}-{uuid.uuid4().hex[:8]}", limits)
        for op in before:
            _apply(r, batch, ba, op, general=False)
            _apply(r, single, sa, op, general=True)
        # when the items go out as one batch on one, one by one on the other
        ids = [i for i, _ in cast(Entries, r.xrange(batch.keys.stream))]
        ids_single = [i for i, _ in cast(Entries, r.xrange(single.keys.stream))]
        sends = []
        for name, body, subject, mtype, nth in items:
            to = (ba[name[3:]].id, sa[name[3:]].id) if name.startswith("id:") else (name, name)
            reply_to = (None, None)
            if nth is not None and len(ids) > abs(nth):
                reply_to = ids[nth], ids_single[nth]
            sends.append((to, body, subject, mtype, reply_to))
        batch_items: list[Any] = []
        for to, body, subject, mtype, reply_to in sends:
            if (subject, mtype, reply_to[0]) == ("", "message", None):
                batch_items.append((to[0], body))
            else:
                batch_items.append(
                    {
                        "to": to[0],
                        "body": body,
                        "subject": subject,
                        "type": mtype,
                        "reply_to": reply_to[0],
                    }
                )
        batched = [
            r_.error.code if r_.error else r_.status for r_ in ba[sender].send_many(batch_items)
        ]
        one_by_one = []
        for to, body, subject, mtype, reply_to in sends:
            try:
                (got,) = sa[sender].send(
                    [to[1]], body, subject=subject, type=mtype, reply_to=reply_to[1]
                )
                one_by_one.append(got.error.code if got.error else got.status)
            except RedisbusError as e:
                one_by_one.append(e.code)
        # then each message is decided alike, and the stream and counters are the same
        assert batched == one_by_one, (limits, sender, items, batched, one_by_one)
        assert _state(r, batch) == _state(r, single), (limits, sender, items)
