"""Where the Pyodide worker's SIGINT handler sends an interrupt, in this interpreter: the
program's code raises KeyboardInterrupt; the event loop's own callback code cancels the run's
tasks instead, since a KeyboardInterrupt raised there would escape into JavaScript."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest

from mcp_sandbox.guest import interpreter


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A current event loop that is not running, as the worker's is between callbacks."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield loop
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        asyncio.set_event_loop(None)
        loop.close()


def loop_callback(module: str) -> Callable[[Callable[[int, Any], None]], None]:
    """A `run_handle` defined in `module`, which calls the handler from its own frame."""
    namespace: dict[str, Any] = {"__name__": module, "sys": sys, "signal": signal}
    exec("def run_handle(handler):\n    handler(signal.SIGINT, sys._getframe())\n", namespace)
    run_handle: Callable[[Callable[[int, Any], None]], None] = namespace["run_handle"]
    return run_handle


async def forever() -> None:
    await asyncio.Event().wait()


def test_the_programs_own_code_gets_keyboard_interrupt(loop: asyncio.AbstractEventLoop) -> None:
    interpreter.note_tasks()
    with pytest.raises(KeyboardInterrupt):
        interpreter.on_interrupt(signal.SIGINT, sys._getframe())


def test_the_event_loops_callback_cancels_the_runs_tasks(loop: asyncio.AbstractEventLoop) -> None:
    earlier = loop.create_task(forever())
    interpreter.note_tasks()
    program = loop.create_task(forever())
    loop_callback("pyodide.webloop")(interpreter.on_interrupt)  # does not raise
    assert program.cancelling() and not earlier.cancelling()


def test_a_callback_elsewhere_is_the_programs_own(loop: asyncio.AbstractEventLoop) -> None:
    interpreter.note_tasks()
    loop.create_task(forever())
    with pytest.raises(KeyboardInterrupt):
        loop_callback("program")(interpreter.on_interrupt)


def test_before_the_program_begins_it_waits_for_the_program(loop: asyncio.AbstractEventLoop) -> None:
    # It lands in the loop while the run still loads packages: no task of the run exists yet.
    interpreter.note_tasks()
    loop_callback("pyodide.webloop")(interpreter.on_interrupt)
    with pytest.raises(KeyboardInterrupt):
        interpreter.run_json(cast(interpreter.Interpreter, None), "x = 1")
    # Taken once, and a later run never sees it.
    loop_callback("pyodide.webloop")(interpreter.on_interrupt)
    interpreter.note_tasks()
    assert interpreter._interrupt_waiting is False
