"""``redisbus repair`` (inbox counters rebuilt from the streams), ``redisbus acl`` (a
least-privilege Redis user per agent host) and ``redisbus keygen`` (a host's Ed25519 key)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from .._acl import acl_user
from .._commands import BusAddress, PrefixOpt, with_address
from .._errors import InvalidInput
from ._shared import ChannelArg, JsonOpt, connect, existing_channel, out, write_json


@with_address
def repair(address: BusAddress, channel: ChannelArg, as_json: JsonOpt = False) -> None:
    """Rebuild the channel's inbox counters from its stream; print what was fixed."""
    with connect(address) as bus:
        fixed = existing_channel(bus, channel).repair()
    if as_json:
        write_json({n: {"stored": old, "counted": new} for n, (old, new) in fixed.items()})
        return
    if not fixed:
        out.print("every counter matches the stream")
    for name, (old, new) in sorted(fixed.items()):
        out.print(f"{name}: {'missing' if old is None else old} -> {new}", markup=False)


def acl(
    user: Annotated[str, typer.Argument(help="ACL user name (one per agent host).")],
    channels: Annotated[
        list[str], typer.Argument(help="Channel patterns the host may use (fnmatch: team-*).")
    ],
    password_env: Annotated[
        str,
        typer.Option(
            "--password-env",
            help="Environment variable holding the user's password (never a command argument).",
        ),
    ] = "REDISBUS_ACL_PASSWORD",
    prefix: PrefixOpt = None,
) -> None:
    """Print an ACL file line: a Redis user limited to the keys of these channels."""
    password = os.environ.get(password_env, "")
    if not password:
        raise InvalidInput(f"set {password_env} to the user's password")
    sys.stdout.write(acl_user(user, password, channels, prefix or "rb") + "\n")


def keygen(
    path: Annotated[
        str,
        typer.Argument(
            help="Where to write the private key (PEM, 0600). Its directory must exist: "
            "create it first, readable by this host's user only (mkdir -m 700 -p DIR)."
        ),
    ],
) -> None:
    """Make this host's Ed25519 key; print the public key for the trust list. The key's
    directory is never created for you: where a private key lives, and who may read it, is
    the operator's choice (a mistyped path should fail, not make a new directory)."""
    from .._trust import generate_key

    where = os.path.dirname(os.path.abspath(path))
    try:
        public = generate_key(path)
    except FileExistsError as e:
        if os.path.isdir(path):
            raise InvalidInput(f"{path} is a directory: give a file name inside it") from e
        raise InvalidInput(f"{path} exists: a key is never overwritten") from e
    except FileNotFoundError as e:
        raise InvalidInput(
            f"directory {where} does not exist: create it first (mkdir -m 700 -p {where})"
        ) from e
    except NotADirectoryError as e:
        raise InvalidInput(f"{where} is not a directory: pick a path inside one") from e
    except PermissionError as e:
        raise InvalidInput(f"cannot write in {where}: permission denied") from e
    sys.stdout.write(public + "\n")
