"""The tool bridge: sandboxed code calls the tools of other MCP servers through the host."""
