"""A replica process for the crash tests: handles messages slowly and logs what it does."""

from __future__ import annotations

import sys
import time

from redisbus import Bus, BusSettings


def main() -> None:
    url, channel, replica, log_path, handle_s = sys.argv[1:6]
    s = BusSettings(metrics=False, replica=replica, heartbeat_s=0.2, agent_lease_s=5)
    bus = Bus.from_url(url, settings=s)
    agent = bus.channel(channel).join("worker")
    with open(log_path, "a", buffering=1) as log:
        log.write("ready\n")
        while True:
            res = agent.wait(timeout=1)
            for m in res.messages:
                log.write(f"start {m.body}\n")
                time.sleep(float(handle_s))
                agent.mark_done(m)
                log.write(f"done {m.body}\n")


if __name__ == "__main__":
    main()
