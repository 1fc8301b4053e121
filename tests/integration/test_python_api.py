"""The Python API (`mcp_sandbox.Sandbox`): the same sandbox and result model, without MCP."""

from __future__ import annotations

import pytest

from mcp_sandbox import ExecutionResult, Sandbox


@pytest.mark.parametrize("backend", ["pyodide", "subprocess", "inprocess"])
async def test_sessions_errors_and_timeouts(anyio_backend: str, backend: str) -> None:
    async with Sandbox(backend=backend, pool_size=1, interrupt_grace=1) as sandbox:
        assert sandbox.backend == backend
        first = await sandbox.run("x = 21 * 2\nprint('hi')\nx", session_id="s")
        assert isinstance(first, ExecutionResult)
        assert (first.success, first.stdout, first.result, first.session_id) == (True, "hi\n", "42", "s")
        assert (await sandbox.run("x + 1", session_id="s")).result == "43"
        assert (await sandbox.run("x", session_id="other")).error_type == "NameError"
        failed = await sandbox.run("1 / 0")
        assert (failed.success, failed.error_type) == (False, "ZeroDivisionError")
        slow = await sandbox.run("while True: pass", timeout=1)
        assert slow.error_type == "Timeout"
        assert await sandbox.reset("s") is True
        assert (await sandbox.run("x", session_id="s")).error_type == "NameError"


async def test_bad_arguments_raise_clearly(anyio_backend: str) -> None:
    async with Sandbox(backend="subprocess", pool_size=0) as sandbox:
        with pytest.raises(ValueError, match="session_id"):
            await sandbox.run("1", session_id="..")
        with pytest.raises(ValueError, match="timeout"):
            await sandbox.run("1", timeout=0)


async def test_used_outside_async_with(anyio_backend: str) -> None:
    with pytest.raises(RuntimeError, match="async with"):
        await Sandbox(backend="subprocess").run("1")
