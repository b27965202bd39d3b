"""Adapters that put the bus in other frameworks' hands: ``hermes`` (a Hermes Agent plugin) and
``mcp`` (an MCP server, one agent per process), and ``a2a`` (an A2A bridge). Each uses only the
public API of redisbus.

Not a Python API: each is a program or a plugin, and its command or its configuration is the
interface (docs/reference/api.md#what-is-public); their Python names may change in any release.
"""
