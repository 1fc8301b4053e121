"""The one result model shared by every backend, the Python API and the MCP server."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mcp_sandbox.backends.guest_runtime import cap_text

#: Room for the truncation marker a guest adds when it caps a field itself.
MARKER_SLACK = 100

#: Failures that are not a Python exception of the program itself.
SandboxErrorType = Literal["Timeout", "MemoryLimit", "SandboxCrash", "Rejected"]


class GuestOutcome(BaseModel):
    """What the sandbox reports about one run. Untrusted: validated before use."""

    success: bool
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    error_type: str | None = None
    error: str | None = None
    truncated: bool = False

    def capped(self, limit: int) -> GuestOutcome:
        """The same outcome with every text field within `limit`, whatever the guest sent."""
        changes: dict[str, str] = {}
        for name in ("stdout", "stderr", "result", "error"):
            value = getattr(self, name)
            if value is not None and len(value) > limit + MARKER_SLACK:
                changes[name] = cap_text(value, limit)[0]
        if not changes:
            return self
        return self.model_copy(update={**changes, "truncated": True})


class ExecutionResult(GuestOutcome):
    """The outcome of one `execute_python` call."""

    success: bool = Field(description="True when the program ran to the end without an exception.")
    stdout: str = Field("", description="Standard output, capped (head and tail kept).")
    stderr: str = Field("", description="Standard error, capped (head and tail kept).")
    result: str | None = Field(
        None, description="repr() of the program's final expression, like a REPL, or null."
    )
    error_type: str | None = Field(
        None,
        description="The exception class name, or Timeout, MemoryLimit, SandboxCrash, Rejected; "
        "null on success.",
    )
    error: str | None = Field(None, description="Error message with a traceback of the program's own frames.")
    truncated: bool = Field(False, description="True when any output field was cut to the size cap.")
    duration_ms: int = Field(0, description="Wall time of the call on the server, in milliseconds.")
    backend: str = Field(description="The sandbox that ran the code, e.g. pyodide.")
    session_id: str | None = Field(
        None, description="The session the code ran in, or null for a one-off run."
    )
    session_lost: bool = Field(
        False,
        description="True when the sandbox had to be killed: the session's variables are gone "
        "and its next call starts fresh.",
    )

    @classmethod
    def failure(
        cls,
        error_type: SandboxErrorType,
        message: str,
        *,
        backend: str,
        duration_ms: int = 0,
        session_lost: bool = False,
        stdout: str = "",
        stderr: str = "",
    ) -> ExecutionResult:
        """A result for a failure of the sandbox rather than of the program."""
        return cls(
            success=False,
            error_type=error_type,
            error=message,
            backend=backend,
            duration_ms=duration_ms,
            session_lost=session_lost,
            stdout=stdout,
            stderr=stderr,
        )
