"""Who may reach an MCP server: shared by the command, which checks before it imports the MCP
SDK, and by ``serve``, which checks again for callers that skip the command."""

from __future__ import annotations

import ipaddress

from ..._errors import InvalidInput

__all__ = ["LOOPBACK_NAMES", "check_exposure", "is_loopback"]

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(transport: str, host: str, token: str | None) -> None:
    """Refuse to serve the HTTP transport beyond this machine without a token: anyone who can
    reach the port would speak as this agent."""
    if transport != "stdio" and not token and not is_loopback(host):
        raise InvalidInput(
            f"refusing to serve MCP over HTTP on {host} without a token: anyone who reaches "
            "the port could act as this agent. Set --token (REDISBUS_MCP_TOKEN), or bind to "
            "127.0.0.1 and put an authenticating proxy in front."
        )
