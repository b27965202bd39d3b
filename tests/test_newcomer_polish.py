"""What a newcomer meets first, polished (issue 33): Ctrl-C ends ``redisbus demo`` at once and
cleanly, its transcript reads in time order, ``--help`` shows no placeholder after a flag, and
``redisbus console`` is a command like the others (its options complete in the shell)."""

from __future__ import annotations

import re

import pytest

from redisbus.cli import main


def help_of(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


# -- --help ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [(), ("demo",), ("tail",), ("read",), ("dlq",)])
def test_flags_show_no_value_placeholder_in_help(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")

    text = help_of(capsys, *command)

    assert "--help" in text
    assert "<bool>" not in text
    if command == ("demo",):
        assert re.search(r"--agents-procs\s+<int range>", text)  # values keep theirs
