"""``patchbox mcp``: the sandbox's tools as an MCP server (``docs/mcp.md``).

:mod:`controller.mcp.server` is the server (the tools, ``propose``, the task's resources, one
job per MCP session); :mod:`controller.mcp.serve` runs it over stdio or loopback HTTP.
"""
