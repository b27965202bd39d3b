"""A replica process for the model-based test (tests/faults/test_model_based.py).

It hosts agent handles of one channel under one stable replica name and runs the commands
the state machine sends it, one JSON object a line on stdin, one JSON answer a line on
stdout: ``{"ok": value}`` or ``{"err": "ErrorClass", "msg": "..."}``. The state machine
SIGKILLs it between (or during) commands and starts it again under the same replica name.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from redisbus import Agent, Bus, BusSettings, Message, Receipt, RedisbusError


def receipt(r: Receipt) -> dict[str, Any]:
    return {
        "id": r.id,
        "to": r.to,
        "status": r.status,
        "error": type(r.error).__name__ if r.error is not None else None,
    }


def result(out: Any) -> Any:
    if isinstance(out, Receipt):
        return receipt(out)
    return [result(x) for x in out]


def message(m: Message) -> dict[str, Any]:
    return {
        "id": m.id,
        "to": list(m.to),
        "sender": m.sender,
        "body": m.body,
        "read": m.read,
        "deliveries": m.deliveries,
    }


def run(agents: dict[str, Agent], ch: Any, cmd: dict[str, Any]) -> Any:
    op = cmd["op"]
    if op == "join":
        agents[cmd["agent"]] = ch.join(cmd["agent"])
        return agents[cmd["agent"]].id
    a = agents[cmd["agent"]]
    if op == "send":
        return result(a.send(cmd["to"], cmd["body"]))
    if op == "send_many":
        return [result(x) for x in a.send_many([tuple(i) for i in cmd["items"]])]
    if op == "wait":
        w = a.wait(timeout=cmd["timeout"])
        a.flush()
        return {"kind": w.kind, "messages": [message(m) for m in w.messages]}
    if op == "read":
        msgs = a.read(filter_by=cmd["filter"], limit=cmd["limit"])
        a.flush()
        return [message(m) for m in msgs]
    if op == "list":
        return [message(m) for m in a.list(filter_by=cmd["filter"], limit=cmd["limit"])]
    if op == "mark_done":
        return a.mark_done(cmd["ids"])
    raise ValueError(f"unknown op {op!r}")


def main() -> None:
    url, channel, replica, lease_s, max_deliveries = sys.argv[1:6]
    s = BusSettings(
        metrics=False,
        host="model-host",
        replica=replica,
        heartbeat_s=0.2,
        agent_lease_s=3600,
        lease_s=float(lease_s),
        max_deliveries=int(max_deliveries),
    )
    bus = Bus.from_url(url, settings=s)
    ch = bus.channel(channel)
    agents: dict[str, Agent] = {}
    print(json.dumps({"ok": "ready"}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            answer: dict[str, Any] = {"ok": run(agents, ch, cmd)}
        except RedisbusError as e:
            answer = {"err": type(e).__name__, "msg": str(e)}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
