"""Generate grafana/dashboards/redisbus.json, the redisbus overview dashboard.

The JSON is committed (Grafana provisions it as is); this script is its source. After editing
a panel here, run ``python grafana/generate.py``; ``--check`` exits 1 when the committed JSON
is stale, and the test suite runs it.

Every query filters on the ``job`` and ``instance`` variables and every range uses
``$__rate_interval``. Fleet gauges (``redisbus_unread_messages`` ...) come from one
``redisbus exporter`` per Redis deployment; they are combined with ``max`` so that two
exporter replicas watching the same Redis are not counted twice. Client series (sends,
latency ...) come from every agent host and are summed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "redisbus.json"
UID = "redisbus-overview"
DS = {"type": "prometheus", "uid": "${datasource}"}
F = 'job=~"$job",instance=~"$instance"'
RI = "$__rate_interval"

Panel = dict[str, Any]


def sel(metric: str, extra: str = "") -> str:
    """``metric{job=~"$job",instance=~"$instance"[,extra]}``."""
    return f"{metric}{{{F}{',' + extra if extra else ''}}}"


def rate(metric: str, fn: str = "rate") -> str:
    return f"{fn}({sel(metric)}[{RI}])"


def quantile(q: float, by: str) -> str:
    return (
        f"histogram_quantile({q}, sum by ({by}) "
        f"({rate('redisbus_delivery_latency_seconds_bucket')}))"
    )


def target(expr: str, legend: str = "__auto", **extra: Any) -> dict[str, Any]:
    return {"expr": expr, "legendFormat": legend, "datasource": DS, **extra}


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str = "short",
    *,
    width: int = 12,
    stack: bool = False,
    threshold: float | None = None,
) -> Panel:
    custom: dict[str, Any] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10}
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
        custom["fillOpacity"] = 40
    if threshold is not None:
        custom["thresholdsStyle"] = {"mode": "line+area"}
        steps.append({"color": "red", "value": threshold})
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "_width": width,
        "_height": 8,
        "fieldConfig": {
            "defaults": {
                "unit": unit,
                "min": 0,
                "custom": custom,
                "thresholds": {"mode": "absolute", "steps": steps},
            },
            "overrides": [],
        },
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "targets": targets,
    }


def stat(
    title: str, description: str, expr: str, unit: str = "short", **thresholds: float
) -> Panel:
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": c, "value": v} for c, v in thresholds.items()]
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "_width": 4,
        "_height": 4,
        "fieldConfig": {
            "defaults": {"unit": unit, "thresholds": {"mode": "absolute", "steps": steps}},
            "overrides": [],
        },
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        },
        "targets": [target(expr, "")],
    }


def heatmap(title: str, description: str, expr: str) -> Panel:
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "_width": 12,
        "_height": 8,
        "options": {
            "calculate": False,
            "yAxis": {"unit": "s"},
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
            "tooltip": {"show": True, "yHistogram": True},
        },
        "targets": [target(expr, "{{le}}", format="heatmap")],
    }


def row(title: str) -> Panel:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_width": 24}


def panels() -> list[Panel]:
    fleet_note = "From `redisbus exporter` (job redisbus-exporter), read from Redis."
    client_note = "Client metrics, summed over the agent hosts (job redisbus-agents)."
    p50, p95, p99 = 0.5, 0.95, 0.99
    max_running = "max(" + sel("redisbus_agents", 'status="running"') + ")"
    return [
        row("Fleet at a glance"),
        stat(
            "Channels",
            f"Channels on the bus (one Redis stream each). {fleet_note}",
            f"max({sel('redisbus_channels')})",
        ),
        stat(
            "Unread messages",
            "Messages queued for an agent that has not fetched them yet, over the whole "
            f"fleet. {fleet_note}",
            f"max({sel('redisbus_unread_messages')})",
        ),
        stat(
            "Oldest unread",
            "Age of the oldest unread message anywhere in the fleet. Over 60 s the watchdog "
            f"logs it and RedisbusStaleUnread starts counting. {fleet_note}",
            f"max({sel('redisbus_oldest_unread_age_seconds')})",
            "s",
            orange=30,
            red=60,
        ),
        stat(
            "Pending",
            "Messages fetched by an agent but not yet acknowledged: work in progress. A "
            f"number that only grows means agents crash mid-message. {fleet_note}",
            f"max({sel('redisbus_pending_messages')})",
        ),
        stat(
            "Dead letters",
            "Messages parked in dead-letter streams after too many deliveries. Any is worth a "
            f"look: `redisbus dlq list`. {fleet_note}",
            f"max({sel('redisbus_dead_letters')})",
            red=1,
        ),
        stat(
            "Agents running",
            f"Agents whose status is running. {fleet_note}",
            max_running,
        ),
        row("Traffic"),
        timeseries(
            "Send rate by type",
            "Messages appended to a channel stream per second, by message type (a broadcast "
            f"counts once). {client_note}",
            [target(f"sum by (type) ({rate('redisbus_messages_sent_total')})", "{{type}}")],
            "cps",
            stack=True,
        ),
        timeseries(
            "Refusals by reason",
            "Sends refused per second, by reason: inbox_full (recipient behind), rate_limited "
            "(sender too chatty), too_large, chain_too_deep, loop, routing_refused, "
            "unknown_agent, recipient_closed, channel_paused, budget, invalid_input, "
            "not_permitted, agent_closed, connection; anything else is counted as other. "
            f"{client_note}",
            [target(f"sum by (reason) ({rate('redisbus_send_rejected_total')})", "{{reason}}")],
            "cps",
            stack=True,
        ),
        timeseries(
            "Messages rejected by receivers",
            "Entries a receiver refused per second, by reason: unsigned, bad_signature, "
            "untrusted_key, revoked, not_allowed (a key used for a name or channel it may not "
            "speak for), misaddressed (a redirected copy), stale (signing time out of the "
            "window), replay. Any of these in a fleet whose hosts all sign is an attack or a "
            f"misconfigured host. {client_note}",
            [target(f"sum by (reason) ({rate('redisbus_messages_rejected_total')})", "{{reason}}")],
            "cps",
            stack=True,
        ),
        timeseries(
            "Refused share of sends",
            "Refusals (per recipient) as a share of refusals plus sent messages: roughly the "
            "share of send attempts refused. RedisbusRefusalRateHigh fires "
            f"above 10% sustained for 10 minutes. {client_note}",
            [
                target(
                    f"sum({rate('redisbus_send_rejected_total')}) / clamp_min("
                    f"sum({rate('redisbus_messages_sent_total')}) + "
                    f"sum({rate('redisbus_send_rejected_total')}), 1e-9)",
                    "refused",
                )
            ],
            "percentunit",
            threshold=0.1,
        ),
        timeseries(
            "Receive and done rates per host",
            "Messages fetched (received) and marked done per second, per agent host. Done "
            "lagging received for long means agents fetch work they do not finish. "
            f"{client_note}",
            [
                target(
                    f"sum by (host) ({rate('redisbus_messages_received_total')})",
                    "received {{host}}",
                ),
                target(f"sum by (host) ({rate('redisbus_messages_done_total')})", "done {{host}}"),
            ],
            "cps",
        ),
        row("Delivery latency"),
        timeseries(
            "Delivery latency per host (p50 / p95 / p99)",
            "Time from a message being appended to its recipient fetching it, for agents on "
            "each host. Both ends are read on the Redis clock, so host clocks do not skew it. "
            "It includes time the recipient spent busy before calling wait/read. "
            "RedisbusDeliveryLatencyP99High fires when a host's p99 stays above 30 s.",
            [
                target(quantile(p50, "le, host"), "p50 {{host}}"),
                target(quantile(p95, "le, host"), "p95 {{host}}"),
                target(quantile(p99, "le, host"), "p99 {{host}}"),
            ],
            "s",
        ),
        timeseries(
            "Delivery latency, whole fleet (p50 / p95 / p99)",
            "The same latency aggregated over every host: the buckets of all hosts are summed "
            "before the quantile is taken.",
            [
                target(quantile(p50, "le"), "p50"),
                target(quantile(p95, "le"), "p95"),
                target(quantile(p99, "le"), "p99"),
            ],
            "s",
        ),
        heatmap(
            "Delivery latency distribution",
            "How many fetches fell in each latency bucket (1 ms to 10 min) per interval, all "
            "hosts together: a second band far to the top means some recipients are slow.",
            f"sum by (le) ({rate('redisbus_delivery_latency_seconds_bucket', 'increase')})",
        ),
        timeseries(
            "Fetches per host",
            "Messages fetched per second on each host (the latency histogram's count). A host "
            f"at zero while others are busy has no live agents. {client_note}",
            [
                target(
                    f"sum by (host) ({rate('redisbus_delivery_latency_seconds_count')})",
                    "{{host}}",
                )
            ],
            "cps",
        ),
        row("Backlog"),
        timeseries(
            "Unread backlog",
            "Unread messages over the fleet, and how many of them are older than the watchdog "
            f"threshold (default 60 s). A growing backlog means agents fall behind. {fleet_note}",
            [
                target(f"max({sel('redisbus_unread_messages')})", "unread"),
                target(
                    f"max({sel('redisbus_watchdog_stale_unread_messages')})",
                    "unread older than the watchdog threshold",
                ),
            ],
        ),
        timeseries(
            "Oldest unread age",
            "Age of the oldest unread message anywhere. The red line is the 60 s watchdog "
            f"threshold that RedisbusStaleUnread uses. {fleet_note}",
            [target(f"max({sel('redisbus_oldest_unread_age_seconds')})", "oldest unread")],
            "s",
            threshold=60,
        ),
        timeseries(
            "Pending (fetched, not acknowledged)",
            "Messages an agent has fetched but not yet acknowledged. They are redelivered to "
            f"another replica when the fetching replica's lease runs out. {fleet_note}",
            [target(f"max({sel('redisbus_pending_messages')})", "pending")],
        ),
        timeseries(
            "Top channels by unread",
            "Unread messages of the busiest channels. Only the exporter's top N channels have "
            f"a per-channel series; the rest are in the fleet total. {fleet_note}",
            [
                target(
                    f"topk(10, max by (channel) ({sel('redisbus_channel_unread_messages')}))",
                    "{{channel}}",
                )
            ],
        ),
        row("Failures"),
        timeseries(
            "Redeliveries and dead-lettering",
            "Messages fetched again after a replica's lease ran out (redeliveries), and "
            "messages moved to a dead-letter stream after too many deliveries, per second. "
            f"{client_note}",
            [
                target(f"sum({rate('redisbus_redeliveries_total')})", "redelivered"),
                target(f"sum({rate('redisbus_dead_lettered_total')})", "dead-lettered"),
                # counted in Redis and served by every exporter of it: max, not sum
                target(
                    f"max({rate('redisbus_janitor_dead_lettered_total')})",
                    "dead-lettered by janitors",
                ),
            ],
            "cps",
        ),
        timeseries(
            "Dead letters stored",
            "Messages currently held in dead-letter streams. RedisbusDeadLettersGrowing fires "
            f"when this rises; replaying them brings it down. {fleet_note}",
            [target(f"max({sel('redisbus_dead_letters')})", "dead letters")],
        ),
        timeseries(
            "Stream entries held, added and removed",
            "Entries of the channel streams and of the dead-letter streams: held now (XLEN), "
            "ever added (kept by Redis with each stream) and removed (trimmed by a janitor, or "
            "a replayed dead letter deleted). Added only grows: a fall is entries lost without "
            f"a trim, and RedisbusStoredEntriesLost fires. {fleet_note}",
            [
                target(f"max by (stream) ({sel('redisbus_stream_entries')})", "{{stream}} held"),
                target(
                    f"max by (stream) ({sel('redisbus_stream_entries_added')})",
                    "{{stream}} added",
                ),
                target(
                    f"max by (stream) ({sel('redisbus_stream_entries_removed')})",
                    "{{stream}} removed",
                ),
            ],
            width=24,
        ),
        row("Agents and channels"),
        timeseries(
            "Agents by status",
            "Agents on every channel by status: running, waiting, idle, completed, failed, "
            f"cancelled, lost (a replica stopped heartbeating). {fleet_note}",
            [target(f"max by (status) ({sel('redisbus_agents')})", "{{status}}")],
            stack=True,
        ),
        timeseries(
            "Channels",
            "Channels on the bus, and how many of them the exporter left out (past "
            "REDISBUS_EXPORTER_MAX_CHANNELS, read first by name): every other fleet figure "
            "misses those, and RedisbusExporterChannelsSkipped fires while any is left out. "
            f"{fleet_note}",
            [
                target(f"max({sel('redisbus_channels')})", "channels"),
                target(
                    f"max({sel('redisbus_exporter_channels_skipped')})",
                    "left out by the exporter's cap",
                ),
            ],
        ),
        timeseries(
            "Scrape health",
            "1 when Prometheus could scrape a target (exporter or agent host), 0 when not; "
            "RedisbusExporterDown fires when the exporter is down for 2 minutes.",
            [target(f"max by (job, instance) ({sel('up')})", "{{job}} {{instance}}")],
        ),
        timeseries(
            "Exporter collect duration",
            "Time the exporter took to read Redis for its last collection (not Prometheus' own "
            "scrape_duration_seconds). Rising with the number of channels is expected; sudden "
            f"jumps point at a slow Redis. {fleet_note}",
            [
                target(
                    f"max by (instance) ({sel('redisbus_exporter_collect_duration_seconds')})",
                    "{{instance}}",
                )
            ],
            "s",
        ),
        row("Redis"),
        timeseries(
            "Redis reachable (exporter reads)",
            "1 when the exporter's last read of Redis succeeded, 0 when it failed (Redis down, "
            "unreachable, or refusing the exporter's user). The exporter itself stays up, so "
            "Prometheus' up stays 1: RedisbusRedisDown fires on this 0 after a minute.",
            [target(f"min by (instance) ({sel('redisbus_exporter_redis_up')})", "{{instance}}")],
        ),
        timeseries(
            "Redis memory used and maxmemory",
            "Memory Redis uses and its maxmemory (0: no limit), from INFO memory. With "
            "noeviction a full Redis refuses every send: RedisbusRedisMemoryNearLimit fires "
            f"above 90% for 5 minutes. {fleet_note}",
            [
                target(f"max({sel('redisbus_redis_memory_used_bytes')})", "used"),
                target(f"max({sel('redisbus_redis_memory_max_bytes')})", "maxmemory"),
            ],
            "bytes",
        ),
        timeseries(
            "Redis eviction policy",
            "The maxmemory-policy Redis runs with (INFO memory). redisbus needs noeviction: any "
            "other policy may silently delete streams under memory pressure, and "
            f"RedisbusEvictionPolicyUnsafe fires. {fleet_note}",
            [target(f"max by (policy) ({sel('redisbus_redis_maxmemory_policy')})", "{{policy}}")],
        ),
        timeseries(
            "Versions running",
            "Processes reporting each redisbus version (redisbus_build_info): agent hosts and "
            "exporters. Two versions at once is normal during a rollout only.",
            [target(f"count by (version) ({sel('redisbus_build_info')})", "{{version}}")],
            width=24,
        ),
    ]


def layout(items: list[Panel]) -> list[Panel]:
    """Give each panel an id and a gridPos, flowing left to right in rows of 24 units."""
    x = y = row_h = 0
    out = []
    for i, p in enumerate(items, start=1):
        w = p.pop("_width")
        h = p.pop("_height", 1)
        if x + w > 24 or p["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        out.append({"id": i, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **p})
        x += w
        row_h = max(row_h, h)
    return out


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": "StandardVariableQuery"},
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        # ".*" rather than Grafana's "a|b|c" list, so "All" also matches targets (e.g. the
        # exporter) that appeared after the variable was last refreshed.
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
        "hide": 0,
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "redisbus overview",
        "description": "Traffic, refusals, delivery latency per host, backlog and agents of a "
        "redisbus fleet. Client metrics come from the agent hosts, fleet gauges from "
        "`redisbus exporter`.",
        "tags": ["redisbus"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "regex": "",
                    "refresh": 1,
                    "hide": 0,
                    "includeAll": False,
                    "multi": False,
                    "current": {},
                },
                variable("job", "Job", 'label_values({__name__=~"redisbus_.+"}, job)'),
                variable(
                    "instance",
                    "Instance",
                    'label_values({__name__=~"redisbus_.+", job=~"$job"}, instance)',
                ),
            ]
        },
        "panels": layout(panels()),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.name} is stale: run python grafana/generate.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
