"""The Python API (`mcp_sandbox.Sandbox`): the same sandbox and result model, without MCP."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox import ExecutionResult, Sandbox
from mcp_sandbox.errors import InvalidRequest
from tests.helpers import in_memory


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


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ({"code": "x = 1 + 2 + 3 + 4"}, "code is 17 characters long; the limit is 10"),
        ({"code": "1", "session_id": "bad id"}, "session_id 'bad id': use 1-128 of"),
        ({"code": "1", "timeout": -1.5}, "timeout must be a positive number of seconds, not -1.5"),
    ],
)
async def test_every_adapter_refuses_bad_input_with_the_same_error(
    anyio_backend: str, arguments: dict[str, Any], complaint: str
) -> None:
    """The App checks every call, so the Python API, the MCP tool and the command line agree."""
    async with Sandbox(backend="subprocess", pool_size=0, max_code_chars=10) as sandbox:
        with pytest.raises(InvalidRequest) as raised:
            await sandbox.run(**arguments)
    assert complaint in str(raised.value)
    async with in_memory(backend="subprocess", pool_size=0, max_code_chars=10) as client:
        response = await client.call_tool("execute_python", arguments)
    # The SDK puts its own prefix before a tool's error; the message itself is the App's.
    expected = f"Error executing tool execute_python: {raised.value}"
    assert response.is_error and response.content[0].text == expected  # type: ignore[union-attr]
    if set(arguments) == {"code"}:
        command = [sys.executable, "-m", "mcp_sandbox", "run", "--backend", "subprocess"]
        with anyio.fail_after(60):
            done = await anyio.run_process(
                [*command, "--max-code-chars", "10", "-"], input=arguments["code"].encode(), check=False
            )
        assert (done.returncode, done.stderr.decode()) == (2, f"mcp-sandbox: {raised.value}\n")


async def test_an_interrupt_that_arrives_before_the_run_starts_still_stops_it(
    anyio_backend: str, tmp_path: Path
) -> None:
    """A run can start only after its deadline passed (here behind a large data/ refresh); the
    interrupt sent at the deadline must still stop it, keeping the session, not kill the sandbox."""
    async with Sandbox(backend="pyodide", pool_size=0, data_dir=tmp_path, interrupt_grace=5) as sandbox:
        assert (await sandbox.run("kept = 7", session_id="s")).success
        (tmp_path / "big.bin").write_bytes(bytes(64 * 1024 * 1024))
        slow = await sandbox.run("while True: pass", session_id="s", timeout=0.01)
        assert slow.error_type == "Timeout"
        assert "was interrupted" in (slow.error or ""), slow.error
        assert (await sandbox.run("kept", session_id="s")).result == "7"
