"""The executor interface every backend implements, and the timeout policy they share."""

from __future__ import annotations

import logging
import posixpath
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import anyio

from mcp_sandbox.bridge.calls import ToolCalls
from mcp_sandbox.bridge.upstreams import ToolBridge
from mcp_sandbox.result import (
    TEXT_FIELDS,
    ExecutionResult,
    GuestFile,
    GuestOutcome,
    OutputFile,
    OutputLimits,
    SandboxErrorType,
    decode_base64,
    mime_type,
)

logger = logging.getLogger(__name__)


class SandboxDied(Exception):
    """The sandbox process is gone or unusable; its session's state is lost."""

    def __init__(self, message: str, error_type: SandboxErrorType = "SandboxCrash") -> None:
        super().__init__(message)
        self.error_type: SandboxErrorType = error_type


class SandboxStartError(Exception):
    """A new sandbox could not be started (runtime missing, load failure, start timeout)."""


@dataclass
class RunRequest:
    """One program to run, and what comes with it to the sandbox."""

    code: str
    max_output_chars: int
    output: OutputLimits = field(default_factory=OutputLimits)
    #: The bridge's catalog as JSON text, when the guest's `tools` must be rebuilt first.
    tools_manifest: str | None = None


def safe_output_path(path: str) -> str | None:
    """`path` when it names a file inside output/ (relative, no `..`), else None."""
    normal = posixpath.normpath(path)
    if not path or normal.startswith(("/", "../")) or normal in (".", "..") or "\\" in path or "\x00" in path:
        return None
    return normal


class Executor(ABC):
    """One sandbox: an interpreter whose state lives from one `run` to the next.

    Backends implement `_submit`, `_await_outcome`, `interrupt` and `close`; `run` holds the
    timeout policy so it is the same everywhere: at the deadline the program is interrupted,
    and if it has not stopped after a grace period the sandbox is killed. While `_await_outcome`
    waits, it hands the program's bridged tool calls to `self.tool_calls`.
    """

    backend: ClassVar[str]
    #: The bridged calls of the execution in progress.
    tool_calls: ToolCalls
    #: Which catalog version the guest's `tools` was built from (-1: none yet).
    tools_version: int = -1
    #: The latest line the running program printed, as the guest last reported it (for progress).
    latest_line: str | None = None

    @property
    @abstractmethod
    def alive(self) -> bool:
        """False once the sandbox has died or been closed."""

    @abstractmethod
    async def _submit(self, request: RunRequest) -> None:
        """Start running the request's code, first rebuilding the guest's `tools` from its
        manifest when it has one; returns at once."""

    def _output_file_bytes(self, file: GuestFile, path: str) -> bytes | None:
        """The bytes of output/`path`: sent inline by the guest unless a backend can read its disk."""
        return decode_base64(file.data) if file.data is not None else None

    @abstractmethod
    async def _await_outcome(self) -> GuestOutcome:
        """Wait for the submitted program to finish. Raises SandboxDied."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Ask the running program to stop (KeyboardInterrupt); returns at once."""

    @abstractmethod
    async def close(self) -> None:
        """Stop the sandbox and free everything it holds. Safe to call twice."""

    async def warm_up(self) -> None:  # noqa: B027 - optional: only a JIT-compiled runtime needs it
        """Use idle time to make the next calls faster; returns at once. Called for sandboxes
        that serve a session, which will run more programs."""

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        grace: float,
        max_output_chars: int,
        bridge: ToolBridge | None = None,
        max_tool_calls: int = 1000,
        output: OutputLimits | None = None,
    ) -> ExecutionResult:
        request = RunRequest(code, max_output_chars, output or OutputLimits())
        self.latest_line = None
        async with anyio.create_task_group() as task_group:
            self.tool_calls = ToolCalls(bridge, task_group, max_tool_calls)
            if bridge is not None and bridge.version != self.tools_version:
                request.tools_manifest, self.tools_version = bridge.manifest_json, bridge.version
            try:
                result = await self._run(request, timeout, grace)
            finally:
                # Bridged calls still pending when the execution ends are cancelled and answered.
                self.tool_calls.cancel_all()
        return result

    async def _run(self, request: RunRequest, timeout: float, grace: float) -> ExecutionResult:
        started = time.perf_counter()
        max_output_chars = request.max_output_chars

        def elapsed_ms() -> int:
            return int((time.perf_counter() - started) * 1000)

        def finished(outcome: GuestOutcome) -> ExecutionResult:
            result = ExecutionResult(
                **outcome.model_dump(include=TEXT_FIELDS), backend=self.backend, duration_ms=elapsed_ms()
            )
            self._take_artifacts(result, outcome, request.output)
            return result

        try:
            await self._submit(request)
            with anyio.move_on_after(timeout):
                return finished((await self._await_outcome()).capped(max_output_chars))
            await self.interrupt()
            self.tool_calls.cancel_all()
            with anyio.move_on_after(grace):
                outcome = (await self._await_outcome()).capped(max_output_chars)
                if outcome.error_type != "KeyboardInterrupt":
                    # It finished on its own just as the deadline passed.
                    return finished(outcome)
                return ExecutionResult.failure(
                    "Timeout",
                    f"Execution timed out after {timeout:g} s and was interrupted; "
                    "the session's variables are kept.",
                    backend=self.backend,
                    duration_ms=elapsed_ms(),
                    stdout=outcome.stdout,
                    stderr=outcome.stderr,
                )
            logger.warning("%s sandbox ignored the interrupt for %g s; killing it", self.backend, grace)
            await self.close()
            return ExecutionResult.failure(
                "Timeout",
                f"Execution timed out after {timeout:g} s and did not stop when interrupted, "
                "so its sandbox was killed; the session's state is lost and its next call starts fresh.",
                backend=self.backend,
                duration_ms=elapsed_ms(),
                session_lost=True,
            )
        except SandboxDied as died:
            await self.close()
            return ExecutionResult.failure(
                died.error_type, str(died), backend=self.backend, duration_ms=elapsed_ms(), session_lost=True
            )
        except anyio.get_cancelled_exc_class():
            # The caller went away mid-run: the sandbox is in an unknown state, so it goes.
            with anyio.CancelScope(shield=True):
                await self.close()
            raise

    def _take_artifacts(self, result: ExecutionResult, outcome: GuestOutcome, limits: OutputLimits) -> None:
        """Move figures and output files from the guest's report into `result`, within the caps
        (the guest applies them too; this is where they hold, whatever it sent)."""
        budget = limits.max_bytes
        notes = [note[:500] for note in outcome.notes[:10]]
        for encoded in outcome.figures[: limits.max_figures]:
            image = decode_base64(encoded)
            if image is None or len(image) > budget:
                notes.append("a figure was left out: over MCP_SANDBOX_MAX_OUTPUT_MB in all")
                continue
            result.artifacts.figures.append(image)
            budget -= len(image)
        if len(outcome.figures) > limits.max_figures:
            notes.append(
                f"{len(outcome.figures) - limits.max_figures} figures over MCP_SANDBOX_MAX_FIGURES left out"
            )
        listed: list[OutputFile] = []
        for file in outcome.files[: limits.max_files]:
            path = safe_output_path(file.path)
            data = self._output_file_bytes(file, path) if path is not None else None
            if path is None or data is None:
                notes.append(f"output/{file.path[:200]} could not be read back")
                continue
            if len(data) > budget:
                notes.append(
                    f"output/{path} ({len(data):,} bytes) left out: over MCP_SANDBOX_MAX_OUTPUT_MB in all"
                )
                continue
            budget -= len(data)
            result.artifacts.files[path] = data
            listed.append(OutputFile(name=path, size=len(data), mime_type=mime_type(path)))
        if len(outcome.files) > limits.max_files:
            notes.append(
                f"{len(outcome.files) - limits.max_files} files over MCP_SANDBOX_MAX_OUTPUT_FILES left out"
            )
        result.files, result.figures, result.notes = listed, len(result.artifacts.figures), notes


class Backend(ABC):
    """Makes ready-to-use executors of one kind."""

    name: ClassVar[str]

    async def prepare(self) -> None:  # noqa: B027 - an optional hook, not every backend has set-up
        """One-time set-up before the first `start` (fetching a runtime, say)."""

    @abstractmethod
    async def start(self) -> Executor:
        """A new sandbox, started and ready to run code. Raises SandboxStartError."""

    @abstractmethod
    def describe(self) -> str:
        """One sentence for the tool description: what the sandbox is and what it allows."""
