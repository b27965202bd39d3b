"""``redisbus repair`` (inbox counters rebuilt from the streams), ``redisbus acl`` (a
least-privilege Redis user per agent host) and ``redisbus keygen`` (a host's Ed25519 key)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from ._acl import acl_user
from ._cli_base import (
    ChannelArg,
    ClusterOpt,
    JsonOpt,
    PrefixOpt,
    UrlOpt,
    app,
    connect,
    existing_channel,
    out,
    write_json,
)
from ._errors import InvalidInput


@app.command()
def repair(
    channel: ChannelArg,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = False,
) -> None:
    """Rebuild the channel's inbox counters from its stream; print what was fixed."""
    with connect(url, prefix, cluster) as bus:
        fixed = existing_channel(bus, channel).repair()
    if as_json:
        write_json({n: {"stored": old, "counted": new} for n, (old, new) in fixed.items()})
        return
    if not fixed:
        out.print("every counter matches the stream")
    for name, (old, new) in sorted(fixed.items()):
        out.print(f"{name}: {'missing' if old is None else old} -> {new}", markup=False)


@app.command()
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


@app.command()
def keygen(
    path: Annotated[str, typer.Argument(help="Where to write the private key (PEM, 0600).")],
) -> None:
    """Make this host's Ed25519 key; print the public key for the trust list."""
    from ._trust import generate_key

    try:
        public = generate_key(path)
    except FileExistsError as e:
        raise InvalidInput(f"{path} exists: a key is never overwritten") from e
    sys.stdout.write(public + "\n")
