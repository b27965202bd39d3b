"""Every file in examples/ runs (or, for configs, loads and starts what it names) against a real
redis-server, and says on its first line what it shows."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from redisbus import Bus, BusSettings
from redisbus.integrations.hermes import ChannelConfig
from redisbus.integrations.mcp import TOOL_NAMES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
BIN = Path(sys.executable).parent

# generous: the examples take a few seconds, but the test machine may be busy
TIMEOUT_S = 90

COVERED = {
    "two_processes.py",
    "async_fleet.py",
    "family.py",
    "a2a_bridge.py",
    "request_reply.py",
    "trace_two_processes.py",
    "hermes/config.yaml",
    "mcp/mcp.json",
}


def run_example(name: str, redis_url: str) -> str:
    env = dict(os.environ, REDISBUS_URL=redis_url, REDISBUS_METRICS="false")
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_every_example_is_tested_and_says_what_it_shows() -> None:
    files = {
        str(p.relative_to(EXAMPLES))
        for p in EXAMPLES.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert files == COVERED
    for name in files:
        first = (EXAMPLES / name).read_text().splitlines()[0]
        assert len(first) > 40, f"{name}: the first line should say what it shows"
        assert first.startswith(('"""', "# ", '{"description": ')), name


def test_two_processes_talk(redis_url: str) -> None:
    out = run_example("two_processes.py", redis_url)
    lines = out.splitlines()
    reviewer = next(x for x in lines if x.startswith("[reviewer pid"))
    writer = next(x for x in lines if x.startswith("[writer pid"))
    assert reviewer.split()[2] != writer.split()[2]  # two processes
    assert "reply from reviewer: 'Looks good, ship it.'" in writer
    assert "[writer] receipt: done (reviewed)" in lines


def test_a_fleet_of_100_async_agents(redis_url: str) -> None:
    out = run_example("async_fleet.py", redis_url)
    assert out.startswith("100 agents: 100 messages sent, received and done in ")


def test_parent_with_children(redis_url: str) -> None:
    out = run_example("family.py", redis_url)
    assert "('critic', 'child', 'running')" in out  # the roster
    assert "outcome from researcher: found three sources" in out
    assert "outcome from critic: no review needed this time" in out
    assert "('critic', 'lead', 'cancelled')" in out and "('writer', 'lead', 'completed')" in out


def test_a2a_bridge_both_ways(redis_url: str) -> None:
    out = run_example("a2a_bridge.py", redis_url)
    assert "[bus] bob got 'hi' from alice (the token's name)" in out
    assert "[a2a client] task TASK_STATE_COMPLETED: hello from the bus" in out
    assert "[bus] echo-agent replied 'echo: are you there?' (reply_to matches: True)" in out


def test_request_reply(redis_url: str) -> None:
    out = run_example("request_reply.py", redis_url)
    assert "asked 2+3, calculator answered 5 (a reply to " in out
    assert "then wait() returned: ['FYI: lunch at noon']" in out  # not lost to ask()
    assert "no answer from colleague: AskTimeout (request " in out


def test_a_trace_across_two_processes_on_the_console(redis_url: str) -> None:
    out = run_example("trace_two_processes.py", redis_url)
    lines = out.splitlines()
    [summary] = [x for x in lines if x.startswith("one trace, ")]
    trace_id = summary.split()[2].rstrip(",")
    spans = [x for x in lines if x.startswith("[pid ") and " trace=" in x]
    by_name = {(x.split()[1], x.split()[2], x.split()[3]): x for x in spans}
    pids = {x.split()[1] for x in spans}
    assert len(pids) == 2  # two processes printed spans
    # the asker's send and the reviewer's processing span carry the one trace id
    sends = [x for x in spans if " send " in x and "PRODUCER" in x]
    process = [x for x in spans if " process " in x and "CONSUMER" in x]
    assert len(sends) == 2 and len(process) == 1, by_name
    assert all(f"trace={trace_id}" in x for x in [*sends, *process])
    assert "reply: approved" in out


def test_hermes_config_loads_and_enables_the_plugin(redis_url: str, tmp_path: Path) -> None:
    config = yaml.safe_load((EXAMPLES / "hermes" / "config.yaml").read_text())
    cfg = ChannelConfig.resolve(config, env={"REDISBUS_URL": redis_url})
    assert cfg.enabled and cfg.url == redis_url and cfg.root_name == "director"
    # and in a real Hermes process with that file as its config.yaml
    home = tmp_path / "hermes"
    home.mkdir()
    shutil.copy(EXAMPLES / "hermes" / "config.yaml", home / "config.yaml")
    probe = textwrap.dedent(
        """
        import json
        import model_tools  # noqa: F401  (Hermes discovers its plugins on import)
        from hermes_cli.config import load_config
        from hermes_cli.plugins import get_plugin_manager
        from tools.registry import registry
        pm = get_plugin_manager()
        print(json.dumps({
            "enabled": load_config()["plugins"]["enabled"],
            "tool": registry.get_entry("agent_channel") is not None,
            "hooks": [h for h in ("subagent_start", "subagent_stop", "pre_llm_call")
                      if pm.has_hook(h)],
        }))
        """
    )
    env = dict(os.environ, HERMES_HOME=str(home), REDISBUS_URL=redis_url)
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {
        "enabled": ["redisbus"],
        "tool": True,
        "hooks": ["subagent_start", "subagent_stop", "pre_llm_call"],
    }


async def test_mcp_client_config_starts_redisbus_mcp(redis_url: str) -> None:
    config = json.loads((EXAMPLES / "mcp" / "mcp.json").read_text())
    [server] = config["mcpServers"].values()
    assert server["command"] == "redisbus" and server["args"][0] == "mcp"
    channel = f"team-{uuid.uuid4().hex[:6]}"
    args = [channel if a == "team-1" else a for a in server["args"]]
    env = {**os.environ, **server["env"], "REDISBUS_URL": redis_url, "REDISBUS_METRICS": "false"}
    params = StdioServerParameters(command=str(BIN / "redisbus"), args=args, env=env, cwd=ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        tools = (await session.list_tools()).tools
        assert sorted(t.name for t in tools) == sorted(TOOL_NAMES)
        res = await session.call_tool("agent_discover", {})
        assert not res.is_error
    bus = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    try:
        critic = bus.channel(channel).members()["critic"]
        assert critic.description == "reviews drafts and says what to fix"
        assert critic.skills == ("review",)
    finally:
        bus.close()


@pytest.mark.parametrize("name", sorted(n for n in COVERED if n.endswith(".py")))
def test_python_examples_are_lint_clean(name: str) -> None:
    # `make lint` covers the package and the tests; the examples are held to the same rules here
    for cmd in (["check", "--quiet"], ["format", "--check", "--quiet"]):
        p = subprocess.run(
            [str(BIN / "ruff"), *cmd, str(EXAMPLES / name)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        assert p.returncode == 0, p.stdout
