"""Agent processes for the family tests: each joins, reports readiness, then waits."""

from __future__ import annotations

import json
import sys
import time

from redisbus import Bus, BusSettings


def main() -> None:
    url, channel, name, parent, mode = sys.argv[1:6]
    s = BusSettings(metrics=False, heartbeat_s=0.1, agent_lease_s=0.6, replica=f"{name}/proc")
    bus = Bus.from_url(url, settings=s)
    ch = bus.channel(channel)
    agent = ch.join(name, parent=parent or None)
    print(json.dumps({"ready": name}), flush=True)
    if mode == "wait":
        res = agent.wait(timeout=30)
        print(json.dumps({"kind": res.kind, "at": time.time()}), flush=True)
    elif mode == "sleep":
        time.sleep(60)
    bus.close()


if __name__ == "__main__":
    main()
