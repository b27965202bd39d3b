"""BusSettings: every knob of redisbus, read from ``REDISBUS_*`` environment variables.

Units are in the field names (``_s`` seconds, ``_bytes``). Constructing settings does no I/O.
The CLI options, the exporter and the deployment manifests map onto these fields one to one.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_WAIT_S = 300.0
#: The longest duration any setting or channel limit may hold: ten years. Its milliseconds
#: (3.2e11) are exact in a double and fit every integer Redis and Python take, so no host
#: and no script overflows turning it into milliseconds.
MAX_DURATION_S = 10 * 365 * 24 * 3600.0
#: The largest rate (per second) or burst: far past anything a bucket meters, far from overflow.
MAX_RATE = 1e9
#: The largest count (caps, budgets, depths): what the scripts and a C int hold.
MAX_COUNT = 2**31
#: The longest name a channel may allow (its ``max_name_chars``).
MAX_NAME_CHARS = 1024


def _count(default: int, description: str, *, least: int = 0) -> Any:
    """A count, cap or budget: ``least`` to MAX_COUNT."""
    return Field(default=default, ge=least, le=MAX_COUNT, description=description)


def _rate(default: float, description: str) -> Any:
    """A token bucket's rate (per second) or burst: 0 to MAX_RATE."""
    return Field(default=default, ge=0, le=MAX_RATE, description=description)


def _seconds(
    default: float | None, description: str, *, zero: bool = False, most: float = MAX_DURATION_S
) -> Any:
    """A duration up to ``most``: above 0, or from 0 with ``zero``."""
    return Field(
        default=default,
        gt=None if zero else 0,
        ge=0 if zero else None,
        le=most,
        description=description,
    )


class BusSettings(BaseSettings):
    """Connection, identity and default channel limits. Env prefix: ``REDISBUS_``."""

    # NaN and infinity are refused everywhere: each field below that ends up in milliseconds
    # or in Redis also has an upper bound (MAX_DURATION_S, MAX_RATE, MAX_COUNT: _seconds, _rate
    # and _count set them)
    model_config = SettingsConfigDict(env_prefix="REDISBUS_", extra="ignore", allow_inf_nan=False)

    # -- connection ---------------------------------------------------------------------------
    url: str | None = Field(
        default=None,
        description="redis://, rediss://, redis+sentinel://h:p[,h:p]/SERVICE[/db]; "
        "unset = embedded",
    )
    data_dir: str | None = Field(
        default=None,
        description="with no url: the private Redis keeps its data here (AOF on), shared by "
        "every process that names the same directory; unset = temporary",
    )
    cluster: bool = Field(default=False, description="treat url as one node of a Redis Cluster")
    prefix: str = Field(default="rb", description="key prefix shared by every key of the bus")
    socket_timeout_s: float = Field(
        default=10.0, le=MAX_DURATION_S, description="a Redis reply slower than this fails"
    )
    connect_timeout_s: float = Field(
        default=5.0, le=MAX_DURATION_S, description="connecting to Redis"
    )
    retry_attempts: int = Field(default=5, ge=0, description="retries on connection errors")
    functions: bool = Field(
        default=True,
        description="run the scripts as a Redis Functions library (FUNCTION LOAD once, FCALL) "
        "where the server has Functions and the user may load them; False: EVALSHA only",
    )
    ssl_ca_certs: str | None = Field(default=None, description="CA bundle for rediss://")
    ssl_certfile: str | None = Field(default=None, description="client certificate (mutual TLS)")
    ssl_keyfile: str | None = Field(default=None, description="client certificate's key")
    max_connections: int = Field(
        default=2000,
        ge=2,
        description="connections per bus and server: each waiting async agent holds one while "
        "it blocks (a blocking XREADGROUP needs a connection of its own), so this bounds the "
        "async agents that wait at once in one process",
    )
    username: str | None = Field(default=None, description="Redis ACL user")
    password: SecretStr | None = Field(
        default=None, description="Redis password (never shown in a repr)"
    )

    # -- identity -----------------------------------------------------------------------------
    host: str = Field(default_factory=socket.gethostname, description="this host's name")
    replica: str | None = Field(
        default=None,
        description="consumer name of this process's replicas. Unset: HOST/PID, so two live "
        "processes never share one (sharing a name would hand both the same message). Set a "
        "name that stays the same across restarts (and is unique among live processes) for a "
        "restarted process to take back its own pending messages at once; with the per-process "
        "default another replica, or the restarted process itself, reclaims them after the "
        "lease (lease_s)",
    )

    # -- default channel limits (stored in Redis when a channel is created) --------------------
    inbox_cap: int = _count(128, "undone messages per recipient", least=1)
    max_body_bytes: int = _count(32 * 1024, "UTF-8 bytes of a body", least=1)
    max_name_chars: int = Field(
        default=128, ge=1, le=MAX_NAME_CHARS, description="characters of a name or subject"
    )
    pair_rate_burst: float = _rate(3, "0 disables the pair bucket")
    pair_rate_per_s: float = _rate(1.0, "pair bucket refill")
    sender_rate_burst: float = _rate(60, "0 disables it")
    sender_rate_per_s: float = _rate(20.0, "sender bucket refill")
    max_chain_depth: int = _count(10, "replies of replies, and messages sent while handling one")
    max_chain_messages: int = _count(
        100,
        "messages one chain may hold (a message and every message sent while "
        "handling one of them, replies included), 0 = none",
    )
    max_depth: int = _count(0, "team budget: tree depth, 0 = none")
    max_members: int = _count(0, "team budget: members, 0 = none")
    max_messages: int = _count(0, "team budget: messages, 0 = none")
    retention_s: float = _seconds(7 * 24 * 3600, "the janitor trims entries older than this")

    # -- loop and runaway protection (docs/concepts.md#limits-and-loop-protection) -------------
    dampen_turns: int = _count(10, "back-and-forth turns between two agents, 0 = off")
    dampen_window_s: float = _seconds(
        10.0, "turns closer than this count as a ping-pong", zero=True
    )
    breaker_failures: int = _count(3, "dead letters of one agent that open its breaker, 0 = off")
    breaker_window_s: float = _seconds(300.0, "dead letters counted within this window", zero=True)
    breaker_cooldown_s: float = _seconds(
        60.0, "an open breaker refuses sends for this long", zero=True
    )
    auto_reply_deny: list[str] = Field(
        default_factory=lambda: ["auto_responder", "message-router"],
        description="senders whose messages never get an automatic answer",
    )

    # -- delivery -----------------------------------------------------------------------------
    wait_timeout_s: float = _seconds(30.0, "wait() without a timeout", most=MAX_WAIT_S)
    lease_s: float = _seconds(60.0, "redelivery lease of a fetched message")
    heartbeat_s: float = _seconds(5.0, "replica heartbeat period")
    agent_lease_s: float = _seconds(
        15.0, "an agent none of whose replicas beat for this long is lost"
    )
    max_deliveries: int = _count(5, "then the message is dead-lettered", least=1)
    durable: bool = Field(default=False, description="send() waits for a replica (WAIT)")
    durable_replicas: int = _count(1, "replicas WAIT asks for", least=1)
    durable_timeout_s: float = _seconds(1.0, "how long WAIT waits")

    # -- security -----------------------------------------------------------------------------
    signing_keys: dict[str, SecretStr] = Field(
        default_factory=dict,
        description='shared HMAC mode: JSON {"key id": "secret"}; the first signs, all verify',
    )
    signing_key_file: str | None = Field(
        default=None,
        description="per-host mode: this host's Ed25519 private key (PEM, PKCS#8)",
    )
    trust_file: str | None = Field(
        default=None,
        description="per-host mode: the trust list (JSON or TOML): each public key, the "
        "channels and agent names it may speak for; revoked keys. Re-read when it changes",
    )
    signing_window_s: float = _seconds(60.0, "largest gap between signing time and entry time")
    clock_skew_max_s: float | None = _seconds(
        None,
        "signed sends are refused (ClockSkew) while this host's clock is further "
        "than this from the Redis clock; default half of signing_window_s",
    )
    replay_keep_s: float = _seconds(3600.0, "how long a signature's nonce is remembered")
    unsigned: Literal["reject", "flag"] = Field(
        default="reject",
        description="with signing on, a bad or missing signature: drop it, or deliver it "
        "with verified=False",
    )

    # -- metrics ------------------------------------------------------------------------------
    metrics: bool = Field(default=True, description="record client metrics (prometheus-client)")
    metrics_host: str | None = Field(
        default=None,
        description="the host label of client metrics (default: host); keep it to few values "
        "(a node or pool name, not a pod's); empty drops the label",
    )

    @field_validator("signing_keys")
    @classmethod
    def _key_ids_are_plain(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for kid in v:
            if not kid or ":" in kid or not kid.isprintable():
                raise ValueError(f"signing key id {kid!r}: printable, non-empty, no ':'")
        return v

    @model_validator(mode="after")
    def _skew_within_window(self) -> BusSettings:
        # a skew the window cannot hold would have receivers drop what the sender let through
        if self.clock_skew_max_s is not None and self.clock_skew_max_s >= self.signing_window_s:
            raise ValueError("clock_skew_max_s must be below signing_window_s")
        return self

    @field_validator("prefix")
    @classmethod
    def _prefix_has_no_tag(cls, v: str) -> str:
        if not v or any(c in v for c in "{}") or not v.isprintable():
            raise ValueError("prefix must be printable, non-empty, without braces")
        return v

    @property
    def consumer(self) -> str:
        """The consumer name joins use by default: ``replica``, else ``HOST/PID`` (read at each
        call, so a forked child gets a name of its own)."""
        return self.replica or f"{self.host}/{os.getpid()}"
