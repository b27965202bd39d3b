"""How messages, receipts and member trees look in a terminal (rich text and tables), for the
``redisbus`` command and the demo. Message text is data: it is never parsed as markup, and
control characters are shown, not obeyed."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from ._commands import refusal_text
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
