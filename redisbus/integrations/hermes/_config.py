"""When the plugin is on, and with which settings.

Hermes loads the plugin only when ``redisbus`` is listed in ``plugins.enabled`` of
``$HERMES_HOME/config.yaml``. Loaded, it still registers nothing unless the agent channel is
switched on, by either

- an ``agent_channel:`` block in the same ``config.yaml`` (``enabled: false`` turns it off), or
- ``REDISBUS_ENABLED=1``, or ``REDISBUS_URL`` set (``REDISBUS_ENABLED=0`` turns it off).

An explicit off always wins. Settings (all optional)::

    agent_channel:
      url: redis://localhost:6379/0   # else REDISBUS_URL, else a private embedded Redis
      channel: null                   # fixed channel name; default: one per root session
      channel_prefix: hermes          # default channel = "<prefix>-<root session id>"
      root_name: root                 # the top-level agent's name on its channel
      routing: open                   # open (one board) or family
      siblings: true
      deliver_unread: true            # pre_llm_call hands unread messages to each turn
      max_wait_s: 30                  # cap of the tool's wait_seconds
      limits: {}                      # bus.channel(...) limits, e.g. pair_rate_burst: 10
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if value is None:
        return None
    s = str(value).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    return None


@dataclass(frozen=True)
class ChannelConfig:
    enabled: bool = False
    url: str | None = None
    channel: str | None = None
    channel_prefix: str = "hermes"
    root_name: str = "root"
    routing: str = "open"
    siblings: bool = True
    deliver_unread: bool = True
    max_wait_s: float = 30.0
    limits: dict[str, Any] = field(default_factory=dict)
    source: str = "off"

    @classmethod
    def resolve(
        cls, hermes_config: Mapping[str, Any] | None, env: Mapping[str, str] | None = None
    ) -> ChannelConfig:
        """The effective settings from Hermes's config dict and the environment."""
        env = os.environ if env is None else env
        block = (hermes_config or {}).get("agent_channel")
        has_block = isinstance(block, Mapping)
        block = dict(block) if isinstance(block, Mapping) else {}
        if (hermes_config or {}).get("agent_channel") not in (None, {}) and not has_block:
            # ``agent_channel: true`` / ``false`` as a shorthand
            flag = _flag((hermes_config or {}).get("agent_channel"))
            if flag is not None:
                block = {"enabled": flag}
                has_block = True

        env_flag = _flag(env.get("REDISBUS_ENABLED"))
        env_url = env.get("REDISBUS_URL") or None
        cfg_flag = _flag(block.get("enabled")) if "enabled" in block else None

        if cfg_flag is False or env_flag is False:
            enabled, source = False, "disabled explicitly"
        elif has_block:
            enabled, source = True, "config.yaml agent_channel"
        elif env_flag:
            enabled, source = True, "REDISBUS_ENABLED"
        elif env_url:
            enabled, source = True, "REDISBUS_URL"
        else:
            enabled, source = False, "off"

        limits = block.get("limits") or {}
        if not isinstance(limits, Mapping):
            raise ValueError("agent_channel.limits must be a mapping")
        routing = str(block.get("routing", "open"))
        if routing not in ("open", "family"):
            raise ValueError("agent_channel.routing must be 'open' or 'family'")
        root_name = str(block.get("root_name", "root"))
        if not _NAME_RE.match(root_name):
            raise ValueError(f"agent_channel.root_name {root_name!r} is not a valid agent name")
        channel = block.get("channel")
        return cls(
            enabled=enabled,
            url=block.get("url") or env_url,
            channel=str(channel) if channel else None,
            channel_prefix=str(block.get("channel_prefix", "hermes")),
            root_name=root_name,
            routing=routing,
            siblings=bool(_flag(block.get("siblings", True))),
            deliver_unread=bool(_flag(block.get("deliver_unread", True))),
            max_wait_s=max(0.0, min(300.0, float(block.get("max_wait_s", 30.0)))),
            limits=dict(limits),
            source=source,
        )
