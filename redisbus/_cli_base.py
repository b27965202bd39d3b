"""The shared parts of the ``redisbus`` command: the app, its options, the connection."""

from __future__ import annotations

import json
import socket
import ssl
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any
from urllib.parse import urlparse

import redis
import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import CommandFunctionType

from . import _validate as check
from ._errors import BusConnectionError, InvalidInput, RedisbusError, UnknownAgent, UnknownChannel
from ._filters import check_entry_id, parse_filter, parse_since
from ._keys import ChannelKeys
from ._model import Member
from ._settings import BusSettings
from ._validate import channel_name
from .bus import Agent, Bus, Channel

__all__ = [
    "Exit",
    "Typer",
    "app",
    "attach",
    "connect",
    "existing_channel",
    "existing_member",
    "member_handle",
    "write_json",
]

# a TLS handshake with a server that does not speak TLS never completes: give up this soon
TLS_HANDSHAKE_S = 3.0

CONNECT_HELP = (
    "Redis URL (redis://, rediss://, redis+sentinel://). Unset: a private Redis. With "
    "REDISBUS_DATA_DIR it keeps the board in that directory (AOF) and is shared with "
    "whatever already serves it (`redisbus redis --data DIR`); without, it is temporary and "
    "lasts this one command."
)


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
    """``typer.Typer`` whose commands and groups show no placeholder after a flag in --help."""

    def __init__(self, **kw: Any) -> None:
        kw.setdefault("cls", Group)
        super().__init__(**kw)

    def command(
        self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kw: Any
    ) -> Callable[[CommandFunctionType], CommandFunctionType]:
        return super().command(name, cls=cls or Command, **kw)


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
    no_args_is_help=True,
    add_completion=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
)

out = Console(highlight=False, soft_wrap=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

# -- shared options ---------------------------------------------------------------------------

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="REDISBUS_URL", help=CONNECT_HELP)]
PrefixOpt = Annotated[
    str | None,
    typer.Option("--prefix", envvar="REDISBUS_PREFIX", help="Key prefix of the bus [default: rb]."),
]
ClusterOpt = Annotated[
    bool,
    typer.Option("--cluster", envvar="REDISBUS_CLUSTER", help="The URL is a Redis Cluster node."),
]
ChannelArg = Annotated[str, typer.Argument(help="Channel name.", show_default=False)]
AsOpt = Annotated[
    str,
    typer.Option(
        "--as",
        envvar="REDISBUS_AS",
        show_default=False,
        help=(
            "Agent name to act as. `join` and `send` join it when it is not a member yet; "
            "every other command needs an existing member. No commas: `a,b` is a recipient list."
        ),
    ),
]
ParentOpt = Annotated[
    str | None,
    typer.Option("--parent", envvar="REDISBUS_PARENT", help="Parent agent, when joining."),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", envvar="REDISBUS_JSON", help="Machine-readable JSON output.")
]
FilterOpt = Annotated[
    str | None,
    typer.Option(
        "--filter",
        "-f",
        envvar="REDISBUS_FILTER",
        help="unread | all | to:me | to:NAME | from:NAME | subject:TEXT | after:ID (ANDed).",
    ),
]
SinceOpt = Annotated[
    str | None,
    typer.Option("--since", envvar="REDISBUS_SINCE", help="ISO-8601 time or message id."),
]
LimitOpt = Annotated[
    int, typer.Option("--limit", "-n", envvar="REDISBUS_LIMIT", help="At most this many.")
]

RoutingOpt = Annotated[
    str | None,
    typer.Option(
        "--routing",
        envvar="REDISBUS_ROUTING",
        help="open | family: only used when this command creates the channel.",
    ),
]


class Exit(Exception):
    """A one-line failure with an exit status (raised by commands, printed by ``main``)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def given(**options: Any) -> dict[str, Any]:
    """The options given on the command line (or by their variable), for a settings class:
    the rest stay the settings' own (environment, then defaults). Empty text is not given."""
    return {k: v for k, v in options.items() if v is not None and v is not False and v != ""}


def settings_for(url: str | None, prefix: str | None = None, cluster: bool = False) -> BusSettings:
    """BusSettings from the environment, with the options given on the command line on top."""
    # a one-shot command has nobody scraping it
    return BusSettings(metrics=False, **given(url=url, prefix=prefix, cluster=cluster))


@contextmanager
def connect(url: str | None, prefix: str | None = None, cluster: bool = False) -> Iterator[Bus]:
    s = settings_for(url, prefix, cluster)
    if s.url:
        tls_preflight(s.url, s)
        bus = Bus.from_url(s.url, settings=s)
    else:  # SPEC: no URL, a private Redis (the board's, when REDISBUS_DATA_DIR names one)
        data = s.data_dir
        if data is None:
            err.print(
                "no REDISBUS_URL: using a private Redis for this command only (its data go "
                "with it); set REDISBUS_URL, or REDISBUS_DATA_DIR to keep a board"
            )
        bus = Bus.embedded(data, settings=s)
    try:
        yield bus
    finally:
        bus.close()


def tls_preflight(url: str, settings: BusSettings) -> None:
    """A ``rediss://`` URL: complete one TLS handshake within ``TLS_HANDSHAKE_S`` before the
    client connects. A plain Redis never answers a TLS hello, and the client would wait for
    its socket timeout on every retry (over a minute) before saying anything. Certificates
    are not checked here: the client checks them on its own connection."""
    p = urlparse(url)
    if p.scheme != "rediss":
        return
    host, port = p.hostname or "localhost", p.port or 6379
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if settings.ssl_certfile:
        context.load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    where = f"{host}:{port}"
    try:
        with socket.create_connection((host, port), timeout=settings.connect_timeout_s) as raw:
            raw.settimeout(TLS_HANDSHAKE_S)
            with context.wrap_socket(raw, server_hostname=host):
                return
    except TimeoutError:
        reason = f"no TLS handshake within {TLS_HANDSHAKE_S:g} s"
    except ssl.SSLError as e:
        reason = f"TLS handshake failed ({e.reason or e})"
    except OSError as e:
        raise BusConnectionError(f"Redis unreachable at {where}: {e}") from e
    raise BusConnectionError(
        f"rediss:// to {where}: {reason}; is it a plain Redis? use redis:// for a server "
        "without TLS"
    )


def existing_channel(bus: Bus, name: str) -> Channel:
    """Attach to a channel that exists; a typo must not create an empty channel."""
    cname = channel_name(name)
    keys = ChannelKeys.build(bus.settings.prefix, cname)
    if not raw_redis(bus.redis.exists, keys.meta):
        raise UnknownChannel(f"no such channel {cname!r} (`redisbus stats` lists the channels)")
    return bus.channel(cname)


def agent_option(name: str, what: str = "--as") -> str:
    """A name given to --as or --parent: a comma would make it unaddressable from here
    (``send a,b`` is a list of two recipients), so it is refused."""
    if "," in name:
        raise InvalidInput(f"{what} {name!r}: agent names cannot contain a comma")
    return name


def existing_member(ch: Channel, name: str) -> Member:
    """The member ``name`` of ``ch``; commands other than join and send never create one."""
    member = ch.members().get(agent_option(name))
    if member is None:
        raise UnknownAgent(
            f"no such member {name!r} in channel {ch.name!r} "
            f"(`redisbus join {ch.name} --as {name}` first)"
        )
    return member


def member_handle(ch: Channel, name: str, settings: BusSettings) -> Agent:
    """A handle on an existing member that changes nothing by being made: no join, so no
    status change, no heartbeat (for list, receipt, discover)."""
    m = existing_member(ch, name)
    return Agent(ch, m.name, m.id, m.depth, m.parent, cli_replica(settings))


def cli_replica(settings: BusSettings) -> str:
    return settings.replica or f"{settings.host}/cli"


def precheck(
    *,
    filter_by: str | None = None,
    since: str | None = None,
    limit: int | None = None,
    preview: int | None = None,
    timeout: float | None = None,
    ids: list[str] | None = None,
    result: str | None = None,
) -> None:
    """Refuse bad options before anything touches Redis: a refused command must not even join
    its --as agent."""
    parse_filter(filter_by)
    parse_since(since)
    if limit is not None:
        check.integer(limit, "limit", 1, 10_000)
    if preview is not None:
        check.integer(preview, "preview", 0, 1 << 20)
    if timeout is not None:
        check.seconds(timeout, "timeout")
    for i in ids or []:
        check_entry_id(i)
    if result is not None:
        check.text(result, "result", 1024, allow_newlines=True)


def attach(ch: Channel, name: str, parent: str | None, settings: BusSettings, **card: Any) -> Agent:
    """Join as ``name`` (re-attaching when it is already a member) with a CLI replica name."""
    agent_option(name)
    if parent is not None:
        agent_option(parent, "--parent")
    return ch.join(name, parent=parent, replica=cli_replica(settings), **card)


def write_json(value: object) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def raw_redis(fn: Any, *args: Any, **kw: Any) -> Any:
    """A raw redis-py call from the CLI, with Redis errors turned into the bus's own."""
    try:
        return fn(*args, **kw)
    except (redis.ConnectionError, redis.TimeoutError, OSError) as e:
        raise BusConnectionError(f"Redis unreachable: {e}") from e
    except redis.RedisError as e:
        raise RedisbusError(f"Redis error: {e}") from e
