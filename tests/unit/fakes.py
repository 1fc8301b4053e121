"""A scriptable in-memory executor, for unit tests of the policy code around executors."""

from __future__ import annotations

from typing import Any, ClassVar

import anyio

from mcp_sandbox.backends.base import Executor, ExecutorHooks, ExecutorLimits, SandboxDied
from mcp_sandbox.protocol import GuestOutcome

#: Quick to kill after an ignored interrupt, as the unit tests want.
FAKE_LIMITS = ExecutorLimits(
    {
        "max_output_chars": 1000,
        "max_kept_output_chars": 0,
        "output": {"max_files": 0, "max_bytes": 0, "max_figures": 0},
    },
    grace=0.05,
    max_tool_calls=10,
)


def outcome(**fields: Any) -> GuestOutcome:
    """A guest outcome with every field the protocol requires, `fields` overriding."""
    base: dict[str, Any] = {
        "success": True,
        "stdout": "",
        "stderr": "",
        "result": None,
        "error_type": None,
        "error": None,
        "truncated": False,
    }
    return GuestOutcome(**{**base, **fields})  # type: ignore[typeddict-item]


class FakeExecutor(Executor):
    """Runs nothing. Code "hang" runs until interrupted (or forever if `stubborn`);
    code "die" kills the sandbox; anything else succeeds with the code as its result."""

    backend: ClassVar[str] = "fake"
    started = 0

    def __init__(self, *, stubborn: bool = False) -> None:
        super().__init__(FAKE_LIMITS, ExecutorHooks(tools=None))
        FakeExecutor.started += 1
        self.number = FakeExecutor.started
        self.stubborn = stubborn
        self.closed = False
        self.interrupted = anyio.Event()
        self._code = ""

    @property
    def alive(self) -> bool:
        return not self.closed

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        self._code = code

    async def _await_outcome(self) -> GuestOutcome:
        if self._code == "die":
            raise SandboxDied("the fake sandbox died")
        if self._code == "hang":
            await self.interrupted.wait()
            if self.stubborn:
                await anyio.sleep_forever()
            return outcome(success=False, error_type="KeyboardInterrupt", stdout="partial")
        return outcome(result=self._code)

    async def interrupt(self) -> None:
        self.interrupted.set()

    async def close(self) -> None:
        self.closed = True


class KillableExecutor(FakeExecutor):
    """A FakeExecutor that can `kill` (as pyodide's kill flag does): a stubborn "hang" then ends
    in a renewed death, unless `kill_works` is False; "crash" dies renewed; `renew` succeeds
    unless `renews` is False."""

    can_kill = True

    def __init__(self, *, stubborn: bool = False, kill_works: bool = True, renews: bool = True) -> None:
        super().__init__(stubborn=stubborn)
        self.kill_works, self.renews = kill_works, renews
        self.killed = anyio.Event()
        self.renewed = 0

    async def _await_outcome(self) -> GuestOutcome:
        if self._code == "crash":
            raise SandboxDied("the fake worker crashed", renewed=True)
        if self._code == "hang" and self.stubborn and self.kill_works:
            await self.killed.wait()
            raise SandboxDied("killed", renewed=True)
        return await super()._await_outcome()

    async def kill(self) -> None:
        self.killed.set()

    async def renew(self, died: SandboxDied) -> bool:
        self.renewed += 1
        return self.renews
