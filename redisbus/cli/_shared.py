"""What the ``redisbus`` commands that talk to a bus share: the options of a channel and an
agent, the connection, and how a command finds an existing channel or member."""

from __future__ import annotations

import json
import signal
import socket
import ssl
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Protocol, TypeVar
from urllib.parse import urlparse

import typer
from rich.console import Console, RenderableType

from .. import _validate as check
from .._commands import BusAddress, err, option
from .._errors import BusConnectionError, InvalidInput, UnknownAgent, UnknownChannel
from .._filters import check_entry_id, parse_filter, parse_since
from .._keys import ChannelKeys
from .._model import Member, Message
from .._settings import BusSettings
from .._show import message_text
from .._validate import channel_name
from ..bus import Agent, Bus, Channel

# a TLS handshake with a server that does not speak TLS never completes: give up this soon
TLS_HANDSHAKE_S = 3.0

out = Console(highlight=False, soft_wrap=False)

# -- options ------------------------------------------------------------------------------------

ChannelArg = Annotated[str, typer.Argument(help="Channel name.", show_default=False)]
AsOpt = Annotated[
    str,
    option(
        "--as",
        "REDISBUS_AS",
        "Agent name to act as. `join` and `send` join it when it is not a member yet; every "
        "other command needs an existing member. No commas: `a,b` is a recipient list.",
        show_default=False,
    ),
]
ParentOpt = Annotated[
    str | None, option("--parent", "REDISBUS_PARENT", "Parent agent, when joining.")
]
JsonOpt = Annotated[bool, option("--json", "REDISBUS_JSON", "Machine-readable JSON output.")]
FilterOpt = Annotated[
    str | None,
    option(
        "--filter",
        "REDISBUS_FILTER",
        "unread | all | to:me | to:NAME | from:NAME | subject:TEXT | after:ID (ANDed).",
        "-f",
    ),
]
SinceOpt = Annotated[
    str | None, option("--since", "REDISBUS_SINCE", "ISO-8601 time or message id.")
]
LimitOpt = Annotated[int, option("--limit", "REDISBUS_LIMIT", "At most this many.", "-n")]
RoutingOpt = Annotated[
    str | None,
    option(
        "--routing",
        "REDISBUS_ROUTING",
        "open | family: only used when this command creates the channel.",
    ),
]


@contextmanager
def connect(address: BusAddress) -> Iterator[Bus]:
    """The bus at ``address``; without a URL, a private Redis (see ``--url``)."""
    s = address.settings(metrics=False)  # a one-shot command has nobody scraping it
    if s.url:
        tls_preflight(s.url, s)
        bus = Bus.from_url(s.url, settings=s)
    else:  # no URL: a private Redis (the board's, when REDISBUS_DATA_DIR names one)
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
    if not bus.redis.exists(keys.meta):
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


def acting(ch: Channel, name: str, bus: Bus) -> Agent:
    """An existing member, attached as this command's replica (read, wait, done, complete,
    fail and cancel act as it)."""
    existing_member(ch, name)
    return attach(ch, name, None, bus.settings)


def on_signals() -> Callable[[], bool]:
    """Turn SIGINT/SIGTERM into a flag, so a loop stops cleanly between two steps."""
    flag: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        flag.append(True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return lambda: bool(flag)


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
