"""A restored session's memory stays its own (pyodide): nothing the sandbox it is restored into did
before gives a reference back in it afterwards.

Pyodide frees a Python object's reference from a JavaScript proxy when V8's garbage collector finds
the proxy gone. A worker lets go of some proxies while it starts (the guest runtime's module,
`sys`); their finalizers used to stay registered past the clean point and run at whatever collection
came next. A session checkpointed after one such collection in its own sandbox, then restored into a
sandbox that had not had one yet, lost one reference of each of those objects, the guest runtime's
module among them: freed while `sys.modules` still held it, its memory reused, and the session
failed later with errors such as `SystemError: Type does not define the tp_name field` (seen in
test_dspy.py's restore test, on a loaded machine). Real Deno runner, real Pyodide, no MCP: the
backend's executors are driven directly, and each collection is set off from the session by
allocating JavaScript memory (no V8 flags).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from mcp_sandbox.backends.base import Backend, Executor, ExecutorHooks
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings

pytestmark = pytest.mark.anyio

SESSION = "class A:\n    pass\nobjs = [A() for _ in range(1000)]\nstate = 42\n"
#: Enough JavaScript garbage to set off full collections; their finalizers run right after the run.
COLLECT = (
    "def _collect():\n"
    "    import js\n"
    "    for _ in range(48):\n"
    "        js.ArrayBuffer.new(8 << 20)\n"
    "_collect()\n"
    "del _collect\n"
)
#: The guest runtime's module, held by sys.modules and by the session: its reference count.
REFERENCES = (
    "import sys\n"
    "guest = sys.modules['mcp_sandbox.guest']\n"
    "assert type(guest).__name__ == 'module', type(guest)\n"
    "sys.getrefcount(guest)\n"
)
#: The session lets go of the module: one reference too few, and sys.modules holds freed memory.
LET_GO = (
    "del guest\n"
    "class D:\n    pass\n"
    "ds = [D() for _ in range(1000)]\n"
    "import sys\n"
    "module = sys.modules['mcp_sandbox.guest']\n"
    "(type(module).__name__, module.__name__, module.Interpreter.__name__, state, type(objs[0]).__name__)\n"
)


@asynccontextmanager
async def pyodide() -> AsyncIterator[Backend]:
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(Settings(backend="pyodide"), ExecutorHooks(tools=None), task_group)
        yield backend
        task_group.cancel_scope.cancel()


async def ran(executor: Executor, code: str) -> ExecutionResult:
    result = await executor.run(code, 60)
    assert result.success, result.error
    return result


async def test_a_restored_session_keeps_every_reference_after_collections() -> None:
    async with pyodide() as backend:
        source = await backend.start()
        target = None
        try:
            await ran(source, SESSION)
            await ran(source, COLLECT)
            await anyio.sleep(0.2)  # the finalizers run between tasks
            before = (await ran(source, REFERENCES)).result
            checkpoint = await source.checkpoint()
            assert not hasattr(checkpoint, "reason"), checkpoint

            # A new sandbox: its start's finalizers have not run yet (a collection would run them).
            target = await backend.start()
            assert await target.restore(checkpoint.payload) is None
            await ran(target, COLLECT)
            await anyio.sleep(0.2)
            assert (await ran(target, REFERENCES)).result == before
            # A checkpoint taken in the restored sandbox changes nothing either.
            assert not hasattr(await target.checkpoint(), "reason")
            held = (await ran(target, LET_GO)).result
            assert held == "('module', 'mcp_sandbox.guest', 'Interpreter', 42, 'A')"
        finally:
            await source.close()
            if target is not None:
                await target.close()
