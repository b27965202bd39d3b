"""Each script's binding (redisbus/_bindings.py) against the script itself: the KEYS and ARGV
its header declares, by name and in order, and the highest KEYS[n] and ARGV[n] its code uses.
A script that takes one more key, or a binding that passes one argument fewer, fails here
instead of at a user's call."""

from __future__ import annotations

import re

import pytest

from redisbus import _bindings as b
from redisbus._keys import ChannelKeys
from redisbus._scripts import _read, scripts

# a declaration: a header line that starts with one, then every "KEYS[n] name" on it
_DECL_LINE = re.compile(r"^-- (?:KEYS\[|ARGV\[|k=)", re.M)
_DECL = re.compile(r"\b(KEYS|ARGV)\[(\d+)(\.\.)?\]\s+(\w+)")
_FIELD = re.compile(r"\bk=(\d+)\s+(\w+)")


def header(name: str) -> str:
    lines = []
    for line in _read(name).splitlines():
        if not line.startswith("--"):
            break
        lines.append(line)
    return "\n".join(lines)


def declared(name: str) -> tuple[list[str], list[str], list[str]]:
    """(KEYS, ARGV, send's record fields) as the header of ``name`` declares them."""
    keys: list[str] = []
    argv: list[str] = []
    fields: list[str] = []
    for line in header(name).splitlines():
        if not _DECL_LINE.match(line):
            continue
        for kind, n, rest, word in _DECL.findall(line):
            out = keys if kind == "KEYS" else argv
            assert int(n) == len(out) + 1, f"{name}.lua declares {kind}[{n}] out of order"
            out.append(word + rest)
        for n, word in _FIELD.findall(line):
            assert int(n) == len(fields) + 1, f"{name}.lua declares k={n} out of order"
            fields.append(word)
    return keys, argv, fields


def test_every_script_has_a_binding_and_every_binding_a_script() -> None:
    assert sorted(b.SCRIPTS) == sorted(scripts())


@pytest.mark.parametrize("name", scripts())
def test_the_binding_names_what_the_header_declares(name: str) -> None:
    keys, argv, fields = declared(name)
    script = b.SCRIPTS[name]
    assert list(script.keys) == keys
    assert list(script.argv) == argv
    assert list(script.record) == fields


@pytest.mark.parametrize("name", scripts())
def test_the_code_uses_no_key_or_argument_the_header_leaves_out(name: str) -> None:
    code = "\n".join(
        line for line in _read(name).splitlines() if not line.lstrip().startswith("--")
    )
    script = b.SCRIPTS[name]
    used_keys = [int(n) for n in re.findall(r"KEYS\[(\d+)\]", code)]
    used_args = [int(n) for n in re.findall(r"ARGV\[(\d+)\]", code)]
    fixed = [n for n in script.keys if not n.endswith("..")]
    if len(fixed) == len(script.keys):  # no trailing "rest": every key named is used
        assert max(used_keys) == len(script.keys)
    else:
        assert max(used_keys) <= len(fixed) + 1
    if script.argv and not script.argv[-1].endswith(".."):
        assert max(used_args) == len(script.argv)
    if script.record:  # send.lua: one record's fields, by offset from the message's base
        offsets = [int(n) for n in re.findall(r"ARGV\[base \+ (\d+)\]", code)]
        assert max(offsets) == len(script.record)


K = ChannelKeys.build("rb", "c")


def calls() -> dict[str, b.Call]:
    """A call of every script, through its builder, as the faces make them."""
    return {
        "beat": b.beat(K, 1000, 100, ["a", "r", ""]),
        "channel": b.channel(K, True, [("routing", "open", False)]),
        "claim": b.claim(K, "a", "r", 1000, 5, 100, "-", ["1-1"]),
        "configure": b.configure(K, {"paused": "1"}),
        "delete": b.delete(K, ["a", "b"], False),
        "done": b.done(K, "a", "ok", ["1-1"]),
        "join": b.join(K, "a", None, "id", "r", "h", "", ["x"], 1000),
        "lease": b.lease(K, "a", "r", ["1-1"]),
        "leave": b.leave(K, "a", "id", "r"),
        "outcome": b.outcome(K, "complete", "a", "a", "ok", ["", "", ""]),
        "receipt": b.receipt(K, "1-1"),
        "remove": b.remove(K, "a", True),
        "repair": b.repair(K, 0),
        "replay": b.replay(K, "1-1", []),
        "send": b.send(b.send_keys(K), [[""] * 14, [""] * 14]),
        "settle": b.settle(b.SETTLE.keys_of(K), "a", ["d", "1-1"]),
        "sweep": b.sweep(K, 1, 2, 3, 4, 5, 6),
        "view": b.view(K, "a", [""] * 11, 0),
        "wake": b.wake(b.wake_keys(K, "a", True), "a", "r", 0, True),
    }


def test_every_builder_makes_a_call_its_script_takes() -> None:
    made = calls()
    assert sorted(made) == sorted(scripts())
    for name, call in made.items():
        assert call.script == name
        assert all(isinstance(k, str) and k.startswith("rb:{c}:") for k in call.keys), name
    assert made["leave"].keys[-2:] == [K.bell("a"), K.wakeup("a")]  # the agent's own doorbell
    for agent in ("a", "b"):
        assert {K.bell(agent), K.wakeup(agent)} <= set(made["delete"].keys)
    assert len(b.wake_keys(K, "a", False)) == 6  # the replay record only with signing on


@pytest.mark.parametrize(
    ("script", "keys", "args"),
    [
        (b.JOIN, 7, 9),  # a key short
        (b.JOIN, 8, 10),  # an argument too many
        (b.VIEW, 9, 11),  # the replay horizon left out (only resume may be)
        (b.WAKE, 4, 3),
        (b.DELETE, 3, 1),
    ],
)
def test_a_call_that_does_not_fit_its_header_is_a_bug_caught_before_redis(
    script: b.Script, keys: int, args: int
) -> None:
    with pytest.raises(TypeError, match=script.name):
        script.call(["k"] * keys, ["a"] * args)


def test_a_send_record_of_the_wrong_size_is_caught() -> None:
    with pytest.raises(TypeError, match="14 fields"):
        b.send(b.send_keys(K), [[""] * 13])
