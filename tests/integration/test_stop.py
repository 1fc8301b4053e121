"""A stop (the client cancels a call: what a person's stop button sends) through a real MCP client
over stdio: the program is interrupted as at a timeout, and the session keeps its variables and its
sandbox process."""

from __future__ import annotations

import uuid

import anyio
import pytest
from mcp import Client

from mcp_sandbox import Sandbox
from tests.helpers import call, pid_with_environ, process_tree, server_params, still_running

pytestmark = pytest.mark.anyio

LONG_LOOPS = {
    "busy": "while True:\n    x = x",
    "sleeping": "import time\ntime.sleep(60)",
}


#: What a sandbox process's command line holds: Deno's runner, or the CPython worker.
SANDBOX = b"mcp_sandbox"


async def sandboxes_settled(server: int, count: int) -> dict[int, bytes]:
    """The processes under the server once it runs `count` sandboxes (the pool refilled)."""
    with anyio.fail_after(60):
        while True:
            tree = process_tree(server)
            sandboxes = [pid for pid, command in tree.items() if pid != server and SANDBOX in command]
            if len(sandboxes) >= count:
                return tree
            await anyio.sleep(0.1)


@pytest.mark.parametrize("backend", ["pyodide", "subprocess"])
async def test_a_cancelled_call_keeps_the_session_and_its_sandbox(backend: str) -> None:
    marker = f"MCP_SANDBOX_TEST_MARKER={uuid.uuid4().hex}"
    name, value = marker.split("=")
    # A process per sandbox, so the processes counted are the sandboxes.
    params = server_params(
        MCP_SANDBOX_BACKEND=backend,
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_SANDBOXES_PER_PROCESS="1",
        **{name: value},
    )
    async with Client(params) as client:
        assert (await call(client, "x = 41", session_id="s"))["success"] is True
        server = pid_with_environ(marker)
        assert server is not None
        before = await sandboxes_settled(server, 2)  # the session's and the pool's
        for loop, code in LONG_LOOPS.items():
            with anyio.move_on_after(1) as waited:
                await client.call_tool("execute_python", {"code": code, "session_id": "s"})
            assert waited.cancelled_caught, f"the {loop} loop was still running when the client cancelled it"
            with anyio.fail_after(30):
                after = await call(client, "x + 1", session_id="s")
            assert after["result"] == "42", (loop, after)
            assert after["session_restored"] is False and after["session_lost"] is False, (loop, after)
            assert not after["notes"], (loop, after)
            assert still_running(before) == before, f"no sandbox process was lost ({loop})"
            assert process_tree(server).keys() == before.keys(), f"and none was started ({loop})"


async def test_a_cancelled_task_stops_its_program_in_process_and_keeps_the_session() -> None:
    """The Python API on the in-process backend: cancelling the task of a run interrupts its program
    (between bytecodes; a C call that never returns cannot be), the run still returns its result,
    which says Cancelled, the session keeps its variables, and the call is counted as cancelled."""
    async with Sandbox(backend="inprocess", pool_size=1, interrupt_grace=1) as sandbox:
        await sandbox.run("x = 41", session_id="s")
        with anyio.move_on_after(1):
            stopped = await sandbox.run(LONG_LOOPS["busy"], session_id="s")
        assert stopped.error_type == "Cancelled", "a result after a cancel says so"
        assert stopped.error is not None and "the session's variables are kept" in stopped.error
        after = await sandbox.run("x + 1", session_id="s")
        assert (after.result, after.session_lost, after.session_restored) == ("42", False, False), after
        counted = sandbox._started().metrics.exposition().decode()
        assert 'mcp_sandbox_calls_total{backend="inprocess",outcome="cancelled"} 1.0' in counted, counted


async def test_a_cancelled_call_without_a_session_gives_its_sandbox_back_to_be_recycled() -> None:
    marker = uuid.uuid4().hex
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_POOL_SIZE="1", MCP_SANDBOX_TEST_MARKER=marker
    )
    async with Client(params) as client:
        assert (await call(client, "1 + 1"))["result"] == "2"
        server = pid_with_environ(marker)
        assert server is not None
        before = await sandboxes_settled(server, 1)
        with anyio.move_on_after(1) as waited:
            await client.call_tool("execute_python", {"code": LONG_LOOPS["busy"].replace("x = x", "pass")})
        assert waited.cancelled_caught
        with anyio.fail_after(30):
            assert (await call(client, "2 + 2"))["result"] == "4"
        # The next call may start another while the first is being recycled; the first lives on.
        assert still_running(before) == before, "the cancelled call's sandbox was recycled, not closed"
