"""What every ``redisbus`` command is made of, for the CLI and for the programs that carry a
command of their own (the exporter, the janitor, the console, the MCP adapter).

Here: the typer app class (flags show no placeholder in ``--help``), the options several
programs share, ``Exit``, and :func:`run`, the one place where whatever a command raises
becomes one line on stderr and an exit status:

    0  success
    1  refused or failed (a limit, routing, an unknown agent, a paused channel, a timeout)
    2  bad input (usage, a malformed filter or time, an out-of-range value)
    3  no Redis (REDISBUS_URL unset or unreachable)
    130 interrupted

A Redis exception that reaches it is classified as the library classifies every other
(``_redis.classify``). ``python -m redisbus.exporter`` and the like run their command with
:func:`program`, through the same :func:`run`, so they need nothing of ``redisbus.cli``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import click
import pydantic
import typer
from redis import exceptions as rx
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

from ._errors import BusConnectionError, InvalidInput, RedisbusError
from ._redis import classify
from ._settings import BusSettings

__all__ = [
    "BusAddress",
    "ClusterOpt",
    "DaemonUrlOpt",
    "Exit",
    "LogLevelOpt",
    "PrefixOpt",
    "Typer",
    "UrlOpt",
    "given",
    "option",
    "port_option",
    "program",
    "refusal_text",
    "run",
    "with_address",
    "with_fleet_address",
]

err = Console(stderr=True, highlight=False, soft_wrap=True)


def _bare_flags(params: list[Any]) -> list[Any]:
    """Flags take no value, so --help shows none: typer would print ``<bool>`` after each
    (``--help`` too). An empty metavar is what its help renders as nothing."""
    for p in params:
        if isinstance(p, TyperOption) and p.is_flag and p.metavar is None:
            p.metavar = ""
    return params


class Command(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


class Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _bare_flags(super().get_params(ctx))


class Typer(typer.Typer):
    """``typer.Typer`` in the style of every ``redisbus`` command: markdown help, no pretty
    tracebacks (:func:`run` prints one line), no placeholder after a flag in --help."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", Group)
        kw.setdefault("rich_markup_mode", "markdown")
        kw.setdefault("pretty_exceptions_enable", False)
        kw.setdefault("add_completion", False)
        super().__init__(**kw)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kw: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or Command, **kw)


def option(name: str, env: str | list[str], text: str, *more: str, **kw: Any) -> Any:
    """``typer.Option(name, *more, envvar=env, help=text, **kw)``: every option of a
    ``redisbus`` command has its ``REDISBUS_*`` variable and a help line."""
    return typer.Option(name, *more, envvar=env, help=text, **kw)


def port_option(env: str, text: str, *more: str) -> Any:
    """``--port`` (1 to 65535) of a program that listens."""
    return option("--port", env, text, *more, min=1, max=65535)


# -- options several programs share --------------------------------------------------------------

CONNECT_HELP = (
    "Redis URL (redis://, rediss://, redis+sentinel://). Unset: a private Redis. With "
    "REDISBUS_DATA_DIR it keeps the board in that directory (AOF) and is shared with "
    "whatever already serves it (`redisbus redis --data DIR`); without, it is temporary and "
    "lasts this one command."
)
UrlOpt = Annotated[str | None, option("--url", "REDISBUS_URL", CONNECT_HELP)]
PrefixOpt = Annotated[
    str | None, option("--prefix", "REDISBUS_PREFIX", "Key prefix of the bus [default: rb].")
]
ClusterOpt = Annotated[
    bool, option("--cluster", "REDISBUS_CLUSTER", "The URL is a Redis Cluster node.")
]
# The daemons never start a private Redis: they watch or sweep a shared one.
DaemonUrlOpt = Annotated[
    str | None,
    option(
        "--url",
        "REDISBUS_URL",
        "The fleet's Redis URL (redis://, rediss://, redis+sentinel://). Required.",
        show_default=False,
    ),
]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LogLevelOpt = Annotated[
    str,
    option(
        "--log-level", "REDISBUS_LOG_LEVEL", "DEBUG | INFO | WARNING | ERROR.", case_sensitive=False
    ),
]


@dataclass(frozen=True)
class BusAddress:
    """Where a command finds its bus: ``--url``, ``--prefix`` and ``--cluster`` as given
    (``None``: not given, the environment's or the default)."""

    url: str | None = None
    prefix: str | None = None
    cluster: bool = False

    def given(self) -> dict[str, Any]:
        """The settings these options set (those given)."""
        return given(url=self.url, prefix=self.prefix, cluster=self.cluster)

    def settings(self, **more: Any) -> BusSettings:
        """BusSettings from the environment, with these options on top (and ``more``)."""
        return BusSettings(**more, **self.given())


def with_address(command: Callable[..., None]) -> Callable[..., None]:
    """``command(address: BusAddress, ...)`` as typer sees it: its own options, then
    ``--url``, ``--prefix`` and ``--cluster``, which reach it as one ``BusAddress``. It
    connects when it chooses, so bad input is refused before any Redis is touched."""
    return _addressed(command, UrlOpt, first=False)


def with_fleet_address(command: Callable[..., None]) -> Callable[..., None]:
    """``with_address`` for a daemon: ``--url`` (the fleet's Redis: never a private one),
    ``--prefix`` and ``--cluster`` come first, before its own options."""
    return _addressed(command, DaemonUrlOpt, first=True)


def _addressed(command: Callable[..., None], url: Any, *, first: bool) -> Callable[..., None]:
    signature = inspect.signature(command, eval_str=True)
    address, *own = signature.parameters.values()
    assert address.name == "address", f"{command.__name__}: address must come first"
    kind = inspect.Parameter.KEYWORD_ONLY
    added = [
        inspect.Parameter("url", kind, default=None, annotation=url),
        inspect.Parameter("prefix", kind, default=None, annotation=PrefixOpt),
        inspect.Parameter("cluster", kind, default=False, annotation=ClusterOpt),
    ]

    @functools.wraps(command)
    def typed(*args: Any, url: str | None, prefix: str | None, cluster: bool, **kw: Any) -> None:
        command(BusAddress(url, prefix, cluster), *args, **kw)

    # all keyword-only (typer passes each by name): any order, defaults or not
    params = [p.replace(kind=kind) for p in ([*added, *own] if first else [*own, *added])]
    typed.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    typed.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    return typed


class Exit(Exception):
    """A one-line failure with an exit status (raised by commands, printed by :func:`run`)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def given(**options: Any) -> dict[str, Any]:
    """The options given on the command line (or by their variable), for a settings class:
    the rest stay the settings' own (environment, then defaults). Empty text is not given."""
    return {k: v for k, v in options.items() if v is not None and v is not False and v != ""}


def log_to_stderr(level: str) -> None:
    """A daemon's log lines on stderr, at ``level`` (``--log-level``)."""
    name = level.upper()
    if name not in LOG_LEVELS:
        raise Exit(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {level!r}", 2)
    logging.basicConfig(
        level=name, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def required_url(settings: BusSettings, why: str) -> str:
    """The URL of the shared Redis a daemon runs against; without one, exit 3 saying ``why``."""
    if not settings.url:
        raise Exit(f"set REDISBUS_URL (or --url){why}", 3)
    return settings.url


# -- running a command ----------------------------------------------------------------------------


def refusal_text(e: RedisbusError) -> str:
    """``code: reason``; a limit's reason carries its numbers (see ``LimitExceeded.__str__``)."""
    return f"{e.code}: {e}"


def one_line(text: str) -> str:
    return " ".join(text.split())


# typer >= 0.20 vendors click and raises its own copies of click's exceptions
USAGE_ERRORS: tuple[type[Exception], ...] = (typer.TyperException, click.ClickException)
ABORTS: tuple[type[BaseException], ...] = (typer.Abort, click.Abort, KeyboardInterrupt)
REDIS_ERRORS: tuple[type[Exception], ...] = (rx.RedisError, rx.RedisClusterException)


def failure(e: BaseException) -> tuple[str, int]:
    """What a command that raised ``e`` prints (one line; empty: nothing) and its exit status:
    the one classification of every ``redisbus`` command's failures."""
    if isinstance(e, Exit):
        return one_line(str(e)) or "failed", e.status
    if isinstance(e, USAGE_ERRORS):
        text = e.format_message() if hasattr(e, "format_message") else str(e)
        return f"{one_line(text)} (see --help)", 2
    if isinstance(e, ABORTS):
        return "interrupted", 130
    if isinstance(e, REDIS_ERRORS):  # a raw Redis call of a command: as the library says it
        e = classify(e)[1]
    if isinstance(e, InvalidInput):
        return one_line(refusal_text(e)), 2
    if isinstance(e, BusConnectionError):
        return one_line(refusal_text(e)), 3
    if isinstance(e, RedisbusError):
        return one_line(refusal_text(e)), 1
    if isinstance(e, pydantic.ValidationError):
        first = e.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        return f"invalid setting {where} (REDISBUS_{where.upper()}): {first.get('msg')}", 2
    if isinstance(e, BrokenPipeError):
        return "", 1  # the reader went away: nobody to tell
    return f"unexpected error: {type(e).__name__}: {one_line(str(e))}", 1


def run(app: typer.Typer, argv: Sequence[str] | None, prog_name: str) -> NoReturn:
    """Run ``app`` on ``argv`` (``None``: ``sys.argv[1:]``) and exit with its status; a
    failure is one line on stderr, never a traceback (``REDISBUS_DEBUG=1`` shows it)."""
    try:
        rv = typer.main.get_command(app).main(
            args=list(argv) if argv is not None else None,
            prog_name=prog_name,
            standalone_mode=False,
        )
    except (Exception, KeyboardInterrupt) as e:
        message, status = failure(e)
        if message.startswith("unexpected error") and os.environ.get("REDISBUS_DEBUG"):
            raise
        if message:
            err.print(Text(f"redisbus: {message}", style="red"), soft_wrap=True)
        sys.exit(status)
    sys.exit(rv if isinstance(rv, int) else 0)


def program(fn: Callable[..., Any], name: str, argv: Sequence[str] | None = None) -> int:
    """Run the command function ``fn`` as ``redisbus NAME ARGV...`` (``ARGV`` defaults to
    ``sys.argv[1:]``) and return its exit status: ``python -m redisbus.exporter`` and the like,
    with the help, options and exit statuses of ``redisbus NAME``."""
    app = Typer(name=name)
    app.command(name)(fn)
    try:
        run(app, sys.argv[1:] if argv is None else argv, f"redisbus {name}")
    except SystemExit as e:
        code = e.code
        return code if isinstance(code, int) else (0 if code is None else 1)
