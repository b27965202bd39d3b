"""Adapters that put the bus in other frameworks' hands: ``hermes`` (a Hermes Agent plugin) and
``mcp`` (an MCP server, one agent per process). Each uses only the public API of redisbus."""
