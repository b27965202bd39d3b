"""Signed envelopes: a signature over everything a receiver acts on, with a nonce and a signing
time, so that an entry can be neither forged, nor pointed at someone else, nor played again.

Two modes share one payload and one set of receiver rules:

- **HMAC** (``BusSettings.signing_keys``, ``{"key id": "secret"}``): a fleet secret; the first
  key signs, every key verifies. Whoever holds it speaks for every agent of every channel.
- **Ed25519** (``signing_key_file`` + ``trust_file``): each host signs with its own private key;
  the trust list (``_trust.py``) says which channels and agent names each public key may speak
  for. A key speaks only for what its trust entry allows.

The signature covers: the channel, the sender, the send mode and the requested recipients
(names as given, "parent" resolved; for a control message its target; "all" for a broadcast),
subject, body, type, priority, reply_to, ttl, idempotency key, trace context (the chain), the
signing time and a nonce. The chain depth ``d`` is written by the send script from reply_to,
which is covered. The entry keeps it all in two fields written by the send scripts: ``g``
("kid:nonce:signature:mode:recipients") and ``n`` (signing time, ms).

Receivers refuse (reason in brackets, the bounded label of
``redisbus_messages_rejected_total``): no signature [unsigned]; an unknown key [untrusted_key];
a revoked key [revoked]; a key not allowed for the sender or the channel [not_allowed]; a
signature that does not match [bad_signature]; recipients not among the requested ones
[misaddressed]; a signing time more than ``signing_window_s`` from the entry id's time
[stale]; a (key, nonce) pair already seen on an earlier entry [replay] — that last one is
checked on the server, in the settle script that marks the fetch read (settle.lua, op "n").

A sender refuses to make a signature receivers would reject, before anything is written:
``ClockSkew`` while its clock was last measured too far from the Redis clock (``_clock``),
``NotPermitted`` while the trust list revokes or omits the key it holds (re-read on change).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ._clock import measure_skew, skew_error, skew_limit_s, too_skewed, wall_ms
from ._entries import malformed
from ._errors import NotPermitted

_VERSION = "rb2"

#: Every reason a receiver rejects an entry for: the bounded label set of the metric.
REASONS = (
    "unsigned",
    "bad_signature",
    "untrusted_key",
    "revoked",
    "not_allowed",
    "misaddressed",
    "stale",
    "replay",
    "malformed",  # not the fields of a message at all (_entries.malformed): a raw write
)

#: The fields of an entry the signature covers, besides the channel and the addressing.
# the entry fields a signature covers; "d" and "h" (chain depth and id) are derived by send.lua
# from "r" (reply_to) and "u" (the message being handled), both covered
_COVERED = ("f", "s", "b", "k", "p", "r", "x", "i", "c", "u")
_DEFAULTS = {"k": "message", "p": "0"}


class KeyRing(Protocol):
    """What a signing mode provides: the key that signs, and the verification of a key id."""

    verifies: bool

    @property
    def kid(self) -> str | None:
        """The id this host signs with, as of now (None: it cannot sign)."""
        ...

    def cannot_sign(self) -> str:
        """ "" when this host signs, or has no key of its own to sign with (it sends
        unsigned); else why the key it holds cannot sign (revoked, not trusted)."""
        ...

    def sign_bytes(self, payload: bytes) -> str: ...

    def verify_bytes(self, kid: str, payload: bytes, sig: str) -> str:
        """ "" when valid, else a reason."""
        ...

    def may_speak(self, kid: str, channel: str, agent: str | None) -> bool:
        """Whether key ``kid`` may speak on ``channel`` for ``agent`` (None: for the channel)."""
        ...


class HmacRing:
    """Shared secrets: any key id of ``keys`` verifies and may speak for anyone."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        self.keys = {k: v.encode() for k, v in keys.items()}
        self.kid = next(iter(keys), None)
        self.verifies = bool(keys)

    def sign_bytes(self, payload: bytes) -> str:
        assert self.kid is not None
        return hmac.new(self.keys[self.kid], payload, hashlib.sha256).hexdigest()

    def verify_bytes(self, kid: str, payload: bytes, sig: str) -> str:
        key = self.keys.get(kid)
        if key is None:
            return "untrusted_key"
        good = hmac.new(key, payload, hashlib.sha256).hexdigest()
        return "" if hmac.compare_digest(good, sig) else "bad_signature"

    def may_speak(self, kid: str, channel: str, agent: str | None) -> bool:
        return True

    def cannot_sign(self) -> str:
        return ""


class Signer:
    """Signs outgoing entries and checks incoming ones with a key ring (or none: signing off).

    ``window_s``: how far a signing time may be from the entry id's time.
    ``replay_keep_s``: how long the server remembers a (key, nonce) pair it has seen.
    ``skew_limit_s``: signing is refused while the last measured skew of this host's clock
    (``observe_time``) is past it; half the window by default (``_clock`` says why).
    ``clock_ms``: the host clock signing times are read on (ms since the epoch).
    """

    def __init__(
        self,
        keys: Mapping[str, str] | KeyRing | None = None,
        *,
        window_s: float = 60.0,
        replay_keep_s: float = 3600.0,
        skew_limit_s: float | None = None,
        clock_ms: Callable[[], int] = wall_ms,
    ) -> None:
        if keys is None or isinstance(keys, Mapping):
            ring: KeyRing | None = HmacRing(keys or {})
        else:
            ring = keys
        self.ring = ring
        self.window_ms = int(window_s * 1000)
        self.replay_keep_ms = int(max(replay_keep_s, 2 * window_s) * 1000)
        self.skew_limit_s = window_s / 2 if skew_limit_s is None else skew_limit_s
        self.clock_ms = clock_ms
        #: this host's clock minus the Redis clock (s) at the last measurement; None: never
        self.skew_s: float | None = None

    def observe_time(
        self, redis_time_reply: Sequence[Any], sent_at: float, received_at: float
    ) -> float:
        """Record the skew one Redis ``TIME`` call shows (``sent_at``/``received_at``: this
        signer's ``clock_ms()`` just before the call and just after its reply); return it in
        seconds (for the ``redisbus_clock_skew_seconds`` gauge). Refusals follow the latest."""
        self.skew_s = measure_skew(redis_time_reply, sent_at, received_at)
        return self.skew_s

    @property
    def enabled(self) -> bool:
        """Signatures are checked (and made, when this host has a key that may sign)."""
        return self.ring is not None and self.ring.verifies

    @property
    def kid(self) -> str | None:
        return self.ring.kid if self.ring is not None else None

    def may_speak(self, channel: str, agent: str) -> bool:
        """Whether this host's key may speak for ``agent`` on ``channel`` (names are owned)."""
        if not self.enabled or self.ring is None:
            return True
        kid = self.ring.kid
        return kid is not None and self.ring.may_speak(kid, channel, agent)

    def sign(
        self,
        channel: str,
        fields: Mapping[str, str],
        *,
        mode: str,
        recipients: Sequence[str] = (),
        ts: str | None = None,
    ) -> tuple[str, str]:
        """Return (``g``, ``n``): the signature field and the signing time (ms) for entry
        ``fields`` about to be written with the given send ``mode`` and requested
        ``recipients``; ("", "") when signing is off or this host has no key.

        Raises ``ClockSkew`` when this host's clock was last measured too far from the Redis
        clock, and ``NotPermitted`` when the trust list revoked or does not list the key this
        host holds: receivers would reject either signature, and nothing is written."""
        if self.ring is None:
            return "", ""
        kid = self.ring.kid
        if kid is None:
            # a host holding a key the trust list revoked or dropped would send what every
            # receiver rejects: say so here, not on a receipt later
            why = self.ring.cannot_sign()
            if why:
                raise NotPermitted(why)
            return "", ""
        if too_skewed(self.skew_s, self.skew_limit_s):
            assert self.skew_s is not None
            raise skew_error(self.skew_s, self.skew_limit_s)
        ts = ts or str(int(self.clock_ms()))
        nonce = secrets.token_hex(12)
        req = "\n".join(recipients)
        sig = self.ring.sign_bytes(_payload(channel, kid, nonce, ts, mode, req, fields))
        return f"{kid}:{nonce}:{sig}:{mode}:{req}", ts

    def verdict(
        self,
        channel: str,
        entry_id: str,
        f: Mapping[str, str],
        me: str,
        my_id: str = "",
        *,
        cascade: bool = False,
        unsigned: str = "reject",
    ) -> tuple[bool | None, str]:
        """(verified, reason) of an entry fetched by ``me``: (None, "") signing off; (True, "")
        verified; (False, "") unsigned and delivered flagged (``unsigned="flag"``); (False,
        reason) rejected: the caller never hands it over and records the reason. An entry that
        is no message at all (``malformed``) is rejected whether signing is on or off.

        The checks are those a receiver makes without the server (the replay check is
        settle.lua's). ``cascade``: the server says ``me`` has ended (a cancel of an ancestor
        reached it), so a signed cancel addressed to an ancestor may wake it."""
        if malformed(f):
            return (False if self.enabled else None), "malformed"
        if not self.enabled:
            return None, ""
        reason = self._reason(channel, entry_id, f, me, my_id, cascade)
        if not reason:
            return True, ""
        if reason == "unsigned" and unsigned == "flag":
            return False, ""
        return False, reason

    def _reason(
        self, channel: str, entry_id: str, f: Mapping[str, str], me: str, my_id: str, cascade: bool
    ) -> str:
        """ "" when the entry passes the signature checks, else the reason it is rejected."""
        g = f.get("g")
        if not g:
            return "unsigned"
        parts = g.split(":", 4)
        if len(parts) != 5 or self.ring is None:
            return "bad_signature"
        kid, nonce, sig, mode, req = parts
        ts = f.get("n", "")
        if not ts.isdigit() or not nonce:
            return "bad_signature"
        payload = _payload(channel, kid, nonce, ts, mode, req, f)
        reason = self.ring.verify_bytes(kid, payload, sig)
        if reason:
            return reason
        # a loss is declared, and a dead letter replayed, by whichever host saw or chose it:
        # its key needs the channel only (a replay's content is the original sender's, below)
        speaker = None if mode in ("lost", "replay") else f.get("f", "")
        if not self.ring.may_speak(kid, channel, speaker):
            return "not_allowed"
        if abs(int(ts) - int(entry_id.partition("-")[0])) > self.window_ms:
            return "stale"
        if mode == "replay":
            if me not in req.split("\n") and (not my_id or my_id not in req.split("\n")):
                return "misaddressed"
            return self._original(channel, f, me, my_id)
        if not _addressing_holds(mode, req, f, me, my_id, cascade):
            return "misaddressed"
        return ""

    def _original(self, channel: str, f: Mapping[str, str], me: str, my_id: str) -> str:
        """The check of a replayed dead letter's original signature (fields ``og`` and
        ``on``, kept by the dead-letter stream): the content is the original sender's, spoken
        by a key that may speak for it, and was addressed to ``me``. Its signing time is old
        by nature: the replay's own signature (checked by the caller) is the fresh one."""
        assert self.ring is not None
        parts = f.get("og", "").split(":", 4)
        ts = f.get("on", "")
        if len(parts) != 5 or not ts.isdigit() or not parts[1]:
            return "bad_signature"
        kid, nonce, sig, mode, req = parts
        reason = self.ring.verify_bytes(kid, _payload(channel, kid, nonce, ts, mode, req, f), sig)
        if reason:
            return reason
        if not self.ring.may_speak(kid, channel, None if mode == "lost" else f.get("f", "")):
            return "not_allowed"
        names = req.split("\n")
        if mode not in ("all", "ctl", "out", "lost") and me not in names and my_id not in names:
            return "misaddressed"
        return ""


def signer_for(settings: Any) -> Signer:
    """The signer ``BusSettings`` describe: per-host keys when a trust file is set, else the
    shared HMAC keys (none: signing off)."""
    ring: KeyRing
    if settings.trust_file:
        from ._trust import TrustRing  # cryptography is only needed in this mode

        ring = TrustRing(settings.signing_key_file, settings.trust_file)
    else:
        ring = HmacRing({k: v.get_secret_value() for k, v in settings.signing_keys.items()})
    return Signer(
        ring,
        window_s=settings.signing_window_s,
        replay_keep_s=settings.replay_keep_s,
        skew_limit_s=skew_limit_s(settings),
    )


def _addressing_holds(
    mode: str, req: str, f: Mapping[str, str], me: str, my_id: str, cascade: bool = False
) -> bool:
    """The entry's broadcast flag matches the signed mode, and a receiver the entry is
    addressed to is one of the signed recipients (by name or id). An outcome is signed for
    the target's parent; a control message for its target, and the server adds the target's
    cancelled descendants to its recipients: one of them acts on it only when the server
    says it ended (``cascade``). So a copy pointed at anyone else is refused, whatever its
    own recipients say (an outcome signed before parents were signed in stays addressable
    as written: its recipients are empty)."""
    broadcast = f.get("a") == "1"
    if mode == "all":
        return broadcast
    if broadcast:
        return False
    to = f.get("t", "")
    if to != me and me not in to.split("\n"):
        return True  # another agent's message, seen on the board: not ours to act on
    names = req.split("\n")
    if me in names or (bool(my_id) and my_id in names):
        return True
    if mode in ("ctl", "out", "lost"):
        if f.get("k") == "control":
            return cascade
        return req == ""
    return False


def _payload(
    channel: str, kid: str, nonce: str, ts: str, mode: str, req: str, f: Mapping[Any, Any]
) -> bytes:
    parts = [_VERSION, channel, kid, nonce, ts, mode, req]
    parts += [f.get(k) or _DEFAULTS.get(k, "") for k in _COVERED]
    return "\x1f".join(parts).encode("utf-8", "surrogatepass")
