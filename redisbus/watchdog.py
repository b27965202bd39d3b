"""The watchdog of ``redisbus exporter``: who has had unread messages for too long.

Not a Python API: a part of the exporter, configured by its settings
(docs/deployment.md#the-exporter); its Python names may change in any release.

Each snapshot of the fleet (:mod:`redisbus.fleet`) is compared with the previous one. When an
agent of a channel starts having unread messages older than the threshold, one warning line
is logged; when it has none any more, one info line. With a webhook URL, each of those
changes is also POSTed as a JSON object::

    {"event": "redisbus.watchdog", "state": "stale" | "recovered", "channel": "...",
     "agent": "...", "stale_unread": 2, "oldest_unread_age_s": 75.2, "threshold_s": 60.0}

from a background thread with a bounded queue, so a slow or dead receiver never delays the
exporter; its failures are logged, never raised.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.request
from typing import Any

from .fleet import AgentBacklog, FleetSnapshot

__all__ = ["Watchdog"]

log = logging.getLogger("redisbus.exporter")


class Watchdog:
    """Reports each (channel, agent) that starts or stops having stale unread messages."""

    def __init__(
        self, threshold_s: float, webhook_url: str | None = None, timeout_s: float = 5.0
    ) -> None:
        self.threshold_s = threshold_s
        self._stale: dict[tuple[str, str], AgentBacklog] = {}
        self._webhook = _Webhook(webhook_url, timeout_s) if webhook_url else None

    def check(self, snap: FleetSnapshot) -> list[dict[str, Any]]:
        """Compare with the previous snapshot; log and post each change. Returns the events."""
        now = {(b.channel, b.agent): b for b in snap.stale_backlogs()}
        events = [
            self._event("stale", b, snap.now_ms) for k, b in now.items() if k not in self._stale
        ]
        events += [
            self._event("recovered", b, snap.now_ms) for k, b in self._stale.items() if k not in now
        ]
        self._stale = now
        for e in events:
            self._log(e)
            if self._webhook is not None:
                self._webhook.post(e)
        return events

    def _event(self, state: str, b: AgentBacklog, now_ms: int) -> dict[str, Any]:
        age = (now_ms - b.oldest_unread_ms) / 1000 if b.oldest_unread_ms is not None else 0.0
        return {
            "event": "redisbus.watchdog",
            "state": state,
            "channel": b.channel,
            "agent": b.agent,
            "stale_unread": b.stale if state == "stale" else 0,
            "oldest_unread_age_s": round(max(age, 0.0), 3) if state == "stale" else 0.0,
            "threshold_s": self.threshold_s,
        }

    def _log(self, e: dict[str, Any]) -> None:
        if e["state"] == "stale":
            log.warning(
                "watchdog: channel %r agent %r has %d unread message(s) older than %g s "
                "(oldest %.1f s)",
                e["channel"], e["agent"], e["stale_unread"], e["threshold_s"],
                e["oldest_unread_age_s"],
            )  # fmt: skip
        else:
            log.info("watchdog: channel %r agent %r has no stale unread message now",
                     e["channel"], e["agent"])  # fmt: skip

    def close(self) -> None:
        if self._webhook is not None:
            self._webhook.close()


class _Webhook:
    """POSTs events from one daemon thread, so a slow receiver never delays a read of Redis.
    The queue is bounded: when the receiver cannot keep up, new events are dropped (logged)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=1000)
        self._thread = threading.Thread(target=self._run, name="redisbus-webhook", daemon=True)
        self._thread.start()

    def post(self, event: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("watchdog: webhook queue full, event dropped: %s", event)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=self.timeout_s + 1)

    def _run(self) -> None:
        while (event := self._queue.get()) is not None:
            self._send(event)

    def _send(self, event: dict[str, Any]) -> None:
        body = json.dumps(event).encode()
        req = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                r.read()
        except Exception as e:  # any failure of the receiver is logged, never raised
            log.warning("watchdog: webhook POST failed: %s", e)
