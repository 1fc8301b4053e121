"""One call: its program and what it runs under, its progress reported while it waits and runs,
and its run in the sandbox it is given."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.progress import ProgressRelay
from mcp_sandbox.result import ExecutionResult


@dataclass(frozen=True)
class Call:
    """One call's program and what it runs under: its timeout, the event that stops it (its
    caller went away), and whom to tell its progress."""

    code: str
    timeout: float
    stop: anyio.Event
    relay: ProgressRelay | None

    def waiting(self, what: str) -> None:
        if self.relay is not None:
            self.relay.waiting(what)

    async def run_in(self, executor: Executor, metrics: Metrics) -> ExecutionResult:
        """Run the program in `executor`; a sandbox it lost is counted in `metrics`."""
        if self.relay is not None:
            self.relay.running()
        on_output = self.relay.push if self.relay is not None else None
        result = await executor.run(self.code, self.timeout, self.stop, on_output=on_output)
        metrics.count_lost(result)
        return result


@asynccontextmanager
async def reporting(call: Call) -> AsyncIterator[None]:
    """The call's progress reported while it waits and runs, when its caller asked for it."""
    if call.relay is None:
        yield
        return
    refused: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(call.relay.report_until_cancelled, call.stop)
        try:
            yield
        except Exception as error:  # noqa: BLE001 - raised below, outside the group, so not wrapped in a group
            refused = error
        finally:
            group.cancel_scope.cancel()
    if refused is not None:
        raise refused
