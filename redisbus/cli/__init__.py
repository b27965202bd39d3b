"""The ``redisbus`` command: talk on the bus, watch it, and run it, from a shell.

Not a Python API: the command line is the interface (docs/reference/cli.md); the Python
names of this package and its modules may change in any release.

Every option can also be set by a ``REDISBUS_*`` environment variable (shown in ``--help``).
Every failure is one line on stderr and a non-zero exit status, never a traceback:

    0  success
    1  refused or failed (a limit, routing, an unknown agent, a paused channel, a timeout)
    2  bad input (usage, a malformed filter or time, an out-of-range value)
    3  no Redis (REDISBUS_URL unset or unreachable)

What creates what: only ``join`` creates a channel; ``join`` and ``send`` make ``--as NAME`` a
member (a send refused for every recipient removes a member it made, ``Channel.leave``). Every
other command needs an existing channel (else ``unknown_channel``, exit 1) and, with ``--as``,
an existing member (else ``unknown_agent: no such member``, exit 1), and changes no roster.
Recipients: a name, ``parent``, ``all`` or ``a,b,c``; names cannot contain a comma. ``wait``
returns messages the agent has not read yet and marks them read (``--done``: done), so the next
``wait`` moves on.

The app is built here, and only here: each command is attached below, in the order ``--help``
lists them, from the module of its group: ``talk`` (join, send, read, list, wait, done,
receipt, discover), ``life`` (complete, fail, cancel, remove, delete), ``ops`` (tail, agents,
stats, pause, resume, dlq, redis, demo), ``doctor``, ``repair`` (repair, acl, keygen) and
``a2a``; ``_shared`` holds what they share (``redisbus._show``: how messages, receipts and
trees look). The programs that carry a command of their own bring it: ``redisbus.exporter``,
``redisbus.janitor``, ``redisbus.console`` and ``redisbus.integrations.mcp`` (so ``python -m``
runs each without this package). What every command is made of (the app class, the options
they share, ``Exit``, the one error classification) is ``redisbus._commands``. The commands
of optional extras import them only when they run (``console`` its web app, ``mcp`` the MCP
SDK, ``a2a`` the A2A SDK), so ``redisbus --help`` and the other commands work without them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Annotated

import typer

from .. import __version__, janitor
from .. import exporter as exporter_program
from .._commands import Typer, run
from .._show import message_text, receipt_table
from ..console._command import console
from ..integrations.mcp._command import mcp
from . import a2a, doctor, life, ops, repair, talk

__all__ = ["app", "main", "message_text", "receipt_table"]

app = Typer(
    name="redisbus",
    help=(
        "A message bus on Redis Streams for fleets of AI agents.\n\n"
        "Start with `redisbus demo`. To talk on a bus: `redisbus redis` in one shell, then "
        "`export REDISBUS_URL=...` and `redisbus send/read/tail ...` in others (or set "
        "REDISBUS_DATA_DIR to one directory everywhere: the commands share the private Redis "
        "that keeps the board there).\n\n"
        "Exit status: 0 ok, 1 refused or failed, 2 bad input, 3 no Redis."
    ),
    add_completion=True,
)


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        sys.stdout.write(f"redisbus {__version__}\n")
        raise typer.Exit(0)
    if ctx.invoked_subcommand is None:
        sys.stdout.write(ctx.get_help() + "\n")
        raise typer.Exit(0)


# --help lists the commands in this order: the order people reach for them
COMMANDS: dict[str, Callable[..., None]] = {
    "demo": ops.demo,
    "join": talk.join,
    "send": talk.send,
    "read": talk.read,
    "list": talk.list_,
    "wait": talk.wait,
    "done": talk.done,
    "receipt": talk.receipt,
    "discover": talk.discover,
    "complete": life.complete,
    "fail": life.fail,
    "cancel": life.cancel,
    "remove": life.remove,
    "tail": ops.tail,
    "agents": ops.agents,
    "stats": ops.stats,
    "pause": ops.pause,
    "resume": ops.resume,
    "delete": life.delete,
    "redis": ops.redis_server,
    "doctor": doctor.doctor,
    "a2a": a2a.a2a,
    "console": console,
    "exporter": exporter_program.exporter,
    "janitor": janitor.janitor,
    "repair": repair.repair,
    "acl": repair.acl,
    "keygen": repair.keygen,
    "mcp": mcp,
}
for name, command in COMMANDS.items():
    app.command(name)(command)
app.add_typer(ops.dlq, name="dlq")


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``redisbus`` command."""
    run(app, argv, "redisbus")


if __name__ == "__main__":
    main()
