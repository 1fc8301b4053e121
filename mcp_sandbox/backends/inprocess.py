"""The in-process backend: code runs in a thread of the server itself. For trusted code only.

It is the fastest backend (no process to cross, nothing serialised) and it isolates nothing:
the program shares the server's memory, modules, files, environment and network, and
`os._exit` or a segfault in it ends the server. Each session owns one thread, so its state
persists and sessions run side by side. A timeout raises KeyboardInterrupt in that thread,
which stops pure-Python code; a thread that does not stop (a long C call, code that catches
the interrupt) is discarded with its session and runs on until its code returns.
"""

from __future__ import annotations

import asyncio
import copy
import ctypes
import itertools
import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from io import StringIO, TextIOBase
from pathlib import Path
from typing import Any, ClassVar, TextIO

import anyio

from mcp_sandbox import guest
from mcp_sandbox.backends.base import (
    Executor,
    ExecutorHooks,
    ExecutorLimits,
    HostPythonBackend,
    SandboxDied,
    prepare_workspace,
)
from mcp_sandbox.packages import host_importable
from mcp_sandbox.protocol import GuestFile, GuestOutcome, reply_error
from mcp_sandbox.result import GUEST_OUTCOME, read_output_file
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

_install_lock = threading.Lock()

Stream = TextIO | TextIOBase


class ThreadRoutedStream:
    """Stands in for sys.stdout, sys.stderr or sys.stdin: each executor thread gets its own
    stream, every other thread keeps the original one."""

    def __init__(self, original: TextIO) -> None:
        self._original = original
        self._local = threading.local()

    @property
    def target(self) -> Stream:
        routed: Stream | None = getattr(self._local, "target", None)
        return routed if routed is not None else self._original

    def route(self, target: Stream | None) -> None:
        """Send this thread's use of the stream to `target`; None restores the original."""
        self._local.target = target

    def write(self, text: str) -> int:
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def read(self, size: int = -1) -> str:
        return self.target.read(size)

    def readline(self, size: int = -1) -> str:
        return self.target.readline(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


def routed_stream(name: str) -> ThreadRoutedStream:
    """sys.<name>, replaced by a ThreadRoutedStream unless it already is one."""
    with _install_lock:
        current = getattr(sys, name)
        if not isinstance(current, ThreadRoutedStream):
            current = ThreadRoutedStream(current)
            setattr(sys, name, current)
        return current


class ThreadInterpreter(guest.Interpreter):
    """A guest interpreter whose output is captured per thread, since the server's other threads
    (and other sessions) share sys.stdout."""

    # Every in-process interpreter shares the server's working directory, so output/ is rescanned.
    private_output = False

    @contextmanager
    def capturing(self, stdout: guest.CappedText, stderr: guest.CappedText) -> Iterator[None]:
        # Looked up on every run: a program may have replaced sys.stdout with its own object.
        streams: list[tuple[ThreadRoutedStream, Stream]] = [
            (routed_stream("stdout"), stdout),
            (routed_stream("stderr"), stderr),
        ]
        streams.append((routed_stream("stdin"), StringIO()))  # input() gets EOF, as in the other backends
        for router, target in streams:
            router.route(target)
        try:
            yield
        finally:
            for router, _ in streams:
                router.route(None)


def raise_in_thread(thread_id: int, error: type[BaseException] | None) -> None:
    """Make `error` raise in the thread at its next bytecode; None withdraws a pending one."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(error) if error is not None else None
    )


@dataclass(eq=False)
class _Job:
    code: str
    tools_manifest: str | None
    host_loop: asyncio.AbstractEventLoop
    done: anyio.Event = field(default_factory=anyio.Event)
    outcome: GuestOutcome | None = None

    def wake_host(self) -> None:
        """Called on the executor thread when the outcome is in."""
        # call_soon_threadsafe never blocks this thread, even while the server shuts down.
        with suppress(RuntimeError):
            self.host_loop.call_soon_threadsafe(self.done.set)


class InProcessExecutor(Executor):
    """One session's thread, fed programs through a queue."""

    backend: ClassVar[str] = "inprocess"

    def __init__(self, limits: ExecutorLimits, hooks: ExecutorHooks, name: str, workdir: Path) -> None:
        super().__init__(limits, hooks)
        self._workdir = workdir
        self._channel = guest.ToolChannel(self._from_guest)
        # A copy: the guest shares the server's memory, and must not change the host's caps.
        self._interpreter = ThreadInterpreter(copy.deepcopy(limits.guest), self._channel)
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._job: _Job | None = None
        # Guards `_running` and `_task`, so an interrupt can never land after the program ended.
        self._state = threading.Lock()
        self._running = False
        self._interrupted = False
        self._task: asyncio.Task[GuestOutcome] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._host_loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._closed and self._thread.is_alive()

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        if not self.alive:
            raise SandboxDied("the in-process session thread is gone")
        self._host_loop = asyncio.get_running_loop()
        job = _Job(code, tools_manifest, self._host_loop)
        self._job = job
        self._jobs.put(job)

    async def _await_outcome(self) -> GuestOutcome:
        job = self._job
        assert job is not None, "_submit comes first"
        await job.done.wait()
        if job.outcome is None:
            raise SandboxDied("the in-process session thread failed")
        return GUEST_OUTCOME.validate_python(job.outcome)

    def _read_output_file(self, file: GuestFile, path: str, limit: int) -> bytes | None:
        return read_output_file(self._workdir, path, limit)

    def _from_guest(self, payload: str) -> None:
        """A RunnerMessage from the guest's ToolChannel, on the session thread: it goes to the
        server's loop, as a process's line would."""
        message = json.loads(payload)
        loop = self._host_loop
        if message["type"] == "progress":
            if loop is not None:
                with suppress(RuntimeError):  # the server is shutting down
                    loop.call_soon_threadsafe(self._output, message["line"])
            return
        call = message["call"]

        async def deliver(_call: int, reply: str) -> None:
            self._channel.deliver(call, reply)

        # A coroutine, not a plain callback: anyio starts tasks only from inside a task.
        async def begin() -> None:  # on the server's loop
            try:
                if message["type"] == "describe":
                    self._start_describe(call, message["query"], message["limit"], deliver)
                else:
                    self._start_tool_call(
                        call, message["server"], message["tool"], message["arguments"], deliver
                    )
            except RuntimeError:  # the execution's task group has closed
                self._channel.deliver(call, reply_error("the execution ended before this tool call started"))

        starting = begin()
        try:
            if loop is None:
                raise RuntimeError("no execution is running")
            asyncio.run_coroutine_threadsafe(starting, loop)
        except RuntimeError as error:
            starting.close()
            self._channel.deliver(call, reply_error(f"the tool call could not reach the server: {error}"))

    async def interrupt(self) -> None:
        self._interrupt()

    def _interrupt(self) -> None:
        with self._state:
            if not self._running or self._thread.ident is None:
                return
            self._interrupted = True
            raise_in_thread(self._thread.ident, KeyboardInterrupt)
            if self._task is not None and self._loop is not None:
                # An awaiting program sleeps in the event loop, where no bytecode runs to raise in.
                self._loop.call_soon_threadsafe(self._task.cancel)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._running:
            self._interrupt()
            logger.warning(
                "in-process thread %s was still running when its session was discarded; "
                "it was interrupted and ends when its code returns",
                self._thread.name,
            )
        self._jobs.put(None)

    # The executor thread.

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            while (job := self._jobs.get()) is not None:
                try:
                    job.outcome = self._execute(job)
                except BaseException as error:  # noqa: BLE001 - an interrupt that landed outside the program
                    job.outcome = job.outcome or guest.interrupted_outcome(error)
                job.wake_host()
        finally:
            self._loop.close()

    def _execute(self, job: _Job) -> GuestOutcome:
        with self._state:
            self._running, self._interrupted = True, False
        try:
            if job.tools_manifest is not None:
                self._interpreter.install_tools(job.tools_manifest)
            outcome = self._interpreter.run(job.code)
            if not isinstance(outcome, dict):
                outcome = self._finish_async(outcome)
            if self._interrupted and outcome["error_type"] == "CancelledError":
                outcome["error_type"] = "KeyboardInterrupt"  # the cancel was our interrupt
            return outcome
        finally:
            with self._state:
                self._running = False
                if self._thread.ident is not None:
                    raise_in_thread(self._thread.ident, None)

    def _finish_async(self, pending: Coroutine[Any, Any, GuestOutcome]) -> GuestOutcome:
        assert self._loop is not None
        task = self._loop.create_task(pending)
        with self._state:
            self._task = task
        try:
            return self._loop.run_until_complete(task)
        except BaseException:
            # Interrupted in the loop itself: end the program now, so it cannot resume in a later call.
            task.cancel()
            with suppress(BaseException):
                self._loop.run_until_complete(task)
            raise
        finally:
            with self._state:
                self._task = None


class InProcessBackend(HostPythonBackend):
    name: ClassVar[str] = "inprocess"

    def __init__(self, settings: Settings, hooks: ExecutorHooks) -> None:
        super().__init__(settings, hooks)
        self._numbers = itertools.count(1)
        self.workdir = Path.cwd()
        self._made: Path | None = None  # the folder prepare made, and the one close removes
        self._started_in = Path.cwd()

    async def prepare(self) -> None:
        logger.warning(
            "inprocess backend: code runs inside this server's process with no isolation; "
            "use it only for trusted code"
        )
        # A process has one working directory, so every in-process session shares this one.
        self.workdir = self._made = Path(tempfile.mkdtemp(prefix="mcp-sandbox-inprocess-"))
        prepare_workspace(self.workdir, self._settings.data_dir)
        self._started_in = Path.cwd()
        os.chdir(self.workdir)
        os.environ.setdefault("MPLBACKEND", "Agg")
        if self._settings.data_dir is not None:
            guest.protect_read_only(str(self._settings.data_dir))

    async def close(self) -> None:
        if self._made is None:
            return
        with suppress(OSError):  # a cwd already gone
            if Path.cwd() == self._made:
                os.chdir(self._started_in)
        shutil.rmtree(self._made, ignore_errors=True)
        self._made = None

    async def start(self, principal: str | None = None) -> Executor:
        name = f"mcp-sandbox-inprocess-{next(self._numbers)}"
        return InProcessExecutor(self._limits, self._hooks, name, self.workdir)

    def summary(self) -> str:
        return (
            f"Python {sys.version.split()[0]} runs inside the server's own process (the in-process "
            "backend, for trusted code only): it is not isolated from the host's files, network or "
            f"environment. {host_importable()}"
        )
