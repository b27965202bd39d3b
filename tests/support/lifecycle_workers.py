"""A replica process for the lifecycle model (tests/faults/test_model_lifecycle.py).

It hosts agent handles of one channel under one stable replica name (two handles of one agent
may live here) and runs the commands the state machine sends it, one JSON object a line on
stdin, one JSON answer a line on stdout: ``{"ok": value, "s": seconds}`` or
``{"err": "ErrorClass", "msg": "...", "s": seconds}``. Its bus beats every ``heartbeat_s``
in the background, so the machine's clock (sleeps, Redis outages) is the agents' clock too.
The state machine SIGKILLs it between commands and starts it again under the same name.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from redisbus import Agent, Bus, BusSettings, Message, RedisbusError


def message(m: Message) -> dict[str, Any]:
    return {
        "id": m.id,
        "to": list(m.to),
        "sender": m.sender,
        "type": m.type,
        "subject": m.subject,
        "body": m.body,
        "deliveries": m.deliveries,
    }


def run(handles: dict[str, Agent], ch: Any, cmd: dict[str, Any]) -> Any:
    op = cmd["op"]
    if op == "join":
        a = ch.join(cmd["agent"], parent=cmd["parent"])
        handles[cmd["h"]] = a
        return a.replica
    a = handles[cmd["h"]]
    if op == "send":
        r = a.send(cmd["to"], cmd["body"])
        return {"id": r.id, "status": r.status}
    if op == "wait":
        w = a.wait(timeout=cmd["timeout"])
        a.flush()
        return {"kind": w.kind, "messages": [message(m) for m in w.messages]}
    if op == "read":
        msgs = a.read(filter_by="unread", limit=1000)
        a.flush()
        return [message(m) for m in msgs]
    if op == "mark_done":
        return a.mark_done(cmd["ids"])
    if op == "complete":
        return a.complete(cmd["text"])
    if op == "fail":
        return a.fail(cmd["text"])
    if op == "cancel":
        return a.cancel(cmd["child"], reason="model")
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    url, channel, replica, heartbeat_s, agent_lease_s = sys.argv[1:6]
    s = BusSettings(
        metrics=False,
        host="model-host",
        replica=replica,
        heartbeat_s=float(heartbeat_s),
        agent_lease_s=float(agent_lease_s),
    )
    bus = Bus.from_url(url, settings=s)
    ch = bus.channel(channel)
    handles: dict[str, Agent] = {}
    print(json.dumps({"ok": "ready"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        started = time.monotonic()
        try:
            answer: dict[str, Any] = {"ok": run(handles, ch, cmd)}
        except RedisbusError as e:
            answer = {"err": type(e).__name__, "msg": str(e)}
        answer["s"] = round(time.monotonic() - started, 3)
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
