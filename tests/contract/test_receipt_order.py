"""A send to several recipients returns one receipt per recipient in roster order (a
broadcast) or in the order given (a list), refused ones in their place, "parent" where it was
named (docs/concepts.md#addressing-and-routing). Both faces, real servers and the double."""

from __future__ import annotations

from typing import Any

import pytest

from tests.contract.test_contract import FAST


def test_a_broadcast_with_refusals_keeps_roster_order(bus: Any, chan_name: str) -> None:
    ch = bus.channel(chan_name, inbox_cap=1, **FAST)
    agents = {n: ch.join(n) for n in ("a", "b", "c", "d", "e")}
    agents["a"].send("b", "fills b")
    agents["a"].send("d", "fills d")
    got = agents["c"].send("all", "to everyone")
    roster = [n for n in agents["c"].agents().names() if n != "c"]
    assert [r.to for r in got] == roster == ["a", "b", "d", "e"]
    assert [r.status for r in got] == ["queued", "rejected", "rejected", "queued"]


def test_a_family_broadcast_with_refusals_keeps_parent_then_siblings(
    bus: Any, chan_name: str
) -> None:
    ch = bus.channel(chan_name, routing="family", siblings=True, inbox_cap=1, **FAST)
    ch.join("director")
    kids = {n: ch.join(n, parent="director") for n in ("k1", "k2", "k3", "k4")}
    kids["k1"].send("k2", "fills k2")
    got = kids["k3"].send("all", "to the family")
    assert [r.to for r in got] == ["director", "k1", "k2", "k4"]
    assert [r.status for r in got] == ["queued", "queued", "rejected", "queued"]


@pytest.mark.parametrize(
    "given,expected",
    [
        (["parent", "k2"], ["director", "k2"]),
        (["k2", "parent"], ["k2", "director"]),
        (["k2", "ghost", "parent"], ["k2", "ghost", "director"]),
        (["ghost", "parent", "k2", "k2"], ["ghost", "director", "k2"]),
        (["k2", "k1", "director"], ["k2", "k1", "director"]),
    ],
)
def test_a_list_keeps_the_order_given_with_parent_and_refusals_in_place(
    bus: Any, chan_name: str, given: list[str], expected: list[str]
) -> None:
    ch = bus.channel(chan_name, routing="family", siblings=True, **FAST)
    ch.join("director")
    k1 = ch.join("k1", parent="director")
    ch.join("k2", parent="director")
    got = k1.send(given, "hello")
    assert [r.to for r in got] == expected
    assert [r.status for r in got] == [
        "rejected" if n in ("ghost", "k1") else "queued" for n in expected
    ]
