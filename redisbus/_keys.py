"""The one place that spells Redis keys. Every key of a channel carries the channel's hash tag.

{prefix}:{<channel>}:s       the channel stream; one consumer group per agent
{prefix}:{<channel>}:meta    hash: routing, limits, pause switch, message count
{prefix}:{<channel>}:m       hash: agent name -> JSON member record
{prefix}:{<channel>}:par     hash: agent name -> parent name ("" for roots)
{prefix}:{<channel>}:st      hash: agent name -> status
{prefix}:{<channel>}:ids     hash: agent id -> agent name
{prefix}:{<channel>}:inbox   hash: agent name -> undone messages addressed to it
{prefix}:{<channel>}:rate    hash: token buckets ("s\\nSENDER", "p\\nSENDER\\nRECIPIENT"),
                             breakers, dampeners, "#sent"; "#lim", the limits and pause switch
                             of meta packed for send.lua (a cache it fills, read with the
                             buckets; changing meta's limits or pause deletes it); "#table", a
                             long value that keeps Redis from storing the hash as a list (a
                             scan per field)
{prefix}:{<channel>}:idem    hash: "SENDER\\nKEY" -> "id\\trecipients"
{prefix}:{<channel>}:marks   hash: "ID\\nAGENT" -> read/done/failed/expired marks
                             (both with "\\n#table", a long value written at join that keeps
                             them hash tables: one lookup per field, also after a restart)
{prefix}:{<channel>}:dlq     stream of dead letters
{prefix}:{<channel>}:beat    hash: "AGENT\\nREPLICA" -> lease deadline (ms, Redis clock)
{prefix}:{<channel>}:lim     string: where 0.1.0 cached what "#lim" holds; never
                             written now, deleted by configure and when send.lua refills "#lim"
{prefix}:{<channel>}:nonce   hash: "KID:NONCE" of a signed entry -> the first entry id carrying it
                             (with "\\n#table" while it holds pairs, as marks)
{prefix}:{<channel>}:b:<agent>  list: the agent's doorbell, the ids of the entries addressed to
                             it that its waits have not taken yet (wake.lua), in stream order
{prefix}:{<channel>}:w:<agent>  list: the agent's wakeup, one item ('') while its bell holds ids
                             no wait was woken for; its waits block on it (BLPOP)
{prefix}:{<channel>}:nonce:at  sorted set: the same pairs by when they were recorded (ms), so
                             settle.lua forgets them after the replay horizon
{prefix}:channels            set of channel names (outside any channel's slot; never in Lua)
{prefix}:stats               hash: fleet counters kept in Redis, e.g. "janitor_dead_lettered"
                             (outside any channel's slot; never in Lua)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

#: What follows a channel's keys' common start in an agent's doorbell and wakeup list.
BELL, WAKEUP = "b:", "w:"


@dataclass(frozen=True, slots=True)
class ChannelKeys:
    channel: str
    stream: str
    meta: str
    members: str
    parents: str
    status: str
    ids: str
    inbox: str
    rate: str
    idem: str
    marks: str
    dlq: str
    beat: str
    limits: str
    nonces: str
    nonce_at: str
    bells: str  # the doorbells' prefix: an agent's bell is this and its name
    wakeups: str  # the wakeup lists' prefix, the same way

    @classmethod
    def build(cls, prefix: str, channel: str) -> ChannelKeys:
        base = f"{prefix}:{{{channel}}}:"
        return cls(
            channel=channel,
            stream=base + "s",
            meta=base + "meta",
            members=base + "m",
            parents=base + "par",
            status=base + "st",
            ids=base + "ids",
            inbox=base + "inbox",
            rate=base + "rate",
            idem=base + "idem",
            marks=base + "marks",
            dlq=base + "dlq",
            beat=base + "beat",
            limits=base + "lim",
            nonces=base + "nonce",
            nonce_at=base + "nonce:at",
            bells=base + BELL,
            wakeups=base + WAKEUP,
        )

    def bell(self, agent: str) -> str:
        """The doorbell of ``agent``: the ids rung for it that wake.lua takes."""
        return self.bells + agent

    def wakeup(self, agent: str) -> str:
        """The wakeup list of ``agent``: what its waits block on."""
        return self.wakeups + agent


def doorbells(stream: str, agents: Iterable[str]) -> list[str]:
    """The doorbell and the wakeup list of each of ``agents`` (once each), in pairs, in the
    channel whose stream is ``stream``: what a script that rings them is given in KEYS.
    (Every key of a channel starts as its stream's does, the stream's last letter aside.)"""
    base = stream[:-1]
    seen: set[str] = set()
    out: list[str] = []
    for a in agents:
        if a not in seen:
            seen.add(a)
            out += (base + BELL + a, base + WAKEUP + a)
    return out


def registry_key(prefix: str) -> str:
    return f"{prefix}:channels"


def stats_key(prefix: str) -> str:
    return f"{prefix}:stats"
