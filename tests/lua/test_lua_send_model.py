"""send.lua against a plain Python model of the limits.

A single send, a send to a list, a broadcast and a batch (send_many) all go through one check
routine in send.lua. Random sequences of all four, with agents failing, inboxes drained and
the channel paused, must give exactly the outcome the model below predicts: the same codes in
the same order of precedence, the same counters. A shortcut that skipped or reordered a check
for one kind of send only (a one-recipient fast path, a batch twin) would disagree with it.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from redisbus import Bus, RedisbusError
from tests.support.servers import Server

INBOX_CAP = 3
PAIR_BURST = 2
SENDER_BURST = 5
BUDGET = 30
MAX_CHAIN = 2
DAMPEN_TURNS = 1
#: boss -> mid -> kid, sib under boss, and a second root (roots are siblings of each other)
PARENTS = {"boss": "", "mid": "boss", "sib": "boss", "kid": "mid", "ext": ""}
NAMES = list(PARENTS)
TARGET = st.sampled_from([*NAMES, "parent", "nobody"])
_channels = itertools.count()

Outcome = tuple[str, str, str]  # (to, status, code)


class Refused(Exception):
    """The model refuses the whole send."""

    def __init__(self, code: str) -> None:
        self.code = code


@dataclass
class Model:
    """What send.lua should decide, written as plainly as possible. Refill rates are far too
    slow to matter during a test, so a bucket is its burst minus what was spent."""

    family: bool
    siblings: bool
    status: dict[str, str] = field(default_factory=lambda: dict.fromkeys(NAMES, "open"))
    inbox: Counter[str] = field(default_factory=Counter)
    pair_spent: Counter[tuple[str, str]] = field(default_factory=Counter)
    sender_spent: Counter[str] = field(default_factory=Counter)
    turns: dict[frozenset[str], tuple[int, str]] = field(default_factory=dict)
    messages: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (type, depth)
    sent: int = 0
    paused: bool = False

    def reach(self, sender: str, name: str) -> bool:
        if not self.family:
            return True
        sp, np = PARENTS[sender], PARENTS[name]
        if np == sender or (name == sp and sp):
            return True  # child, parent
        return np == sp and self.siblings  # siblings (roots are siblings of each other)

    def send(
        self, sender: str, to: str | list[str], mtype: str, reply_to: str | None
    ) -> tuple[list[Outcome], int, str]:
        """Outcomes of one message, the depth and the recipients ("\\n"-joined) it is
        appended with, or Refused."""
        mode = "all" if to == "all" else "one" if isinstance(to, str) else "many"
        if self.paused:
            raise Refused("channel_paused")
        if self.sent >= BUDGET:
            raise Refused("budget")
        if self.status[sender] in ("failed", "cancelled"):
            raise Refused("agent_closed")
        depth = 0
        if reply_to is not None:
            ptype, pdepth = self.messages[reply_to]
            depth = pdepth + 1
            if mtype == "auto_reply" and ptype == "auto_reply":
                raise Refused("loop")
            if depth > MAX_CHAIN:
                raise Refused("chain_too_deep")
        out: list[Outcome] = []
        targets: list[str] = []
        if mode == "all":
            targets = [n for n in NAMES if n != sender and self.reach(sender, n)]
        else:
            resolved_before: set[str] = set()  # duplicates are dropped
            for name in [to] if isinstance(to, str) else to:
                resolved, code = PARENTS[sender] if name == "parent" else name, ""
                if resolved not in PARENTS or not resolved:  # no such agent, or a root's parent
                    resolved, code = "", "unknown_agent"
                elif resolved not in resolved_before:
                    resolved_before.add(resolved)
                    if resolved == sender:
                        name, code = resolved, "invalid_input"
                    else:
                        targets.append(resolved)
                if code:
                    if mode == "one":
                        raise Refused(code)
                    out.append((name, "rejected", code))
        accepted: list[tuple[str, int]] = []
        for name in targets:
            turns = 0
            pair = frozenset((sender, name))
            if pair in self.turns and mode != "all":
                n, last = self.turns[pair]
                turns = n + 1 if last == name else n
            if not self.reach(sender, name):
                code = "routing_refused"
            elif self.status[name] in ("failed", "cancelled", "lost"):
                code = "recipient_closed"
            elif self.inbox[name] >= INBOX_CAP:
                code = "inbox_full"
            elif turns > DAMPEN_TURNS:
                code = "loop"
            elif mode != "all" and PAIR_BURST - self.pair_spent[sender, name] < 1:
                code = "rate_limited"  # a broadcast is the sender's budget: no pair bucket
            else:
                accepted.append((name, turns))
                continue
            if mode == "one":
                raise Refused(code)
            out.append((name, "rejected", code))
        if not accepted:
            return out, depth, ""
        if SENDER_BURST - self.sender_spent[sender] < 1:
            raise Refused("rate_limited")
        # accepted: count
        self.sent += 1
        self.sender_spent[sender] += 1
        for name, turns in accepted:
            self.inbox[name] += 1
            if mode != "all":
                self.pair_spent[sender, name] += 1
                self.turns[frozenset((sender, name))] = (turns, sender)
            out.append((name, "queued", ""))
        return out, depth, "\n".join(n for n, _ in accepted)


def _outcomes(result: Any) -> list[Outcome]:
    receipts = result if isinstance(result, list) else [result]
    return sorted((r.to, r.status, r.error.code if r.error else "") for r in receipts)


class SendMachine(RuleBasedStateMachine):
    """Every kind of send, each compared with the model as it happens."""

    sent_ids = Bundle("sent_ids")

    def __init__(self, url: str) -> None:
        super().__init__()
        self.bus = Bus.from_url(url)
        self.model: Model
        self.agents: dict[str, Any] = {}

    @initialize(family=st.booleans(), siblings=st.booleans())
    def channel(self, family: bool, siblings: bool) -> None:
        self.model = Model(family, siblings)
        self.ch = self.bus.channel(
            f"model-{next(_channels)}",
            routing="family" if family else "open",
            siblings=siblings,
            inbox_cap=INBOX_CAP,
            pair_rate_burst=PAIR_BURST,
            pair_rate_per_s=0.0001,
            sender_rate_burst=SENDER_BURST,
            sender_rate_per_s=0.0001,
            max_messages=BUDGET,
            max_chain_depth=MAX_CHAIN,
            dampen_turns=DAMPEN_TURNS,
            dampen_window_s=3600,
        )
        for name, parent in PARENTS.items():
            self.agents[name] = self.ch.join(name, parent=parent or None)

    def teardown(self) -> None:
        self.bus.close()

    def _expect(
        self, sender: str, to: str | list[str], mtype: str, reply_to: str | None
    ) -> list[Outcome] | str:
        try:
            out, _, _ = self.model.send(sender, to, mtype, reply_to)
        except Refused as r:
            return r.code
        return sorted(out)

    def _remember(self, result: Any, mtype: str, reply_to: str | None) -> list[str]:
        receipts = result if isinstance(result, list) else [result]
        ids = sorted({r.id for r in receipts if r.id})
        assert len(ids) <= 1  # one message, one entry
        depth = 0 if reply_to is None else self.model.messages[reply_to][1] + 1
        for i in ids:
            self.model.messages[i] = (mtype, depth)
        return ids

    def _send(self, sender: str, to: str | list[str], mtype: str, reply_to: str | None) -> Any:
        expected = self._expect(sender, to, mtype, reply_to)
        try:
            result = self.agents[sender].send(to, "hi", type=mtype, reply_to=reply_to)
        except RedisbusError as e:
            assert e.code == expected, (sender, to, mtype, e, expected)
            return []
        assert _outcomes(result) == expected, (sender, to, mtype, expected)
        return self._remember(result, mtype, reply_to)

    @rule(
        target=sent_ids,
        sender=st.sampled_from(NAMES),
        to=TARGET,
        mtype=st.sampled_from(["message", "auto_reply"]),
    )
    def send_one(self, sender: str, to: str, mtype: str) -> Any:
        return _first(self._send(sender, to, mtype, None))

    @rule(
        target=sent_ids,
        sender=st.sampled_from(NAMES),
        to=st.lists(TARGET, min_size=1, max_size=4),
    )
    def send_list(self, sender: str, to: list[str]) -> Any:
        return _first(self._send(sender, to, "message", None))

    @rule(target=sent_ids, sender=st.sampled_from(NAMES))
    def broadcast(self, sender: str) -> Any:
        return _first(self._send(sender, "all", "message", None))

    @rule(
        target=sent_ids,
        reply_to=sent_ids,
        sender=st.sampled_from(NAMES),
        to=st.one_of(TARGET, st.lists(TARGET, min_size=1, max_size=3)),
        mtype=st.sampled_from(["message", "auto_reply"]),
    )
    def reply(self, reply_to: str | None, sender: str, to: Any, mtype: str) -> Any:
        if reply_to is None:
            return None
        return _first(self._send(sender, to, mtype, reply_to))

    @rule(
        sender=st.sampled_from(NAMES),
        items=st.lists(
            st.tuples(
                st.one_of(TARGET, st.just("all"), st.lists(TARGET, min_size=1, max_size=3)),
                st.sampled_from(["message", "auto_reply"]),
            ),
            min_size=1,
            max_size=8,
        ),
    )
    def batch(self, sender: str, items: list[tuple[Any, str]]) -> None:
        # the model decides the items one after the other, as send.lua must
        expected = [self._expect(sender, to, mtype, None) for to, mtype in items]
        results = self.agents[sender].send_many(
            [{"to": to, "body": "hi", "type": mtype} for to, mtype in items]
        )
        for (to, mtype), want, got in zip(items, expected, results, strict=True):
            outcomes = _outcomes(got)
            if isinstance(want, str):  # the whole message was refused: every receipt says why
                assert outcomes and all(o[1:] == ("rejected", want) for o in outcomes), (
                    to,
                    want,
                    outcomes,
                )
            else:
                assert outcomes == want, (to, mtype, want, outcomes)
                self._remember(got, mtype, None)

    @rule(name=st.sampled_from(NAMES))
    def drain(self, name: str) -> None:
        agent = self.agents[name]
        if got := agent.read(limit=100):
            agent.mark_done(got)
        self.model.inbox[name] = self.ch.counts().get(name, 0)

    @rule(name=st.sampled_from(["kid", "sib", "ext"]))
    def fail(self, name: str) -> None:
        if self.model.status[name] != "open":
            return
        self.agents[name].fail("gave up")
        self.model.status[name] = "failed"
        # the outcome goes to the parent's inbox (outcomes bypass every limit)
        counts = self.ch.counts()
        for n in NAMES:
            self.model.inbox[n] = counts.get(n, 0)

    @rule(on=st.booleans())
    def pause(self, on: bool) -> None:
        if on:
            self.ch.pause()
        else:
            self.ch.resume()
        self.model.paused = on

    @invariant()
    def inbox_counts_agree(self) -> None:
        if hasattr(self, "ch"):
            counts = self.ch.counts()
            assert {n: counts.get(n, 0) for n in NAMES} == {n: self.model.inbox[n] for n in NAMES}


def _first(ids: list[str]) -> str | None:
    return ids[0] if ids else None


@pytest.mark.parametrize("kind", ["redis7", "valkey", "redis62"])
def test_every_kind_of_send_keeps_the_limits_of_the_model(
    kind: str, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(kind)
    run_state_machine_as_test(
        lambda: SendMachine(server.url),  # type: ignore[arg-type]  # a factory is accepted
        settings=settings(
            max_examples=25,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        ),
    )
