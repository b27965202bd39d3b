"""A stand-in agent host: a few agents on one host that keep messaging the agents of every
host on a shared channel, and serve their client metrics on ``/metrics``.

The monitoring stack (deploy/docker-compose.yml) runs two of these as host-a and host-b so
the dashboard has traffic to show; the tests run them against a real Redis and Prometheus.

    REDISBUS_URL=redis://127.0.0.1:6379/0 REDISBUS_HOST=host-a \\
        python deploy/agent_host.py --metrics-port 9108

Settings come from ``REDISBUS_*`` (``BusSettings``); ``REDISBUS_HOST`` names the host and
becomes the ``host`` label of its metrics. Only redisbus' public API is used.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import threading
import time
from types import FrameType

from redisbus import Agent, Bus, BusSettings, Channel, RedisbusError
from redisbus.metrics import serve_metrics

TYPES = ("message", "request", "status_update")


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--channel", default=env("REDISBUS_DEMO_CHANNEL", "fleet"))
    p.add_argument("--agents", type=int, default=2, help="agents on this host")
    p.add_argument("--rate", type=float, default=5.0, help="sends per second, whole host")
    p.add_argument(
        "--read-interval-s",
        type=float,
        default=float(env("REDISBUS_DEMO_READ_INTERVAL_S", "0.2")),
        help="how often agents fetch their messages (sets this host's delivery latency)",
    )
    p.add_argument("--duration-s", type=float, default=0.0, help="stop after this; 0: never")
    p.add_argument("--metrics-port", type=int, default=int(env("REDISBUS_METRICS_PORT", "9108")))
    p.add_argument("--metrics-addr", default=env("REDISBUS_METRICS_ADDR", "0.0.0.0"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    settings = BusSettings()
    if not settings.url:
        print("agent_host: set REDISBUS_URL to the fleet's Redis", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    server, _ = serve_metrics(args.metrics_port, args.metrics_addr)
    bus = Bus.from_settings(settings)
    try:
        channel = bus.channel(args.channel, routing="open")
        mine = [channel.join(f"{settings.host}-{i}") for i in range(args.agents)]
        print(
            f"agent_host: {settings.host} runs {[a.name for a in mine]} on {args.channel!r}, "
            f"metrics on :{server.server_port}",
            flush=True,
        )
        run(channel, mine, args, stop)
    finally:
        bus.close()
        server.shutdown()
    return 0


def run(
    channel: Channel, mine: list[Agent], args: argparse.Namespace, stop: threading.Event
) -> None:
    rng = random.Random()
    deadline = time.monotonic() + args.duration_s if args.duration_s > 0 else float("inf")
    send_every = 1.0 / args.rate if args.rate > 0 else float("inf")
    next_send = next_read = next_roster = time.monotonic()
    names: list[str] = []
    while not stop.is_set() and time.monotonic() < deadline:
        now = time.monotonic()
        if now >= next_roster:  # agents on other hosts join and leave
            names = [m.name for m in channel.tree()]
            next_roster = now + 2.0
        if now >= next_send:
            sender = rng.choice(mine)
            peers = [n for n in names if n != sender.name]
            if peers:
                # refusals (rate limits, full inboxes) are counted by the bus itself
                with contextlib.suppress(RedisbusError):
                    sender.send(rng.choice(peers), "status?", type=rng.choice(TYPES))
            next_send = now + send_every
        if now >= next_read:
            for agent in mine:
                fetch(agent)
            next_read = now + args.read_interval_s
        stop.wait(max(0.0, min(next_send, next_read) - time.monotonic()))


def fetch(agent: Agent) -> None:
    """Take what is waiting for ``agent`` without blocking, and mark it done."""
    try:
        for _ in range(20):  # bounded: at most 20 batches per visit
            got = agent.wait(timeout=0)  # the fetch that records delivery latency
            if got.kind != "message":
                return
            agent.mark_done(got.messages)
    except RedisbusError as e:
        print(f"agent_host: {agent.name}: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
