"""mcp-sandbox: an MCP server that runs Python for LLM agents in a sandbox."""

from mcp_sandbox.errors import (
    InvalidRequest,
    PoolUnavailable,
    PrincipalLimitReached,
    Refused,
    SessionElsewhere,
    SessionLimitReached,
    StoreUnavailable,
)
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sandbox import Sandbox
from mcp_sandbox.settings import Settings
from mcp_sandbox.version import __version__

__all__ = [
    "ExecutionResult",
    "InvalidRequest",
    "PoolUnavailable",
    "PrincipalLimitReached",
    "Refused",
    "Sandbox",
    "SessionElsewhere",
    "SessionLimitReached",
    "Settings",
    "StoreUnavailable",
    "__version__",
]
