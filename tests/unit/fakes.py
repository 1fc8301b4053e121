"""A scriptable in-memory executor, for unit tests of the policy code around executors."""

from __future__ import annotations

from typing import ClassVar

import anyio

from mcp_sandbox.backends.base import Executor, RunRequest, SandboxDied
from mcp_sandbox.result import GuestOutcome


class FakeExecutor(Executor):
    """Runs nothing. Code "hang" runs until interrupted (or forever if `stubborn`);
    code "die" kills the sandbox; anything else succeeds with the code as its result."""

    backend: ClassVar[str] = "fake"
    started = 0

    def __init__(self, *, stubborn: bool = False) -> None:
        FakeExecutor.started += 1
        self.number = FakeExecutor.started
        self.stubborn = stubborn
        self.closed = False
        self.interrupted = anyio.Event()
        self._code = ""

    @property
    def alive(self) -> bool:
        return not self.closed

    async def _submit(self, request: RunRequest) -> None:
        self._code = request.code

    async def _await_outcome(self) -> GuestOutcome:
        if self._code == "die":
            raise SandboxDied("the fake sandbox died")
        if self._code == "hang":
            await self.interrupted.wait()
            if self.stubborn:
                await anyio.sleep_forever()
            return GuestOutcome(success=False, error_type="KeyboardInterrupt", stdout="partial")
        return GuestOutcome(success=True, result=self._code)

    async def interrupt(self) -> None:
        self.interrupted.set()

    async def close(self) -> None:
        self.closed = True
