"""The real in-process executor, without the MCP layer: threads, routing, interrupts."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.backends.base import ExecutorHooks, ExecutorLimits
from mcp_sandbox.backends.inprocess import InProcessExecutor
from mcp_sandbox.result import ExecutionResult

pytestmark = pytest.mark.anyio

LIMITS = ExecutorLimits(
    {
        "max_output_chars": 10_000,
        "max_kept_output_chars": 0,
        "output": {"max_files": 0, "max_bytes": 0, "max_figures": 0},
    },
    grace=0.5,
    max_tool_calls=10,
)


def new_executor(name: str) -> InProcessExecutor:
    return InProcessExecutor(LIMITS, ExecutorHooks(tools=None), name, Path.cwd())


async def run(executor: InProcessExecutor, code: str, timeout: float = 5) -> ExecutionResult:
    return await executor.run(code, timeout)


@pytest.fixture
async def executor() -> AsyncIterator[InProcessExecutor]:
    executor = new_executor("test-session")
    yield executor


async def test_state_persists_and_output_is_captured(executor: InProcessExecutor) -> None:
    await run(executor, "total = 40")
    result = await run(executor, "import sys\nprint('out')\nprint('err', file=sys.stderr)\ntotal + 2")
    assert (result.stdout, result.stderr, result.result) == ("out\n", "err\n", "42")


async def test_concurrent_sessions_do_not_mix_output() -> None:
    first, second = new_executor("a"), new_executor("b")
    loop = "for i in range(2000):\n    print('{}')"
    results: dict[str, ExecutionResult] = {}

    async def go(name: str, executor: InProcessExecutor) -> None:
        results[name] = await run(executor, loop.format(name))

    async with anyio.create_task_group() as group:
        group.start_soon(go, "a", first)
        group.start_soon(go, "b", second)
    assert results["a"].stdout == "a\n" * 2000
    assert results["b"].stdout == "b\n" * 2000
    await first.close()
    await second.close()


async def test_other_threads_keep_the_real_stdout(
    executor: InProcessExecutor, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = threading.Thread(target=lambda: (time.sleep(0.2), print("outside")))
    outside.start()
    result = await run(executor, "import time\ntime.sleep(0.5)\nprint('inside')")
    outside.join()
    assert result.stdout == "inside\n"
    assert capsys.readouterr().out == "outside\n"


async def test_input_reads_end_of_file(executor: InProcessExecutor) -> None:
    assert (await run(executor, "input('name? ')")).error_type == "EOFError"


async def test_busy_loop_is_interrupted_and_the_session_kept(executor: InProcessExecutor) -> None:
    await run(executor, "kept = 'yes'")
    result = await run(executor, "while True:\n    pass", timeout=0.5)
    assert result.error_type == "Timeout" and not result.session_lost
    assert executor.alive
    assert (await run(executor, "kept")).result == "'yes'"


async def test_an_awaiting_program_is_interrupted_and_does_not_resume_later(
    executor: InProcessExecutor,
) -> None:
    code = "import asyncio\nawait asyncio.sleep(1)\nresumed = True"
    result = await run(executor, code, timeout=0.3)
    assert result.error_type == "Timeout" and not result.session_lost
    await anyio.sleep(1.2)
    assert (await run(executor, "'resumed' in globals()")).result == "False"


async def test_a_thread_that_cannot_be_stopped_is_discarded_and_logged(
    executor: InProcessExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        result = await run(executor, "import time\ntime.sleep(3)", timeout=0.3)
    assert result.error_type == "Timeout" and result.session_lost
    assert time.monotonic() - started < 2.5, "the call returns at deadline + grace, not when the code ends"
    assert not executor.alive
    assert "still running when its session was discarded" in caplog.text


async def test_output_lines_go_to_the_run_that_printed_them(executor: InProcessExecutor) -> None:
    heard: list[str] = []
    code = "import time\nfor i in range(3):\n    print(f'step {i}')\n    time.sleep(0.6)"
    await executor.run(code, 10, on_output=heard.append)
    assert heard and all(line.startswith("step ") for line in heard)
    later = await executor.run("print('unwatched')", 5)
    assert later.stdout == "unwatched\n" and all(line.startswith("step ") for line in heard)
