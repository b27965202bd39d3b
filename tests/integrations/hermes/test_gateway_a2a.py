"""A real Hermes 0.20+ gateway and a bus, through ``redisbus a2a``, both ways, with tokens.

``hermes gateway run`` (the fork's native A2A platform, on with ``A2A_PORT``, bearer tokens per
peer in ``A2A_PEER_TOKENS``) answers with the scripted stub model: ``config.yaml`` points the
main model at it (``model: {provider: custom, base_url: http://127.0.0.1:PORT/v1}``).
``redisbus a2a`` adds the gateway to a channel as member ``hermes`` (its token from
``--external-auth-file``) and serves the channel's members as A2A agents (callers' tokens
from ``--tokens-file``); Hermes reaches them with its own ``a2a_call`` tool (peers under
``a2a_agents`` in ``config.yaml``, each with its bearer token).

One turn, one message: alice (bus) -> hermes (gateway, A2A ``SendMessage``) -> the model
calls ``a2a_call`` -> bob (bus, through the inbound bridge) -> bob's answer back to Hermes ->
the model waits longer than 60 s (a long turn: the bridge must hold the request open; its
default ``--external-timeout`` is 300 s) -> the answer back to alice on the bus.

What the fork does that the setup relies on (``plugins/platforms/a2a/``): the gateway's
card is public (a wrong token never stops ``redisbus a2a``'s card fetch; its messages get 401);
the ``a2a`` client toolset is off by default on every platform (``platform_toolsets``
turns it on for A2A sessions); ``a2a_discover`` reads ``.well-known/agent-card.json`` without
an ``A2A-Version`` header and says "Auth required" only when the card has the 0.3 ``security``
field.

Only on Hermes 0.20+ (the official package stops at 0.19, which has no A2A platform);
``tests/integrations/test_hermes_20.py`` runs this directory in its own virtualenv with the fork.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from harness import HERMES_VERSION
from stub_model import Action, Conversation, StubModel, text, tool_call

from redisbus import Bus, BusSettings
from redisbus.embedded import free_port

pytestmark = pytest.mark.skipif(
    HERMES_VERSION < (0, 20),
    reason="Hermes's native A2A platform needs Hermes 0.20+ "
    "(tests/integrations/test_hermes_20.py runs it)",
)

BIN = Path(sys.executable).parent
HERMES = BIN / "hermes"
REPO = Path(__file__).resolve().parents[3]

ASK = "Ask bob for the status of build 1234."
BOB_QUESTION = "What is the status of build 1234?"
BOB_ANSWER = "build 1234 is green"
FINAL = f"bob says: {BOB_ANSWER}"
SLOW_TURN_S = 62.0  # the model's last call of the turn: longer than 60 s
PEER_NAME = "redisbus"  # the bridge's identity at the gateway (A2A_PEER_TOKENS)
CALLER = "hermes-peer"  # the gateway's member name on the bus (the bridge's --tokens-file)


# ---------------------------------------------------------------------------------------
# The model


@dataclass
class Script:
    """The gateway's model: ask bob through A2A (and a peer with a wrong token, and read
    bob's card), then take more than a minute to answer with what bob said."""

    bridge: str
    slow_turns: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: dict[str, Any]) -> list[Action]:
        c = Conversation(request)
        if not c.tool_names:  # an auxiliary call (the session's title)
            return [text("A2A bridge test")]
        if not any(ASK in u for u in c.user_messages):
            return [text("nothing to do")]
        if not any(call["name"] == "a2a_call" for call in c.tool_calls):
            return [
                tool_call("a2a_call", agent="bob", message=BOB_QUESTION),
                tool_call("a2a_call", agent="bob-wrong-token", message=BOB_QUESTION),
                tool_call("a2a_discover", url=f"{self.bridge}/agents/bob"),
            ]
        with self.lock:
            self.slow_turns += 1
        time.sleep(SLOW_TURN_S)
        results = "\n".join(c.tool_results)
        return [text(FINAL if BOB_ANSWER in results else f"no answer from bob: {results[-500:]}")]


def final_tool_results(stub: StubModel) -> str:
    """The tool results the model saw when it answered (the turn's last call)."""
    for req in reversed(stub.requests):
        c = Conversation(req)
        if c.tool_results and any(ASK in u for u in c.user_messages):
            return "\n".join(c.tool_results)
    return ""


# ---------------------------------------------------------------------------------------
# Processes


def _tail(path: Path, n: int = 4000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


@dataclass
class Proc:
    """A subprocess in a session of its own, its output in files."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @classmethod
    def start(cls, cmd: list[str], env: dict[str, str], where: Path, name: str) -> Proc:
        out, err = where / f"{name}.out", where / f"{name}.err"
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(
                cmd, cwd=where, env=env, stdout=o, stderr=e, start_new_session=True
            )
        return cls(proc, out, err)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def logs(self) -> str:
        return f"--- stdout ---\n{_tail(self.out)}\n--- stderr ---\n{_tail(self.err)}"


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HERMES_", "A2A_", "REDISBUS_")) and k not in ("VIRTUAL_ENV",)
    }
    env.update(extra)
    return env


def bridge_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "redisbus.cli", "a2a", *args]


# logged at the end of the gateway's start, after its startup restore: a message that
# arrives during that restore is queued and replayed, and the fork then runs its turn twice
READY_LINE = "Press Ctrl+C to stop"


def card_answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/.well-known/agent-card.json", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@dataclass
class Gateway:
    url: str
    token: str  # the bridge's bearer token at the gateway
    bridge: str  # where the bridge for the main test will listen
    bob_token: str  # the gateway's bearer token at the bridge
    home: Path
    stub: StubModel
    script: Script
    proc: Proc


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    if not HERMES.exists():
        pytest.fail(f"no hermes command beside {sys.executable}")
    tmp = tmp_path_factory.mktemp("hermes-gateway")
    home = tmp / "home"
    home.mkdir()
    port, bridge_port = free_port(), free_port()
    bridge = f"http://127.0.0.1:{bridge_port}"
    token, bob_token = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    script = Script(bridge)
    stub = StubModel(script).start()
    peer = {"url": f"{bridge}/agents/bob", "timeout": 60}
    config = {
        "model": {
            "default": "stub-model",
            "provider": "custom",
            "base_url": stub.base_url,
            "api_key": "stub",
        },
        "agent": {"environment_probe": False},
        # the a2a client tools are off by default on every platform: on for A2A sessions
        "platform_toolsets": {"a2a": ["hermes-a2a", "a2a"]},
        "a2a_agents": {
            "bob": {**peer, "auth": {"type": "bearer", "token": bob_token}},
            "bob-wrong-token": {**peer, "auth": {"type": "bearer", "token": "not-" + bob_token}},
        },
    }
    (home / "config.yaml").write_text(json.dumps(config, indent=2) + "\n")  # JSON is YAML
    env = clean_env(
        HERMES_HOME=str(home),
        A2A_PORT=str(port),
        A2A_PEER_TOKENS=f"{PEER_NAME}:{token}",
        A2A_AGENT_NAME="Hermes Gateway",
        PYTHONUNBUFFERED="1",
    )
    proc = Proc.start([str(HERMES), "gateway", "run", "-v"], env, tmp, "gateway")
    url = f"http://127.0.0.1:{port}"
    gw = Gateway(url, token, bridge, bob_token, home, stub, script, proc)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.alive(), f"hermes gateway run exited\n{proc.logs()}"
            assert time.monotonic() < deadline, f"no A2A card from the gateway\n{proc.logs()}"
            if READY_LINE in _tail(proc.err, 100_000) and card_answers(url):
                break
            time.sleep(0.5)
        yield gw
    finally:
        proc.stop()
        stub.close()


@pytest.fixture
def bus(redis_url: str) -> Iterator[Bus]:
    b = Bus.from_url(redis_url, settings=BusSettings(metrics=False))
    yield b
    b.close()


def wait_member(bus: Bus, chan: str, name: str, proc: Proc, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while name not in bus.channel(chan).members():
        assert proc.alive(), f"redisbus a2a exited\n{proc.logs()}"
        assert time.monotonic() < deadline, f"{name} never joined {chan}\n{proc.logs()}"
        time.sleep(0.1)


def done_result(sender: Any, message_id: str, timeout: float = 10) -> str | None:
    """The result its recipient marked the message done with (the reply comes first)."""
    deadline = time.monotonic() + timeout
    while True:
        [receipt] = sender.receipt(message_id)
        if receipt.status == "done" or time.monotonic() > deadline:
            return receipt.result if receipt.status == "done" else f"not done: {receipt.status}"
        time.sleep(0.1)


def serve_bob(bus: Bus, chan: str, stop: threading.Event, seen: list[Any]) -> threading.Thread:
    bob = bus.channel(chan).join("bob", description="knows the builds", skills=["builds"])

    def run() -> None:
        while not stop.is_set():
            for m in bob.wait(timeout=0.5).messages:
                seen.append(m)
                bob.send(m.sender, BOB_ANSWER, reply_to=m.id, type="response")
                bob.mark_done(m)

    t = threading.Thread(target=run, name="bob", daemon=True)
    t.start()
    return t


# ---------------------------------------------------------------------------------------
# Tests


def test_a_bus_member_asks_hermes_and_hermes_asks_a_bus_member_in_a_turn_over_60s(
    gateway: Gateway, bus: Bus, redis_url: str, tmp_path: Path
) -> None:
    chan = f"gw-{uuid.uuid4().hex[:8]}"
    tokens, auth = tmp_path / "tokens.json", tmp_path / "external-auth.json"
    tokens.write_text(json.dumps({gateway.bob_token: CALLER}))
    auth.write_text(json.dumps({"hermes": gateway.token}))
    port = gateway.bridge.rsplit(":", 1)[1]
    args = ["--channel", chan, "--port", port, "--url", redis_url, "--tokens-file", str(tokens)]
    args += ["--external", f"hermes={gateway.url}", "--external-auth-file", str(auth)]
    stop = threading.Event()
    seen: list[Any] = []
    bob = serve_bob(bus, chan, stop, seen)
    bridge = Proc.start(bridge_cmd(*args), clean_env(), tmp_path, "bridge")
    try:
        argv = cast(list[str], bridge.proc.args)  # Proc.start's cmd
        assert gateway.token not in " ".join(argv)  # tokens never on argv
        wait_member(bus, chan, "hermes", bridge)
        alice = bus.channel(chan).join("alice")
        t0 = time.monotonic()
        sent = alice.send("hermes", ASK)
        reply = None
        while reply is None and time.monotonic() - t0 < 170:
            for m in alice.wait(timeout=5).messages:
                if m.reply_to == sent.id:
                    reply = m
            assert bridge.alive(), bridge.logs()
        elapsed = time.monotonic() - t0
        assert reply is not None, f"no answer in {elapsed:.0f} s\n{bridge.logs()}"
        results = final_tool_results(gateway.stub)

        # the answer came back on the bus, after a turn longer than a minute
        assert (reply.sender, reply.type, reply.body) == ("hermes", "response", FINAL), (
            reply.body,
            results,
        )
        assert elapsed > 60, elapsed
        assert gateway.script.slow_turns == 1  # the long call was neither retried nor cut
        assert sent.id is not None
        assert done_result(alice, sent.id) == "replied"

        # outbound: the bridge's token named it at the gateway (A2A_PEER_TOKENS)
        first = next(
            Conversation(r)
            for r in gateway.stub.requests
            if any(ASK in u for u in Conversation(r).user_messages)
        )
        assert f"remote agent peer named '{PEER_NAME}'" in first.user_messages[0]
        audit = [
            json.loads(line) for line in (gateway.home / "a2a_audit.jsonl").read_text().splitlines()
        ]
        assert any(a["direction"] == "inbound" and a["peer"] == PEER_NAME for a in audit)

        # inbound: Hermes's a2a_call reached bob as the member its token names, once; the
        # peer with a wrong token got 401 and nothing reached the bus
        assert [(m.sender, m.body) for m in seen] == [(CALLER, BOB_QUESTION)]
        assert "[bob · context" in results and BOB_ANSWER in results, results
        assert "peer 'bob-wrong-token' rejected auth (HTTP 401)" in results, results
        # a2a_discover reads bob's card at .well-known/agent-card.json (A2A 1.0) and looks
        # for the 0.3 `security` field, which the bridge serves there only to 0.3 clients
        # (A2A-Version: 0.3, or the agent.json path): it reports bob as open
        assert "Agent: bob" in results and "Auth required: no" in results, results
        assert "Traceback" not in _tail(bridge.err)
    finally:
        stop.set()
        bridge.stop()
        bob.join(10)


def test_wrong_or_missing_tokens_get_401_on_both_sides(
    gateway: Gateway, bus: Bus, redis_url: str, tmp_path: Path
) -> None:
    # the gateway: no token, a wrong token -> 401 before anything is dispatched
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"role": "ROLE_USER", "parts": [{"text": "hi"}], "messageId": "m-1"}},
    }
    for headers in ({}, {"Authorization": "Bearer not-" + gateway.token}):
        r = httpx.post(gateway.url + "/", json=body, headers=headers, timeout=10)
        assert r.status_code == 401, r.text
    # its card is public: a wrong token does not stop the card fetch
    assert httpx.get(f"{gateway.url}/.well-known/agent-card.json", timeout=10).status_code == 200

    # redisbus a2a with a wrong token and with none: it starts (the card answers), and each
    # message comes back to its sender saying 401; the original is done, failed
    chan = f"gw-{uuid.uuid4().hex[:8]}"
    auth = tmp_path / "external-auth.json"
    auth.write_text(json.dumps({"hermes-wrong": "not-" + gateway.token}))
    port = free_port()
    args = ["--channel", chan, "--port", str(port), "--url", redis_url]
    args += [
        "--external",
        f"hermes-wrong={gateway.url}",
        "--external",
        f"hermes-none={gateway.url}",
    ]
    args += ["--external-auth-file", str(auth)]
    bridge = Proc.start(bridge_cmd(*args), clean_env(), tmp_path, "bridge")
    try:
        wait_member(bus, chan, "hermes-wrong", bridge)
        wait_member(bus, chan, "hermes-none", bridge)
        carol = bus.channel(chan).join("carol")
        sent = {carol.send(name, "hi").id: name for name in ("hermes-wrong", "hermes-none")}
        replies: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while len(replies) < 2 and time.monotonic() < deadline:
            for m in carol.wait(timeout=2).messages:
                assert m.reply_to is not None, m
                replies[m.reply_to] = m
        assert set(replies) == set(sent), bridge.logs()
        for mid, m in replies.items():
            assert (m.sender, m.type) == (sent[mid], "status_update")
            assert "401 Unauthorized" in m.body.splitlines()[0], m.body
            assert done_result(carol, mid) == "failed"
        # the inbound side of this bridge has no caller tokens: 401 with WWW-Authenticate
        r = httpx.post(
            f"http://127.0.0.1:{port}/agents/carol/",
            json=body,
            headers={"Authorization": "Bearer " + gateway.token},
            timeout=10,
        )
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        assert bridge.alive()
    finally:
        bridge.stop()
    err = _tail(bridge.err, 20000)
    assert "Traceback" not in err and gateway.token not in err
    failed = [ln for ln in err.splitlines() if "failed on" in ln]
    assert len(failed) == 2 and all("401 Unauthorized" in ln for ln in failed), err

    # a URL where the gateway has no agent: the card fetch fails, one line, exit 2
    proc = subprocess.run(
        bridge_cmd(
            "--channel",
            chan,
            "--port",
            str(free_port()),
            "--url",
            redis_url,
            "--external",
            f"{gateway.url}/no-such-agent",
        ),
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = [ln for ln in proc.stderr.strip().splitlines() if "no caller tokens" not in ln]
    assert proc.returncode == 2 and len(lines) == 1 and "404" in lines[0], proc.stderr


def test_a_token_the_gateway_refuses_is_reported_in_one_line(
    gateway: Gateway, bus: Bus, redis_url: str, tmp_path: Path
) -> None:
    chan = f"gw-{uuid.uuid4().hex[:8]}"
    auth = tmp_path / "external-auth.json"
    auth.write_text(json.dumps({"hermes": "not-" + gateway.token}))
    args = ["--channel", chan, "--port", str(free_port()), "--url", redis_url]
    args += ["--external", f"hermes={gateway.url}", "--external-auth-file", str(auth)]
    bridge = Proc.start(bridge_cmd(*args), clean_env(), tmp_path, "bridge")
    try:
        wait_member(bus, chan, "hermes", bridge)
        carol = bus.channel(chan).join("carol")
        sent = carol.send("hermes", "hi")
        [reply] = carol.wait(timeout=30).messages
        assert reply.reply_to == sent.id and "401" in reply.body
    finally:
        bridge.stop()
    failed = [ln for ln in _tail(bridge.err).splitlines() if "401" in ln or "http" in ln]
    assert "\n" not in reply.body, reply.body
    assert len(failed) == 1, failed
