"""mcp-sandbox: an MCP server that runs Python for LLM agents in a sandbox."""

from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings

__version__ = "0.1.0"
__all__ = ["ExecutionResult", "Settings", "__version__"]
