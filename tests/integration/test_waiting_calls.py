"""Calls that wait: they say what they wait for while they do, and a call that waits past its
bound for a sandbox is refused with when to retry, never left to the client's timeout. A real
server process and a real MCP client."""

from __future__ import annotations

import functools
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.helpers import server_params

pytestmark = pytest.mark.anyio


async def test_a_call_behind_its_sessions_running_call_says_so() -> None:
    first_runs = anyio.Event()
    waiting: list[str] = []

    async def on_first(progress: float, total: float | None, message: str | None) -> None:
        if (message or "").startswith("running for"):
            first_runs.set()

    async def on_second(progress: float, total: float | None, message: str | None) -> None:
        waiting.append(message or "")

    done: dict[str, Any] = {}
    async with Client(server_params(MCP_SANDBOX_BACKEND="subprocess")) as client:
        async with anyio.create_task_group() as group:
            first = {"code": "import time\ntime.sleep(6)\n'first'", "session_id": "busy"}
            group.start_soon(
                functools.partial(client.call_tool, "execute_python", first, progress_callback=on_first)
            )
            with anyio.fail_after(60):
                await first_runs.wait()
            second = {"code": "'second'", "session_id": "busy"}
            answer = await client.call_tool("execute_python", second, progress_callback=on_second)
            done.update(answer.structured_content or {})
    assert done["result"] == "'second'", done
    assert waiting, "no progress while it waited about 5 s"
    assert waiting[0].startswith("waiting for the session's running call to end ("), waiting


async def test_a_call_that_waits_past_its_bound_for_a_sandbox_is_refused_saying_when_to_retry() -> None:
    # No sandbox kept ready, and a bound far below a Pyodide sandbox's start (hundreds of ms).
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_POOL_SIZE="0", MCP_SANDBOX_ACQUIRE_TIMEOUT="0.05"
    )
    async with Client(params) as client:
        refused = await client.call_tool("execute_python", {"code": "1"})
    text = "".join(getattr(block, "text", "") for block in refused.content)
    assert refused.is_error, text
    assert "the server is busy: no sandbox became free within 0.05 s" in text, text
    assert "retry in about 0.05 s" in text, text
