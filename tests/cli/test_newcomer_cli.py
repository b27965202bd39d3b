"""The lifecycle from a shell (docs/reference/cli.md): complete, fail, cancel, remove and delete as
commands, so a name joined with `redisbus join` can end and be used again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from redisbus import Bus, BusSettings

Run = Callable[..., subprocess.CompletedProcess[str]]
BIN = shutil.which("redisbus", path=str(Path(sys.executable).parent)) or "redisbus"


@pytest.fixture
def cli(redis_url: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    env.update(COLUMNS="200", REDISBUS_URL=redis_url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=60, env=env)

    return run


def statuses(url: str, channel: str) -> dict[str, str]:
    with Bus.from_url(url, settings=BusSettings(metrics=False)) as bus:
        return {m.name: m.status for m in bus.attach(channel).tree()}


def test_cancel_then_remove_lets_a_name_join_again(cli: Run, redis_url: str) -> None:
    assert cli("join", "crew", "--as", "lead", "--routing", "family").returncode == 0
    assert cli("join", "crew", "--as", "kid", "--parent", "lead").returncode == 0
    got = cli("cancel", "crew", "kid", "--as", "lead", "--reason", "first run over")
    assert got.returncode == 0, got.stderr
    assert statuses(redis_url, "crew")["kid"] == "cancelled"
    again = cli("join", "crew", "--as", "kid", "--parent", "lead")
    assert again.returncode == 1 and "cancelled" in again.stderr
    gone = cli("remove", "crew", "kid")
    assert gone.returncode == 0, gone.stderr
    assert "kid" not in statuses(redis_url, "crew")
    assert cli("join", "crew", "--as", "kid", "--parent", "lead").returncode == 0
    assert statuses(redis_url, "crew")["kid"] == "running"


def test_complete_and_fail_reach_the_parent(cli: Run, redis_url: str) -> None:
    cli("join", "crew", "--as", "lead", "--routing", "family")
    cli("join", "crew", "--as", "a", "--parent", "lead")
    cli("join", "crew", "--as", "b", "--parent", "lead")
    assert cli("complete", "crew", "--as", "a", "scene 3 written").returncode == 0
    assert cli("fail", "crew", "--as", "b", "quota exhausted").returncode == 0
    assert statuses(redis_url, "crew") == {"lead": "running", "a": "completed", "b": "failed"}
    got = cli("read", "crew", "--as", "lead", "--json")
    assert got.returncode == 0, got.stderr
    assert "scene 3 written" in got.stdout and "quota exhausted" in got.stdout


def test_remove_and_delete_refuse_work_unless_forced(cli: Run, redis_url: str) -> None:
    cli("join", "crew", "--as", "w")
    assert cli("send", "crew", "--as", "x", "w", "undone").returncode == 0
    refused = cli("remove", "crew", "w")
    assert refused.returncode == 1 and "--force" not in refused.stdout
    assert "undone" in refused.stderr
    assert cli("delete", "crew").returncode == 1
    assert cli("remove", "crew", "w", "--force").returncode == 0
    assert cli("delete", "crew", "--force").returncode == 0
    with Bus.from_url(redis_url, settings=BusSettings(metrics=False)) as bus:
        assert bus.channels() == []
    assert cli("delete", "crew").returncode == 1  # unknown_channel
