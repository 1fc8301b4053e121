"""A backend made in the test suite only, through one registry entry: its executor answers every
program with the program's length, so a call shows which backend ran it."""

from __future__ import annotations

from typing import ClassVar

import anyio
import anyio.abc

from mcp_sandbox.backends.base import Backend, Executor, ExecutorHooks, ExecutorLimits
from mcp_sandbox.backends.registry import Entry
from mcp_sandbox.protocol import GuestOutcome
from mcp_sandbox.settings import Settings
from tests.unit.fakes import outcome


class LengthExecutor(Executor):
    backend: ClassVar[str] = "length"

    def __init__(self, limits: ExecutorLimits, hooks: ExecutorHooks) -> None:
        super().__init__(limits, hooks)
        self._code: str | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return not self._closed

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        self._code = code

    async def _await_outcome(self) -> GuestOutcome:
        assert self._code is not None
        return outcome(result=str(len(self._code)))

    async def interrupt(self) -> None:
        pass

    async def close(self) -> None:
        self._closed = True


class LengthBackend(Backend):
    name: ClassVar[str] = "length"

    async def start(self, principal: str | None = None) -> Executor:
        return LengthExecutor(self._limits, self._hooks)

    def summary(self) -> str:
        return "A test backend: every program's result is its length."


async def prepare(settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> Backend:
    backend = LengthBackend(settings, hooks)
    await backend.prepare()
    return backend


ENTRY = Entry(
    "length",
    "a test backend: every program's result is its length",
    prepare,
    "nothing to fix: it is a test's",
    isolated=False,
)
