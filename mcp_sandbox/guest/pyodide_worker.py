"""The Pyodide worker's own Python (worker.ts calls it through the guest runtime): waits that sleep
instead of spinning, the audit hook that tells a recycle what it cannot check, the names that hold
JavaScript objects (a checkpoint refuses them), the `pyodide_js` module forgotten, and the outcome
of an interrupt that lands outside the program."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

# Bound at import, so a program that patches json cannot break reporting.
from json import dumps
from typing import Any

from mcp_sandbox.guest.interpreter import Interpreter, cancel_run, on_interrupt
from mcp_sandbox.guest.program import interrupted_outcome

#: Audit events of a program reaching past what a recycle checks: raw memory and C calls (ctypes),
#: every live object (gc), other frames (tracing).
REACHING_PAST = ("ctypes.", "gc.get_", "sys.settrace", "sys.setprofile", "sys._current_frames")


def interrupted() -> None:
    """What the interpreter's signal check does with an interrupt: call the SIGINT handler (the
    program may have set its own), or raise KeyboardInterrupt by default."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, None)
    elif handler == signal.SIG_DFL:
        raise KeyboardInterrupt


def install_waits(wait: Callable[[float], bool]) -> None:
    """Make the standard library's waits sleep in `wait`, which blocks without using
    the CPU and answers True when the run is interrupted (the interrupt is then raised here, as
    the SIGINT handler raises it), instead of spinning.

    Covers time.sleep (however imported, as this runs before any program), select.select with
    no files, and every timed wait of threading and queue (Condition.wait sleeps on a fresh lock,
    which with one thread nothing can release meanwhile)."""
    import select
    import time

    def sleep(seconds: Any) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        if wait(float(seconds)):
            interrupted()

    real_select = select.select

    def select_files(rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        if rlist or wlist or xlist:
            return real_select(rlist, wlist, xlist, timeout)
        sleep(float("inf") if timeout is None else timeout)
        return [], [], []

    real_lock = threading._allocate_lock  # type: ignore[attr-defined]

    class SleepingLock:
        __slots__ = ("_lock",)

        def __init__(self) -> None:
            self._lock = real_lock()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self._lock.acquire(False):
                return True
            if not blocking:
                return False
            sleep(float("inf") if timeout < 0 else timeout)
            return bool(self._lock.acquire(False))

        def release(self) -> None:
            self._lock.release()

        def locked(self) -> bool:
            return bool(self._lock.locked())

        __enter__ = acquire

        def __exit__(self, *exc: object) -> None:
            self._lock.release()

    time.sleep = sleep
    select.select = select_files
    threading._allocate_lock = SleepingLock  # type: ignore[attr-defined]


def install_interrupt_handlers() -> None:
    """Route the interrupt buffer's SIGINT through `on_interrupt`, so an interrupt that lands in an
    earlier run's task stops this run, not that task. And stop the run, not the worker, when a
    KeyboardInterrupt or SystemExit escapes a task: Pyodide's event loop hands it to JavaScript,
    where it would end the worker, unless the loop has a handler for it."""
    import asyncio

    signal.signal(signal.SIGINT, on_interrupt)
    loop: Any = asyncio.get_event_loop()
    loop._keyboard_interrupt_handler = cancel_run
    loop._system_exit_handler = lambda code: cancel_run()


def report_reaching_past(report: Callable[[str], None]) -> None:
    """Call `report` with the event whenever a program reaches past what a recycle checks, or
    sets an attribute of the hook itself. Audit hooks cannot be removed from Python."""
    watched = REACHING_PAST  # held by the hook: a program may rebind the module's name, not this

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(watched) or (event == "object.__setattr__" and args and args[0] is hook):
            report(event)

    sys.addaudithook(hook)


def js_holders(interpreter: Interpreter) -> list[str]:
    """The names in the session's globals that hold JavaScript objects."""
    from pyodide.ffi import JsProxy  # type: ignore[import-not-found, unused-ignore]

    modules = {id(module) for module in sys.modules.values()}  # "import js" holds nothing new
    return [
        name
        for name, value in interpreter.namespace.items()
        if isinstance(value, JsProxy) and id(value) not in modules
    ]


def forget_modules(top: str) -> None:
    """Drop `top` and its submodules from sys.modules, so the next import finds what is registered now."""
    for name in [name for name in sys.modules if name.split(".")[0] == top]:
        del sys.modules[name]


def reseed() -> None:
    """Give a sandbox fresh from its clean point random numbers of its own. Every sandbox starts
    from one memory image (the snapshot, then its clean point), which holds the generators that
    `random` and, when preloaded, NumPy seeded at import: left alone, each caller would draw the
    same numbers. A restored session keeps its own generators' state, so it is not reseeded."""
    for name in ("random", "numpy.random"):
        module = sys.modules.get(name)
        if module is not None:
            module.seed()  # from os.urandom, which Pyodide draws from crypto.getRandomValues
    tempfile: Any = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None  # its names come from a generator of its own, made once


def interrupted_json() -> str:
    """What a run reports when its interrupt lands in the runner's own code, as JSON text."""
    return dumps(interrupted_outcome(KeyboardInterrupt()))
