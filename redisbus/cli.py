"""The ``redisbus`` command: talk on the bus, watch it, and run it, from a shell.

Every option can also be set by a ``REDISBUS_*`` environment variable (shown in ``--help``).
Every failure is one line on stderr and a non-zero exit status, never a traceback:

    0  success
    1  refused or failed (a limit, routing, an unknown agent, a paused channel, a timeout)
    2  bad input (usage, a malformed filter or time, an out-of-range value)
    3  no Redis (REDISBUS_URL unset or unreachable)

What creates what: only ``join`` creates a channel; ``join`` and ``send`` make ``--as NAME`` a
member (a send refused for every recipient removes a member it made). Every other command needs
an existing channel (else ``unknown_channel``, exit 1) and, with ``--as``, an existing member
(else ``unknown_agent: no such member``, exit 1), and changes no roster. Recipients: a name,
``parent``, ``all`` or ``a,b,c``; names cannot contain a comma. ``wait`` returns messages the
agent has not read yet and marks them read (``--done``: done), so the next ``wait`` moves on.

The commands live in ``_cli_talk`` (join, send, read, list, wait, done, receipt, discover),
``_cli_life`` (complete, fail, cancel, remove, delete), ``_cli_ops`` (tail, agents, stats, pause,
resume, dlq, redis, demo), ``_cli_doctor`` (doctor),
``_cli_daemons`` (exporter, janitor), ``_cli_repair`` (repair, acl, keygen), ``_cli_console``
(console) and ``_cli_a2a`` (a2a); ``mcp`` is a typer command like the others
(``integrations.mcp._command``). The commands of optional extras import them only when they run
(``console`` its web app, ``mcp`` the MCP SDK, ``a2a`` the A2A SDK), so ``redisbus --help``
and the other commands work without them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Annotated, Any, NoReturn

import click
import pydantic
import typer
from rich.text import Text

from . import (  # noqa: F401 - they register commands
    __version__,
    _cli_a2a,
    _cli_console,
    _cli_daemons,
    _cli_doctor,
    _cli_life,
    _cli_ops,
    _cli_repair,
    _cli_talk,
)
from ._cli_base import Exit, app, err
from ._cli_view import message_text, receipt_table, refusal_text
from ._errors import BusConnectionError, InvalidInput, RedisbusError
from .integrations.mcp import _command as _mcp_command

__all__ = ["app", "main", "message_text", "receipt_table"]


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


_mcp_command.register(app)  # typer options; the MCP SDK is imported only when it runs

# --help lists the commands in the order people reach for them, not in import order
ORDER = (
    "demo",
    "join",
    "send",
    "read",
    "list",
    "wait",
    "done",
    "receipt",
    "discover",
    "complete",
    "fail",
    "cancel",
    "remove",
    "tail",
    "agents",
    "stats",
    "pause",
    "resume",
    "delete",
    "redis",
    "doctor",
)


def _rank(info: Any) -> int:
    name = info.name or info.callback.__name__.replace("_", "-")
    return ORDER.index(name) if name in ORDER else len(ORDER)


app.registered_commands.sort(key=_rank)


# -- entry point --------------------------------------------------------------------------------


def one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text or type(e).__name__


def fail(message: str, status: int) -> NoReturn:
    err.print(Text(f"redisbus: {message}", style="red"), soft_wrap=True)
    sys.exit(status)


# typer >= 0.20 vendors click and raises its own copies of click's exceptions
USAGE_ERRORS: tuple[type[Exception], ...] = (typer.TyperException, click.ClickException)


def _context() -> Any:
    command = typer.main.get_command(app)
    return command.make_context("redisbus", [], resilient_parsing=True)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``redisbus`` command."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(
            args=list(argv) if argv is not None else None,
            prog_name="redisbus",
            standalone_mode=False,
        )
    except Exit as e:
        fail(one_line(e), e.status)
    except USAGE_ERRORS as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(typer.main.get_command(app).get_help(_context()) + "\n")
            sys.exit(0)
        text = e.format_message() if hasattr(e, "format_message") else str(e)
        fail(f"{one_line(Exception(text))} (see --help)", 2)
    except (typer.Abort, click.Abort, KeyboardInterrupt):
        fail("interrupted", 130)
    except InvalidInput as e:
        fail(f"{e.code}: {one_line(e)}", 2)
    except BusConnectionError as e:
        fail(f"{e.code}: {one_line(e)}", 3)
    except RedisbusError as e:
        fail(one_line(Exception(refusal_text(e))), 1)
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        fail(f"invalid setting {where} (REDISBUS_{where.upper()}): {first.get('msg')}", 2)
    except BrokenPipeError:
        sys.exit(1)
    except Exception as e:  # the promise is one line, never a traceback (REDISBUS_DEBUG=1 shows it)
        if os.environ.get("REDISBUS_DEBUG"):
            raise
        fail(f"unexpected error: {type(e).__name__}: {one_line(e)}", 1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
