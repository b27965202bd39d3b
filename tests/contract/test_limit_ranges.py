"""A channel's limits hold the ranges their defaults do, and a channel that allows names longer
than 128 characters takes them everywhere a member is named
(docs/concepts.md#limits-and-loop-protection). On both faces, on real servers and the
in-memory double."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbus import BusSettings, InvalidInput
from redisbus._channels import LIMITS
from tests.support.helpers import channel_state

_TOO_LOW = {"inbox_cap": 0, "max_body_bytes": 0, "max_name_chars": 0, "max_deliveries": 0}
_TOO_LOW_S = {"lease_s": 0, "retention_s": 0}


@pytest.mark.parametrize("field,value", [*_TOO_LOW.items(), *_TOO_LOW_S.items()])
def test_a_limit_its_setting_refuses_is_refused_for_a_channel_and_by_configure(
    bus: Any, chan_name: str, field: str, value: float
) -> None:
    with pytest.raises(ValueError):  # the setting (pydantic's ValidationError)
        BusSettings(**{field: value})  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=field):
        bus.channel(chan_name, **{field: value})
    ch = bus.channel(chan_name)
    before = ch.config
    with pytest.raises(InvalidInput, match=field):
        ch.configure(**{field: value})
    assert bus.channel(chan_name).config == before


def test_max_name_chars_past_1024_is_refused_as_its_setting_is(bus: Any, chan_name: str) -> None:
    with pytest.raises(InvalidInput, match="max_name_chars"):
        bus.channel(chan_name, max_name_chars=1025)
    assert bus.channel(chan_name, max_name_chars=1024).config.max_name_chars == 1024


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(LIMITS), value=st.integers(-10, 3) | st.floats(-10, 3))
def test_a_channel_limit_is_never_looser_than_its_setting(field: str, value: float) -> None:
    """No server: the check runs before any call. What the setting refuses, a channel refuses
    (an integer limit given a float is refused outright: stricter, not looser); an integer the
    setting takes, a channel takes."""
    from redisbus._channels import plan_channel

    try:
        BusSettings(**{field: value})  # type: ignore[arg-type]
        setting_ok = True
    except ValueError:
        setting_ok = False
    try:
        plan_channel(BusSettings(), None, None, {field: value})
        channel_ok = True
    except InvalidInput:
        channel_ok = False
    assert setting_ok or not channel_ok, (field, value)
    if isinstance(value, int):
        assert channel_ok == setting_ok, (field, value)


def test_a_channel_allowing_long_names_takes_them_wherever_a_member_is_named(
    bus: Any, chan_name: str
) -> None:
    long = "L" * 150
    ch = bus.channel(chan_name, routing="family", max_name_chars=200, pair_rate_burst=0)
    parent = ch.join(long)
    kid = ch.join("kid", parent=long)
    assert kid.send(long, "to a long name").to == long
    assert kid.send([long], "in a list")[0].to == long
    assert parent.wait(5).messages
    grandkid = ch.join("g" * 180, parent="kid")
    assert grandkid.send("parent", "up").to == "kid"
    parent.cancel("kid")
    assert ch.tree()  # the tree reads back with long names in it


def test_a_recipient_name_longer_than_any_channel_allows_is_refused_before_any_call(
    bus: Any, chan_name: str
) -> None:
    ch = bus.channel(chan_name)
    a, _ = ch.join("a"), ch.join("b")
    before = channel_state(bus.redis, getattr(ch, "target", ch))
    for bad in ("x" * 1025, ["b", "y" * 1025]):
        with pytest.raises(InvalidInput, match=r"1\.\.1024"):
            a.send(bad, "x")
    assert channel_state(bus.redis, getattr(ch, "target", ch)) == before
