"""Signed envelopes: an HMAC over a message's attributed fields, so that a client without the
fleet key cannot forge a sender, even with direct write access to Redis.

``BusSettings.signing_keys`` maps key ids to secrets; the first key signs, every key verifies,
so keys rotate by adding the new one first and dropping the old one after the overlap. The
signature covers the channel, sender, subject, body, type, priority, reply_to, ttl,
idempotency key and the signing time; it is stored in the entry as ``g`` ("kid:hex") and the
time as ``n``. It does not cover the recipient list, which the send script resolves.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

_VERSION = "rb1"


class Signer:
    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys = {k: v.encode() for k, v in keys.items()}
        self.kid = next(iter(keys), None)

    @property
    def enabled(self) -> bool:
        return self.kid is not None

    def sign(
        self, channel: str, fields: Mapping[str, str], ts: str | None = None
    ) -> tuple[str, str]:
        """Return ("kid:hex", ts) for entry fields (f s b k p r x i) about to be written."""
        if self.kid is None:
            return "", ""
        ts = ts or str(int(time.time() * 1000))
        digest = _mac(self.keys[self.kid], channel, fields, ts)
        return f"{self.kid}:{digest}", ts

    def verify(self, channel: str, fields: Mapping[str, str]) -> bool:
        sig, ts = fields.get("g", ""), fields.get("n", "")
        kid, _, given = sig.partition(":")
        key = self.keys.get(kid)
        if key is None or not given or not ts:
            return False
        return hmac.compare_digest(_mac(key, channel, fields, ts), given)


def _mac(key: bytes, channel: str, f: Mapping[str, str], ts: str) -> str:
    parts = [
        _VERSION,
        channel,
        f.get("f", ""),
        f.get("s", ""),
        f.get("b", ""),
        f.get("k", "message") or "message",
        f.get("p", "0") or "0",
        f.get("r", ""),
        f.get("x", ""),
        f.get("i", ""),
        ts,
    ]
    payload = "\x1f".join(parts).encode("utf-8", "surrogatepass")
    return hmac.new(key, payload, hashlib.sha256).hexdigest()
