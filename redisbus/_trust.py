"""Per-host keys: this host's Ed25519 private key and the trust list every host reads.

The trust list is a file on each host (``BusSettings.trust_file``, JSON or TOML), kept by the
operator and distributed like any other configuration (a Kubernetes ConfigMap, a provisioning
tool)::

    {"keys": {"host-a": {"public": "<base64 of the 32-byte raw key>",
                         "channels": ["team-*"], "agents": ["writer", "sa-*"]}},
     "revoked": ["host-a-2025"]}

Each key id maps to a public key and the channels and agent names (``fnmatch`` patterns) it
may speak for. The file is re-read when its modification time changes (checked at most once a
second), so rotation (add the new key, switch the host, remove the old one) and revocation
(move the id to ``revoked``, or delete it) take effect without a restart — for this host's own
key too: its joins and signed sends are refused (``NotPermitted``) while the list revokes or
omits it, and work again once it lists it. Nothing here is in Redis: an attacker who can write
to Redis cannot add a key.
"""

from __future__ import annotations

import base64
import json
import os
import time
import tomllib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ._errors import InvalidInput


@dataclass(frozen=True)
class TrustEntry:
    public: Ed25519PublicKey
    raw: bytes
    channels: tuple[str, ...]
    agents: tuple[str, ...]


class TrustRing:
    """Signs with this host's key (when it has one) and verifies with the trust list."""

    def __init__(self, key_file: str | None, trust_file: str) -> None:
        self._private: Ed25519PrivateKey | None = None
        self._own = b""
        if key_file:
            self._private = load_private_key(key_file)
            self._own = raw_public(self._private.public_key())
        self._path = trust_file
        self._stamp: float | None = None
        self._checked = float("-inf")
        self.keys: dict[str, TrustEntry] = {}
        self.revoked: frozenset[str] = frozenset()
        self._kid: str | None = None
        self._refresh(force=True)

    verifies = True

    @property
    def kid(self) -> str | None:
        """This host's key id as the trust list says now: None while its key is absent from
        the list or revoked, back when the file changes again (each read may re-read it)."""
        self._refresh()
        return self._kid

    def cannot_sign(self) -> str:
        if self._private is None or self.kid is not None:
            return ""
        listed = [k for k, e in self.keys.items() if e.raw == self._own]
        if listed:
            return (
                f"this host's key {listed[0]!r} is revoked in the trust file {self._path!r}: "
                "receivers would reject what it signs"
            )
        return (
            f"this host's key is not in the trust file {self._path!r}: receivers would reject "
            "what it signs; add its public key there"
        )

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < 1.0:
            return
        self._checked = now
        try:
            stamp = os.stat(self._path).st_mtime_ns
        except OSError as e:
            raise InvalidInput(f"trust file {self._path!r}: {e.strerror}") from e
        if stamp == self._stamp:
            return
        self.keys, self.revoked = load_trust(self._path)
        self._stamp = stamp
        # the host's own key follows the file both ways: revoked or removed, then restored
        self._kid = next(
            (
                k
                for k, e in self.keys.items()
                if self._own and e.raw == self._own and k not in self.revoked
            ),
            None,
        )

    def sign_bytes(self, payload: bytes) -> str:
        assert self._private is not None
        return self._private.sign(payload).hex()

    def verify_bytes(self, kid: str, payload: bytes, sig: str) -> str:
        self._refresh()
        if kid in self.revoked:
            return "revoked"
        entry = self.keys.get(kid)
        if entry is None:
            return "untrusted_key"
        try:
            entry.public.verify(bytes.fromhex(sig), payload)
        except (InvalidSignature, ValueError):
            return "bad_signature"
        return ""

    def may_speak(self, kid: str, channel: str, agent: str | None) -> bool:
        self._refresh()
        entry = self.keys.get(kid)
        if entry is None or kid in self.revoked:
            return False
        if not any(fnmatchcase(channel, p) for p in entry.channels):
            return False
        return agent is None or any(fnmatchcase(agent, p) for p in entry.agents)


def load_trust(path: str) -> tuple[dict[str, TrustEntry], frozenset[str]]:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
        doc: Any = tomllib.loads(data.decode()) if path.endswith(".toml") else json.loads(data)
    except (OSError, ValueError) as err:
        raise InvalidInput(f"trust file {path!r} is not readable JSON/TOML: {err}") from err
    keys: dict[str, TrustEntry] = {}
    for kid, e in dict(doc.get("keys", {})).items():
        if not kid or ":" in kid:
            raise InvalidInput(f"trust file {path!r}: key id {kid!r} is empty or has ':'")
        try:
            raw = base64.b64decode(e["public"], validate=True)
            public = Ed25519PublicKey.from_public_bytes(raw)
        except (KeyError, ValueError, TypeError) as err:
            raise InvalidInput(f"trust file {path!r}: key {kid!r} has no valid public") from err
        keys[kid] = TrustEntry(
            public, raw, tuple(e.get("channels", ())), tuple(e.get("agents", ()))
        )
    return keys, frozenset(doc.get("revoked", ()))


def load_private_key(path: str) -> Ed25519PrivateKey:
    try:
        with open(path, "rb") as fh:
            key = serialization.load_pem_private_key(fh.read(), password=None)
    except (OSError, ValueError, TypeError) as e:
        raise InvalidInput(f"signing key file {path!r} is not a PEM private key") from e
    if not isinstance(key, Ed25519PrivateKey):
        raise InvalidInput(f"signing key file {path!r} is not an Ed25519 key")
    return key


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def generate_key(path: str) -> str:
    """Write a new Ed25519 private key to ``path`` (PEM, mode 0600); return its public key
    as the trust list spells it (base64 of the raw 32 bytes)."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return base64.b64encode(raw_public(key.public_key())).decode()
