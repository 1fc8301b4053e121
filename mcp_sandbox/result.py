"""The one result model shared by every backend, the Python API and the MCP server."""

from __future__ import annotations

import base64
import binascii
import mimetypes
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field, PrivateAttr

from mcp_sandbox.backends.guest_runtime import cap_text

#: Room for the truncation marker a guest adds when it caps a field itself.
MARKER_SLACK = 100

#: Failures that are not a Python exception of the program itself.
SandboxErrorType = Literal["Timeout", "MemoryLimit", "SandboxCrash", "Rejected"]


TEXT_FIELDS = {"success", "stdout", "stderr", "result", "error_type", "error", "truncated"}


class GuestFile(BaseModel):
    """A file the program wrote to output/, as the guest reports it."""

    path: str = Field(max_length=1024, description="Relative to output/.")
    size: int = Field(ge=0)
    data: str | None = Field(None, description="base64, when the host cannot read the sandbox's disk.")


class GuestOutcome(BaseModel):
    """What the sandbox reports about one run. Untrusted: validated before use."""

    success: bool
    stdout: str = ""
    stderr: str = ""
    result: str | None = None
    error_type: str | None = None
    error: str | None = None
    truncated: bool = False
    files: list[GuestFile] = []
    figures: list[str] = Field([], description="PNG images, base64.")
    notes: list[str] = []

    def capped(self, limit: int) -> GuestOutcome:
        """The same outcome with every text field within `limit` and valid UTF-8 (lone
        surrogates replaced, as JSON output cannot carry them), whatever the guest sent."""
        changes: dict[str, str] = {}
        truncated = self.truncated
        for name in ("stdout", "stderr", "result", "error"):
            value = getattr(self, name)
            if value is None:
                continue
            if len(value) > limit + MARKER_SLACK:
                value, truncated = cap_text(value, limit)[0], True
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                value = value.encode("utf-8", "replace").decode("utf-8")
            if value is not getattr(self, name):
                changes[name] = value
        if not changes:
            return self
        return self.model_copy(update={**changes, "truncated": truncated})


class OutputFile(BaseModel):
    name: str = Field(description="Path under output/, e.g. report.csv.")
    size: int = Field(description="Bytes.")
    mime_type: str
    saved_to: str | None = Field(
        None, description="Where the server copied it, when MCP_SANDBOX_OUTPUT_DIR is set."
    )


@dataclass(frozen=True)
class OutputLimits:
    """What one execution may hand back besides text: output/ files and figures."""

    max_files: int = 20
    max_bytes: int = 10 * 1024 * 1024
    max_figures: int = 10

    def message(self) -> dict[str, int]:
        return {"max_files": self.max_files, "max_bytes": self.max_bytes, "max_figures": self.max_figures}


@dataclass
class Artifacts:
    """The bytes that come with a result: figures and output files. Kept out of the JSON result."""

    figures: list[bytes] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)


def mime_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def decode_base64(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


class ExecutionResult(BaseModel):
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
    files: list[OutputFile] = Field(
        [],
        description="Files the program wrote to output/ in this call; images and small text files "
        "also come as MCP content.",
    )
    figures: int = Field(0, description="matplotlib figures returned as PNG images (MCP image content).")
    notes: list[str] = Field([], description="What the server left out, e.g. files past a cap.")
    _artifacts: Artifacts = PrivateAttr(default_factory=Artifacts)

    @property
    def artifacts(self) -> Artifacts:
        return self._artifacts

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
