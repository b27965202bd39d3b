"""Two OS processes talking over the bus: a writer asks, a reviewer in another process answers.

REDISBUS_URL=redis://localhost:6379/0 python examples/two_processes.py
python examples/two_processes.py          # no REDISBUS_URL: a private Redis for the run
"""

from __future__ import annotations

import os
import subprocess
import sys

from redisbus import Bus

CHANNEL = "example-two-processes"


def reviewer(url: str) -> None:
    """The second process: joins, answers the first message it gets, and leaves."""
    bus = Bus.from_url(url)
    me = bus.channel(CHANNEL).join("reviewer")
    got = me.wait(timeout=10)
    for msg in got.messages:
        print(f"[reviewer pid {os.getpid()}] got from {msg.sender}: {msg.body!r}", flush=True)
        me.send(msg.sender, "Looks good, ship it.", reply_to=msg.id, type="response")
        me.mark_done(msg, result="reviewed")
    bus.close()


def writer() -> None:
    url = os.environ.get("REDISBUS_URL")
    bus = Bus.from_url(url) if url else Bus.embedded()
    ch = bus.channel(CHANNEL)
    me = ch.join("writer")
    ch.join("reviewer")  # the reviewer's inbox exists before the other process starts
    other = subprocess.Popen([sys.executable, __file__, "reviewer", str(bus.url)])

    sent = me.send("reviewer", "Draft v1 of scene 3 is ready", subject="review")
    reply = me.wait(timeout=10).messages[0]
    print(f"[writer pid {os.getpid()}] reply from {reply.sender}: {reply.body!r}")
    assert reply.reply_to == sent.id
    other.wait(10)
    [receipt] = me.receipt(sent.id)
    print(f"[writer] receipt: {receipt.status} ({receipt.result})")
    bus.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["reviewer"]:
        reviewer(sys.argv[2])
    else:
        writer()
