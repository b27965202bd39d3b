"""How the ``redisbus`` command shows messages, receipts and trees. Message text is data:
it is never parsed as markup, and control characters are shown, not obeyed."""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Protocol, TypeVar

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ._cli_base import err, out, write_json
from ._errors import RedisbusError
from ._model import Member, Message, Receipt
from .bus import Channel


def safe(text: str) -> str:
    """Message text is data: show control characters (e.g. ESC) instead of obeying them."""
    if text.isprintable():
        return text
    return "".join(
        c if c in "\n\t" or unicodedata.category(c) != "Cc" else f"\\x{ord(c):02x}" for c in text
    )


def clock(d: datetime | None) -> str:
    return "-" if d is None else d.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def message_text(m: Message, *, show_read: bool = False, body_chars: int | None = None) -> Text:
    """One message as rich text: header line, then the body indented. Never parses markup."""
    t = Text()
    t.append(clock(m.created_at), style="dim")
    t.append("  ")
    t.append(safe(m.sender), style="bold cyan")
    t.append(" → ")
    t.append(safe(", ".join(m.to)), style="bold magenta")
    if m.type != "message":
        t.append(f"  [{m.type}]", style="yellow")
    if m.priority:
        t.append(f"  priority {m.priority}", style="red")
    if m.subject:
        t.append("  ")
        t.append(safe(m.subject), style="bold")
    if show_read and not m.read:
        t.append("  (unread)", style="green")
    t.append(f"  {m.id}", style="dim")
    body = m.body if body_chars is None or len(m.body) <= body_chars else m.body[:body_chars] + "…"
    if m.truncated and not body.endswith("…"):
        body += "…"
    for line in safe(body).splitlines() or [""]:
        t.append("\n    " + line)
    return t


def receipt_table(receipts: Sequence[Receipt], title: str | None = None) -> Table:
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("to", "status", "queued", "delivered", "read", "done", "note"):
        table.add_column(col)
    for r in receipts:
        note = ""
        if r.error is not None:
            note = refusal_text(r.error)
        elif r.result and r.result != "ok":
            note = r.result
        style = "red" if r.status in ("rejected", "failed", "expired") else None
        table.add_row(
            safe(r.to),
            Text(r.status, style=style or ""),
            clock(r.queued_at),
            clock(r.delivered_at),
            clock(r.read_at),
            clock(r.done_at),
            safe(note),
        )
    return table


def refusal_text(e: RedisbusError) -> str:
    """``code: reason``; a limit's reason carries its numbers (see ``LimitExceeded.__str__``)."""
    return f"{e.code}: {e}"


class _Shown(Protocol):
    def as_dict(self) -> dict[str, object]: ...


T = TypeVar("T", bound=_Shown)


def print_items(
    items: Sequence[T], as_json: bool, empty: str, lines: Callable[[T], Iterable[RenderableType]]
) -> None:
    """A listing command's output: with --json the items' ``as_dict()``, else each item's
    lines, or ``empty`` on stderr when there is nothing."""
    if as_json:
        write_json([i.as_dict() for i in items])
        return
    if not items:
        err.print(empty)
    for item in items:
        for line in lines(item):
            out.print(line)


def print_messages(msgs: Sequence[Message], as_json: bool, *, show_read: bool) -> None:
    print_items(msgs, as_json, "no messages", lambda m: [message_text(m, show_read=show_read)])


STATUS_STYLE = {
    "running": "green",
    "waiting": "cyan",
    "idle": "blue",
    "completed": "dim",
    "failed": "red",
    "cancelled": "yellow",
    "lost": "red",
}


def member_tree(ch: Channel, members: Sequence[Member], counts: dict[str, int]) -> Tree:
    cfg = ch.config
    label = Text.assemble((safe(ch.name), "bold"), f"  routing={cfg.routing}")
    if cfg.routing == "family":
        label.append(f" siblings={'on' if cfg.siblings else 'off'}")
    if cfg.paused:
        label.append("  PAUSED", style="bold red")
    root = Tree(label)
    nodes: dict[str, Tree] = {}
    for m in members:  # parents come before their children
        line = Text.assemble(
            (safe(m.name), "bold"),
            "  ",
            (m.status, STATUS_STYLE.get(m.status, "")),
            f"  host={safe(m.host) or '-'}  undone={counts.get(m.name, 0)}",
            (f"  {m.id}", "dim"),
        )
        if m.description:
            line.append(f"  {safe(m.description[:60])}", style="italic")
        parent = nodes.get(m.parent) if m.parent else None
        nodes[m.name] = (parent or root).add(line)
    return root
