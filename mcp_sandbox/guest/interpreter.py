"""The Python state of one sandbox (its globals, its cell counter, its `tools`), and the runs a
runner asks of it: a program, a JIT warm-up, the cancellation of an interrupted await."""

from __future__ import annotations

import builtins
import linecache
import sys
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager

# Bound at import, so a program that patches json cannot break reporting.
from json import dumps, loads
from typing import Any, ClassVar

from mcp_sandbox.guest.artifacts import collect_figures, collect_files, scan_output
from mcp_sandbox.guest.capture import NO_INPUT, CappedText
from mcp_sandbox.guest.program import CELL_PREFIX, Program, outcome_of
from mcp_sandbox.guest.tables import Display
from mcp_sandbox.guest.tools import ToolChannel, ToolError, Tools, build_tools
from mcp_sandbox.protocol import GuestLimits, GuestOutcome, OutputLimits


class Interpreter:
    """The state of one sandbox's Python: its globals, its cell counter, its `tools`."""

    #: output/ belongs to this interpreter alone (a sandbox process), so the scan after one run
    #: serves as the scan before the next; False where interpreters share a working directory.
    private_output: ClassVar[bool] = True

    def __init__(self, limits: GuestLimits, channel: ToolChannel | None = None, inline_files: bool = False):
        """``inline_files``: the host cannot read the sandbox's files (Pyodide), so output files
        travel in the outcome."""
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.namespace["tools"] = Tools({})
        self.namespace["ToolError"] = ToolError
        self.display = Display()
        self.namespace["display"] = self.display
        self.cells = 0
        self.limits = limits
        self.channel = channel
        self.inline_files = inline_files
        #: output/ as the last run left it; valid only where nothing else writes there between runs.
        self._output_after: dict[str, tuple[int, int]] | None = None

    def install_tools(self, manifest_json: str) -> None:
        """Give the interpreter's `tools` the upstream tools listed in ``manifest_json``."""
        self.namespace["tools"] = build_tools(loads(manifest_json), self.channel)

    def run(self, code: str) -> GuestOutcome | Coroutine[Any, Any, GuestOutcome]:
        """Run ``code``; the outcome, with the figures the program left open and the files it
        wrote to output/, or a coroutine for it when the code awaits."""
        before = self._output_after if self.private_output else None
        if before is None:
            before = scan_output()
        outcome = self._run(code)
        if isinstance(outcome, dict):
            return self._with_artifacts(outcome, before)
        return self._with_artifacts_async(outcome, before)

    async def _with_artifacts_async(
        self, pending: Coroutine[Any, Any, GuestOutcome], before: dict[str, tuple[int, int]]
    ) -> GuestOutcome:
        return self._with_artifacts(await pending, before)

    def _with_artifacts(self, outcome: GuestOutcome, before: dict[str, tuple[int, int]]) -> GuestOutcome:
        output: OutputLimits = self.limits["output"]
        budget = output["max_bytes"]
        notes: list[str] = []
        figures, budget = collect_figures(output["max_figures"], budget, notes)
        self._output_after = after = scan_output()
        files = collect_files(before, after, output["max_files"], budget, self.inline_files, notes)
        outcome["figures"], outcome["files"], outcome["notes"] = figures, files, notes
        if tables := self.display.take(notes):
            outcome["tables"] = tables
        return outcome

    def adopt(self, variables: dict[str, Any], cells: int) -> None:
        """Take a checkpoint's variables and cell count into this fresh interpreter."""
        self.namespace.update(variables)
        self.cells = cells
        self._output_after = None  # the restored working directory is scanned afresh

    def _run(self, code: str) -> GuestOutcome | Coroutine[Any, Any, GuestOutcome]:
        self.cells += 1
        report = self.channel.progress if self.channel is not None else None
        max_output_chars, keep = self.limits["max_output_chars"], self.limits["max_kept_output_chars"]
        stdout = CappedText(max_output_chars, report, keep)
        stderr = CappedText(max_output_chars, report, keep)
        self.display.begin(stdout)
        try:
            program = Program(code, f"{CELL_PREFIX}{self.cells}>")
        except BaseException as error:  # noqa: BLE001 - a SyntaxError is the caller's outcome
            return outcome_of(stdout, stderr, max_output_chars, error=error)
        if program.is_async:
            return self._run_async(program, stdout, stderr, max_output_chars)
        try:
            with self.capturing(stdout, stderr):
                value = program.run(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return outcome_of(stdout, stderr, max_output_chars, error=_as_interrupt(error))
        self.display.show(value, "value")
        return outcome_of(stdout, stderr, max_output_chars, value=value)

    async def _run_async(
        self, program: Program, stdout: CappedText, stderr: CappedText, max_output_chars: int
    ) -> GuestOutcome:
        try:
            with self.capturing(stdout, stderr):
                value = await program.run_async(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return outcome_of(stdout, stderr, max_output_chars, error=_as_interrupt(error))
        self.display.show(value, "value")
        return outcome_of(stdout, stderr, max_output_chars, value=value)

    @contextmanager
    def capturing(self, stdout: CappedText, stderr: CappedText) -> Iterator[None]:
        """Send the program's sys.stdout and sys.stderr to the run's streams, and give it a
        sys.stdin with nothing to read.

        A sandbox process has one program at a time, so swapping the sys attributes is enough;
        the in-process executor overrides this to route per thread.
        """
        saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, NO_INPUT
        try:
            yield
        finally:
            sys.stdout, sys.stderr, sys.stdin = saved


#: (Pyodide) This run was interrupted while its program awaited, and its tasks were cancelled.
_interrupted = False


def _as_interrupt(error: BaseException) -> BaseException:
    """A cancellation by `cancel_run` is the run's interrupt, as when the program computes."""
    return KeyboardInterrupt() if _interrupted and type(error).__name__ == "CancelledError" else error


#: (Pyodide) Tasks pending when the run began: earlier runs' work, which its interrupt leaves be.
_earlier_tasks: set[Any] = set()
#: (Pyodide) This run's interrupt landed before its program began (in an earlier run's task, or
#: the event loop's own code): the program starts interrupted.
_interrupt_waiting = False


def _pending_tasks() -> set[Any]:
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return set()  # never imported: no task exists
    return {task for task in asyncio.all_tasks(asyncio.get_event_loop()) if not task.done()}


def note_tasks() -> None:
    """(Pyodide) Before a run: remember the tasks earlier runs left pending."""
    global _earlier_tasks, _interrupt_waiting
    _earlier_tasks = _pending_tasks()
    _interrupt_waiting = False


def on_interrupt(signum: int, frame: Any) -> None:
    """(Pyodide) The SIGINT handler. An interrupt lands in whatever Python runs first: when that is
    a task an earlier run left (a ticker), or the event loop's own code between steps, it cancels
    this run's tasks instead (or, with none yet, waits for the program), and the task or the loop
    runs on; anywhere else it is the program's KeyboardInterrupt, as on CPython."""
    global _interrupt_waiting
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        raise KeyboardInterrupt
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None  # no event loop: the program's own code
    if (task is None and _in_loop_callback(frame)) or (task is not None and task in _earlier_tasks):
        # Raised here it would end an earlier run's task, or escape the loop's callback into
        # JavaScript and end the worker.
        if not cancel_run():
            _interrupt_waiting = True  # before the program began: it starts interrupted
        return
    raise KeyboardInterrupt


def _in_loop_callback(frame: Any) -> bool:
    """Whether `frame` runs under a callback of Pyodide's event loop (the loop's `run_handle`,
    which JavaScript calls), rather than under the program's own code."""
    while frame is not None:
        if frame.f_code.co_name == "run_handle" and frame.f_globals.get("__name__") == "pyodide.webloop":
            return True
        frame = frame.f_back
    return False


def cancel_run() -> bool:
    """(Pyodide) The run was interrupted while its program awaited (a top-level `await`, or
    asyncio.run blocked through stack switching): cancel the tasks it started, so it ends with
    KeyboardInterrupt. False when it had none pending."""
    global _interrupted
    pending = _pending_tasks() - _earlier_tasks
    for task in pending:
        task.cancel()
    _interrupted = _interrupted or bool(pending)
    return bool(pending)


def deliver(channel: ToolChannel, call: int, reply: str) -> None:
    """`channel.deliver`, for runners that must not read a method off a proxy (see worker.ts)."""
    channel.deliver(call, reply)


def run_json(interpreter: Interpreter, code: str, tools_manifest: str | None = None) -> str | Any:
    """A run for runners that speak JSON: the outcome as JSON text, or an awaitable of it."""
    global _interrupted, _interrupt_waiting
    _interrupted = False
    if _interrupt_waiting:
        _interrupt_waiting = False
        raise KeyboardInterrupt  # the runner reports the run interrupted
    if tools_manifest is not None:
        interpreter.install_tools(tools_manifest)
    outcome = interpreter.run(code)
    if isinstance(outcome, dict):
        return dumps(outcome)
    return _dump_when_done(outcome)


async def _dump_when_done(pending: Coroutine[Any, Any, GuestOutcome]) -> str:
    return dumps(await pending)


#: A small program touching what most programs use: the compiler, calls, comprehensions,
#: strings, dicts, printing, repr and JSON (the runtime's own reporting).
WARM_UP_PROGRAM = """
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
rows = [{"n": i, "name": f"item {i}", "square": i * i} for i in range(40)]
total = sum(row["square"] for row in rows if row["n"] % 3)
print(total, fib(9), ",".join(str(row) for row in rows[:3]))
{key: value for key, value in sorted(rows[7].items())}
"""
#: Cells numbered from here on are the warm-up's, never a user's (tracebacks quote cells).
WARM_UP_FIRST_CELL = 1_000_000_000
#: The warm-up takes the same path as a run, artifacts included, but hands nothing back.
WARM_UP_LIMITS: GuestLimits = {
    "max_output_chars": 1000,
    "max_kept_output_chars": 0,
    "output": {"max_files": 0, "max_bytes": 0, "max_figures": 0},
}


def jit_warm_up(rounds: int) -> None:
    """Run WARM_UP_PROGRAM `rounds` times in a throwaway interpreter, so a JIT (V8 compiling
    Pyodide's WebAssembly) has compiled the hot paths before the user's next call.

    With max_figures 0 nothing is saved, and no figure is open between runs (each run closes them).
    """
    interpreter = Interpreter(WARM_UP_LIMITS)
    interpreter.cells = WARM_UP_FIRST_CELL
    for _ in range(rounds):
        dumps(interpreter.run(WARM_UP_PROGRAM))
        linecache.cache.pop(f"{CELL_PREFIX}{interpreter.cells}>", None)
