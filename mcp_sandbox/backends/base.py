"""The executor interface every backend implements, and the timeout policy they share."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from typing import ClassVar

import anyio

from mcp_sandbox.bridge.calls import ToolCalls
from mcp_sandbox.bridge.upstreams import ToolBridge
from mcp_sandbox.result import ExecutionResult, GuestOutcome, SandboxErrorType

logger = logging.getLogger(__name__)


class SandboxDied(Exception):
    """The sandbox process is gone or unusable; its session's state is lost."""

    def __init__(self, message: str, error_type: SandboxErrorType = "SandboxCrash") -> None:
        super().__init__(message)
        self.error_type: SandboxErrorType = error_type


class SandboxStartError(Exception):
    """A new sandbox could not be started (runtime missing, load failure, start timeout)."""


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

    @property
    @abstractmethod
    def alive(self) -> bool:
        """False once the sandbox has died or been closed."""

    @abstractmethod
    async def _submit(self, code: str, max_output_chars: int, tools_manifest: str | None) -> None:
        """Start running `code`, first rebuilding the guest's `tools` from `tools_manifest` when
        it is given; returns at once."""

    @abstractmethod
    async def _await_outcome(self) -> GuestOutcome:
        """Wait for the submitted program to finish. Raises SandboxDied."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Ask the running program to stop (KeyboardInterrupt); returns at once."""

    @abstractmethod
    async def close(self) -> None:
        """Stop the sandbox and free everything it holds. Safe to call twice."""

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        grace: float,
        max_output_chars: int,
        bridge: ToolBridge | None = None,
        max_tool_calls: int = 1000,
    ) -> ExecutionResult:
        async with anyio.create_task_group() as task_group:
            self.tool_calls = ToolCalls(bridge, task_group, max_tool_calls)
            manifest = None
            if bridge is not None and bridge.version != self.tools_version:
                manifest, self.tools_version = bridge.manifest_json, bridge.version
            try:
                result = await self._run(code, timeout, grace, max_output_chars, manifest)
            finally:
                # Bridged calls still pending when the execution ends are cancelled and answered.
                self.tool_calls.cancel_all()
        return result

    async def _run(
        self, code: str, timeout: float, grace: float, max_output_chars: int, manifest: str | None
    ) -> ExecutionResult:
        started = time.perf_counter()

        def elapsed_ms() -> int:
            return int((time.perf_counter() - started) * 1000)

        def finished(outcome: GuestOutcome) -> ExecutionResult:
            return ExecutionResult(**outcome.model_dump(), backend=self.backend, duration_ms=elapsed_ms())

        try:
            await self._submit(code, max_output_chars, manifest)
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
