"""docs/getting-started.md's "Two hosts, one bus" runs as written: each shell block on the
host its paragraph names, host A's blocks in one bash and host B's in another (two terminals),
in order. The one change: port 6390 becomes a free port, so parallel runs do not collide."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from redisbus.embedded import free_port
from tests.support.servers import binary, missing

DOC = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"


def steps() -> list[tuple[str, str]]:
    """(host, bash block) of the walk-through, in order."""
    text = DOC.read_text()
    section = text[text.index("## Two hosts, one bus") :]
    section = section[: section.index("\n## ", 3)]
    out, host = [], ""
    for prose, block in re.findall(r"(.*?)```bash\n(.*?)```", section, re.S):
        named = re.findall(r"\*\*host ([AB])\*\*", prose)
        host = named[-1] if named else host
        out.append((host, block))
    return out


def test_the_walkthrough_names_a_host_for_every_step() -> None:
    got = steps()
    assert [h for h, _ in got] == ["A", "B", "A", "B", "A"]
    assert any("bus.attach(" in b for _, b in got)


class Shell:
    """A bash that keeps its variables between blocks: one host's terminal."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=cwd,
        )
        self.cwd = cwd
        self.n = 0

    def run(self, block: str) -> str:
        self.n += 1
        script = self.cwd / f"step-{id(self)}-{self.n}.sh"
        script.write_text("set -e -o pipefail\n" + block)
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f"source {script} </dev/null; echo __step_ok__\n")
        self.proc.stdin.flush()
        lines: list[str] = []
        for line in self.proc.stdout:
            if line.strip() == "__step_ok__":
                return "".join(lines)
            lines.append(line)
        pytest.fail(f"the step failed:\n{block}\n--- output ---\n{''.join(lines)}")

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(10)


def test_two_hosts_walkthrough_runs_as_written(tmp_path: Path) -> None:
    if binary("redis7") is None or shutil.which("redis-cli") is None:
        missing("redis-server and redis-cli on PATH")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    hosts = {"A": Shell(env, tmp_path), "B": Shell(env, tmp_path)}
    said = []
    try:
        for host, block in steps():
            said.append(hosts[host].run(block.replace("6390", str(port))))
    finally:
        for sh in hosts.values():
            sh.close()
        with contextlib.suppress(redis.RedisError):  # a failed step leaves the server up
            redis.Redis(port=port, password="use-a-long-random-secret").shutdown(nosave=True)
    output = "".join(said)
    assert "worker-b ready" in output
    assert "done: summarise scene 3" in output  # the outcome reached host A's lead
    assert "host=host-a" in output and "host=host-b" in output
    assert "completed" in output


def test_the_families_example_of_concepts_runs_twice(redis_url: str) -> None:
    text = (DOC.parent / "concepts.md").read_text()
    (example,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "wait_children" in b]
    program = f"from redisbus import Bus\nbus = Bus.from_url({redis_url!r})\n{example}bus.close()\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("REDISBUS_")}
    for run in (1, 2):  # the second run used to raise AgentClosed: the names had ended
        got = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=60
        )
        assert got.returncode == 0, (run, got.stderr)
        assert got.stdout.strip() == "outcome ['findings: ...', 'changed plan']"
