"""The ``filter_by`` grammar and ``since`` parsing, shared by every face and integration.

filter_by := term (" " term)*           terms are ANDed
term      := "unread" | "all" | "to:me" | "to:NAME" | "from:NAME"
           | "subject:TEXT" | "after:MESSAGE_ID"     (TEXT may be "quoted with spaces")
since     := ISO-8601 time (naive = UTC) | MESSAGE_ID  (time inclusive, id exclusive)
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime

from ._errors import InvalidInput

ENTRY_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")  # ASCII digits: \d takes any script's
_TERMS = "unread, all, to:me, to:NAME, from:NAME, subject:TEXT, after:MESSAGE_ID"
MAX_FILTER_CHARS = 1024


@dataclass(frozen=True, slots=True)
class Filter:
    unread: bool = False
    to: str | None = None  # "me" is resolved by the caller
    sender: str | None = None
    subject: str | None = None
    after: str | None = None  # exclusive lower bound (entry id)


def check_entry_id(value: object, what: str = "message id") -> str:
    if not isinstance(value, str) or not ENTRY_ID.match(value):
        raise InvalidInput(f"{what} must look like '1700000000000-0', got {value!r}")
    ms, _, seq = value.partition("-")
    if int(ms) >= 2**64 or int(seq) >= 2**64:
        raise InvalidInput(f"{what} out of range: {value!r}")
    return value


def parse_filter(filter_by: object) -> Filter:
    if filter_by is None:
        return Filter()
    if not isinstance(filter_by, str):
        raise InvalidInput(f"filter_by must be a string, got {type(filter_by).__name__}")
    if len(filter_by) > MAX_FILTER_CHARS or not filter_by.isprintable():
        raise InvalidInput("filter_by must be printable and at most 1024 characters")
    try:
        terms = shlex.split(filter_by)
    except ValueError as e:
        raise InvalidInput(f"malformed filter_by {filter_by!r}: {e}") from None
    fields: dict[str, str | bool] = {}

    def put(key: str, value: str | bool, term: str) -> None:
        if key in fields and fields[key] != value:
            raise InvalidInput(f"filter_by has conflicting terms for {key!r}: {term!r}")
        fields[key] = value

    for term in terms:
        if term == "unread":
            put("unread", True, term)
        elif term == "all":
            continue
        else:
            key, sep, value = term.partition(":")
            if not sep or not value or key not in ("to", "from", "subject", "after"):
                raise InvalidInput(f"unknown filter term {term!r}; expected one of: {_TERMS}")
            if key == "after":
                check_entry_id(value, "after:")
            put({"from": "sender"}.get(key, key), value, term)
    return Filter(
        unread=bool(fields.get("unread", False)),
        to=_str(fields.get("to")),
        sender=_str(fields.get("sender")),
        subject=_str(fields.get("subject")),
        after=_str(fields.get("after")),
    )


def _str(v: str | bool | None) -> str | None:
    return v if isinstance(v, str) else None


def parse_since(since: object) -> str | None:
    """Return an exclusive lower-bound entry id for ``since``, or None."""
    if since is None or since == "":
        return None
    if isinstance(since, datetime):
        dt = since
    elif isinstance(since, str):
        if ENTRY_ID.match(since):
            return check_entry_id(since, "since")
        text = since.strip()
        try:
            dt = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
        except ValueError:
            raise InvalidInput(
                f"since must be an ISO-8601 time or a message id, got {since!r}"
            ) from None
    else:
        raise InvalidInput(f"since must be a string or datetime, got {type(since).__name__}")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    ms = int(dt.timestamp() * 1000)
    if ms <= 0:
        return None
    # Messages created at or after `ms`: exclusive bound just below the first id of that ms.
    return f"{ms - 1}-18446744073709551615"


def later_id(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if _key(a) >= _key(b) else b


def id_before(entry_id: str) -> str:
    """The greatest entry id below ``entry_id``: an exclusive bound that starts at it."""
    ms, _, seq = entry_id.partition("-")
    if int(seq or 0) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-18446744073709551615"


def _key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)
