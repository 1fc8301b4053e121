"""Where a Pyodide sandbox's start goes (pyodide): its ready message names each step of its load
in order, with its milliseconds, and the debug log says them. Real Deno runner, real Pyodide, no
MCP: the backend is driven directly."""

from __future__ import annotations

import logging
import re

import anyio
import pytest

from mcp_sandbox.backends.base import ExecutorHooks
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings

pytestmark = pytest.mark.anyio

STEPS = [
    "snapshot read",
    "pyodide.asm.js",
    "Pyodide",
    "guest runtime",
    "first rounds",
    "preload",
    "clean point",
]


async def test_the_debug_log_says_each_step_of_a_sandboxs_start(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        executor = await backend.start()
        try:
            result = await executor.run("6 * 7", 60)
            assert result.result == "42", result
        finally:
            await executor.close()
            task_group.cancel_scope.cancel()
    said = [record.getMessage() for record in caplog.records if " ready in " in record.getMessage()]
    assert said, "no debug line said the sandbox was ready"
    found = re.fullmatch(r"pyodide sandbox \d+ ready in (\d+) ms \((.*)\)", said[0])
    assert found is not None, said[0]
    steps = [part.rsplit(" ", 1) for part in found[2].split(", ")]
    assert [name for name, _ in steps] == STEPS, said[0]
    # Whole milliseconds each, rounded: their sum is the load's, give or take a millisecond a step.
    assert abs(sum(int(ms) for _, ms in steps) - int(found[1])) <= len(STEPS), said[0]
