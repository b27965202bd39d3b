"""The console on a Redis Cluster: the channel list, a snapshot, and a live receipt."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx

from redisbus import Bus, BusSettings
from tests.cli.test_console import console

if TYPE_CHECKING:  # imported by pytest as a plugin (below); importing it first warns
    from tests.support.cluster_servers import Cluster

pytest_plugins = ["tests.support.cluster_servers"]


def test_the_console_follows_a_channel_on_a_cluster(redis_cluster: Cluster) -> None:
    redis_cluster.wait_healthy()
    redis_cluster.flush()
    bus = Bus.from_url(redis_cluster.url, cluster=True, settings=BusSettings(metrics=False))
    try:
        ch = bus.channel("film", pair_rate_burst=1000, pair_rate_per_s=1000)
        director = ch.join("director")
        writer = ch.join("writer", parent="director")
        sent = director.send("writer", "Kick-off")
        assert writer.wait(timeout=5).messages[0].id == sent.id
        with console(redis_cluster.url, "--cluster") as base:
            listed = httpx.get(f"{base}/api/channels").json()["channels"]
            assert [(c["name"], c["members"], c["messages"]) for c in listed] == [("film", 2, 1)]
            statuses: list[str] = []
            with httpx.stream(
                "GET", f"{base}/api/events", params={"channel": "film"}, timeout=15
            ) as res:
                for line in res.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    snap = json.loads(line[6:])
                    (msg,) = snap["threads"][0]["messages"]
                    statuses.append(msg["receipts"][0]["status"])
                    if len(statuses) == 1:
                        writer.mark_done(sent.id)
                    else:
                        break
            assert statuses == ["read", "done"]
    finally:
        bus.close()
