"""The executor interface every backend implements: its limits and hooks, the timeout policy
every backend shares, and the bridged tool calls of one run."""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import anyio
import anyio.abc

from mcp_sandbox.packages import Lock, cached_pyodide_lock, host_import_note
from mcp_sandbox.protocol import (
    DATA_DIR,
    KILL_WAIT,
    MAX_PROGRESS_LINE_CHARS,
    OUTPUT_DIR,
    GuestFile,
    GuestLimits,
    GuestOutcome,
    reply_error,
    reply_ok,
)
from mcp_sandbox.result import ExecutionResult, SandboxErrorType, decode_base64
from mcp_sandbox.settings import Settings
from mcp_sandbox.stopping import CallStopped, stopped_by

logger = logging.getLogger(__name__)


class SandboxDied(Exception):
    """The sandbox process is gone or unusable; its session's state is lost."""

    def __init__(
        self,
        message: str,
        error_type: SandboxErrorType = "SandboxCrash",
        *,
        renewed: bool = False,
        recycled: bool = False,
    ) -> None:
        super().__init__(message)
        self.error_type: SandboxErrorType = error_type
        #: The sandbox is replacing what died in place (pyodide: a new worker in the same
        #: process): after `renew` it serves again, clean.
        self.renewed = renewed
        #: Renewed by going back to its clean point (pyodide: the same worker, recycled): it
        #: serves again at once, and may go back to the pool.
        self.recycled = recycled


class SandboxStartError(Exception):
    """A new sandbox could not be started (runtime missing, load failure, start timeout)."""

    def __init__(self, message: str, *, killed: bool = False) -> None:
        super().__init__(message)
        #: Killed from outside while it started (SIGKILL: the OOM killer, an operator): a retry
        #: is likely to work, so it says nothing about the runtime.
        self.killed = killed


@dataclass(frozen=True)
class ExecutorLimits:
    """What every run of one executor is held to, fixed when it is built."""

    guest: GuestLimits
    #: Seconds an interrupted program gets to stop before its sandbox is killed.
    grace: float
    #: Bridged tool calls one run may make.
    max_tool_calls: int
    #: The largest checkpoint read back from a sandbox, in bytes.
    max_state_bytes: int = 512 * 2**20

    @classmethod
    def from_settings(cls, settings: Settings) -> ExecutorLimits:
        guest: GuestLimits = {
            "max_output_chars": settings.max_output_chars,
            "max_kept_output_chars": settings.max_kept_output_chars,
            "output": settings.output_limits(),
        }
        return cls(guest, settings.interrupt_grace, settings.bridge_max_calls, settings.max_state_mb * 2**20)

    @property
    def max_output_chars(self) -> int:
        return self.guest["max_output_chars"]


class ToolHost(Protocol):
    """What an executor needs of the tool bridge (bridge.upstreams.ToolBridge is one)."""

    #: Bumped whenever the catalog changes, so executors know to refresh the guest's `tools`.
    version: int
    #: The catalog as JSON text: a list of ToolSpec, what the guest builds `tools` from.
    manifest_json: str

    @property
    def has_tools(self) -> bool: ...

    async def call(self, server_py: str, tool_py: str, arguments: Any) -> str:
        """One call's reply (a ToolReply as JSON text); never raises except on cancellation."""
        ...

    def describe(self, query: str, limit: int) -> str:
        """The Python stubs of the tools `query` names (tools.describe in the sandbox)."""
        ...


#: Receives the latest line one run's program printed (at most twice a second).
OutputHook = Callable[[str], None]


@dataclass(frozen=True)
class ExecutorHooks:
    """How an executor reaches back into the server: its runs' bridged tool calls."""

    tools: ToolHost | None


#: Delivers reply (JSON text) for call number `call` to the sandbox.
Deliver = Callable[[int, str], Awaitable[None]]

#: A reply that cannot reach a sandbox in this long is dropped: the sandbox is stuck or gone.
DELIVER_LIMIT = 2.0


@dataclass(frozen=True)
class NotDone:
    """Why a between-run operation (recycle, checkpoint, restore) did not happen, in words for
    the caller: what they can do about it."""

    reason: str


@dataclass(frozen=True)
class Checkpoint:
    """A sandbox's state as its backend saved it: opaque to the host (a memory image, or a
    pickle only a sandbox unpickles), and what a restore of it will not bring back."""

    payload: bytes
    lost: tuple[str, ...] = ()


class ToolCalls:
    """The bridged calls of one run (tool calls and describes): each in its own task, within the
    per-run limit; `cancel_all` ends the pending ones when the run ends, and each still gets a reply."""

    def __init__(self, tools: ToolHost | None, task_group: anyio.abc.TaskGroup, max_calls: int) -> None:
        self._tools = tools
        self._task_group = task_group
        self._max_calls = max_calls
        self._scopes: set[anyio.CancelScope] = set()
        self._ended = False
        self.count = 0

    def start(self, call: int, server: str, tool: str, arguments: str, deliver: Deliver) -> None:
        self._begin(call, functools.partial(self._tool_reply, server, tool, arguments), deliver)

    def start_describe(self, call: int, query: str, limit: int, deliver: Deliver) -> None:
        self._begin(call, functools.partial(self._describe_reply, query, limit), deliver)

    def _begin(self, call: int, reply: Callable[[], Awaitable[str]], deliver: Deliver) -> None:
        self.count += 1
        refusal = self._refusal()
        if refusal is not None:
            reply = functools.partial(_constant, refusal)
        self._task_group.start_soon(self._serve, call, reply, deliver)

    def _refusal(self) -> str | None:
        """Why the call just counted is answered with an error without being made, or None."""
        if self._tools is None or not self._tools.has_tools:
            return reply_error("no upstream MCP servers are configured (MCP_SANDBOX_BRIDGE_CONFIG)")
        if self.count > self._max_calls:
            return reply_error(
                f"this execution made more than {self._max_calls} tool calls (MCP_SANDBOX_BRIDGE_MAX_CALLS)"
            )
        return None

    async def _serve(self, call: int, make_reply: Callable[[], Awaitable[str]], deliver: Deliver) -> None:
        reply = reply_error("the execution ended (finished or timed out) before this tool call returned")
        # A call that arrives after the run ended (it crossed the interrupt) is answered, not made.
        scope = anyio.CancelScope()
        if self._ended:
            scope.cancel()
        self._scopes.add(scope)
        with scope:
            reply = await make_reply()
        self._scopes.discard(scope)
        with anyio.move_on_after(DELIVER_LIMIT, shield=True):
            try:
                await deliver(call, reply)
            except Exception as error:  # noqa: BLE001 - the sandbox died; its run reports that
                logger.debug("could not deliver tool reply %d: %s", call, error)

    async def _tool_reply(self, server: str, tool: str, arguments: str) -> str:
        assert self._tools is not None, "refused before"
        try:
            decoded = json.loads(arguments)
        except (TypeError, ValueError):
            return reply_error("the tool call's arguments were not JSON")
        return await self._tools.call(str(server), str(tool), decoded)

    async def _describe_reply(self, query: str, limit: int) -> str:
        assert self._tools is not None, "refused before"
        return reply_ok(self._tools.describe(str(query), max(1, int(limit))))

    def cancel_all(self) -> None:
        self._ended = True
        for scope in self._scopes:
            scope.cancel()


async def _constant(reply: str) -> str:
    return reply


class Executor(ABC):
    """One sandbox: an interpreter whose state lives from one `run` to the next.

    Built once, with its limits and hooks. `run` holds the timeout policy, so it is the same
    everywhere: at the deadline the program is interrupted, and if it has not stopped after the
    grace period the sandbox is killed. Backends implement `_submit`, `_await_outcome`,
    `interrupt`, `close` and `alive`; while `_await_outcome` waits, they hand the program's
    bridged tool calls to `_start_tool_call` (a tools.describe to `_start_describe`) and its output
    lines to `_output`, which passes them to the run's `on_output`.
    """

    backend: ClassVar[str]
    #: It can `kill` a program that ignores its interrupt without being closed.
    can_kill: ClassVar[bool] = False

    def __init__(self, limits: ExecutorLimits, hooks: ExecutorHooks) -> None:
        self.limits = limits
        self.hooks = hooks
        #: Which catalog version the guest's `tools` was built from (-1: none yet).
        self._tools_version = -1
        self._tool_calls: ToolCalls | None = None
        #: Where the running program's output lines go (None: nobody is watching).
        self._on_output: OutputHook | None = None
        #: The last run found the sandbox already dead: its program never started.
        self.found_dead = False
        #: It may serve another caller once its own is done with it (recycled); False once it was
        #: renewed, as what crashed may have left a thread running in its process.
        self.reusable = True

    @property
    @abstractmethod
    def alive(self) -> bool:
        """False once the sandbox has died or been closed."""

    @abstractmethod
    async def interrupt(self) -> None:
        """Ask the running program to stop (KeyboardInterrupt); returns at once."""

    @abstractmethod
    async def close(self) -> None:
        """Stop the sandbox and free everything it holds. Safe to call twice."""

    @property
    def moving_out(self) -> bool:
        """Its process takes no new work and ends with its last sandbox (it may still run code it
        could not stop): a session in it should move to another sandbox once idle."""
        return False

    def serves(self, principal: str) -> bool:
        """Whether it may be handed to `principal`'s call: a sandbox that shares its process with
        others serves only the principal of those handed out."""
        return True

    def claim(self, principal: str) -> None:  # noqa: B027 - optional: only a shared process binds
        """It is handed to `principal`'s call (once `serves` said it may)."""

    def unclaim(self) -> None:  # noqa: B027 - optional: only a shared process binds
        """It is back in the pool, clean, and nobody's."""

    async def kill(self) -> None:  # noqa: B027 - optional: only with can_kill
        """End the running program that ignored its interrupt, losing the sandbox's state but not
        the sandbox: the run then ends in SandboxDied with `renewed`. Returns at once."""

    async def renew(self, died: SandboxDied) -> bool:
        """Take the sandbox back after `died` (with `renewed`): True when it will serve again,
        clean as a new one (its next request waits until it is ready); for the same caller only
        (`reusable`) unless `died.recycled`; False when it cannot (the caller then closes it)."""
        return False

    async def recycle(self) -> NotDone | None:
        """Put the sandbox back into its clean state in place, between runs, so another caller can
        use it: None when done, else why it cannot be (the caller then closes it)."""
        return NotDone(f"{self.backend} sandboxes are not recycled")

    async def checkpoint(self) -> Checkpoint | NotDone:
        """The interpreter's state between runs, as data another sandbox of this backend can
        `restore`; or why it cannot be saved now."""
        return NotDone(f"{self.backend} sandboxes do not save their state")

    async def restore(self, state: bytes) -> NotDone | None:
        """Put a checkpoint's state into this sandbox, which has run nothing since it started or
        was recycled: None when done, else why not (the caller then closes it)."""
        return NotDone(f"{self.backend} sandboxes do not restore saved state")

    async def jit_warm_up(self) -> None:  # noqa: B027 - optional: only a JIT-compiled runtime needs it
        """Use idle time to make the next calls faster; returns at once. Called for sandboxes
        that serve a session, which will run more programs."""

    @abstractmethod
    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        """Start running `code`, first rebuilding the guest's `tools` from `tools_manifest`
        when it is given; returns at once."""

    @abstractmethod
    async def _await_outcome(self) -> GuestOutcome:
        """Wait for the submitted program to finish. Raises SandboxDied."""

    def _read_output_file(self, file: GuestFile, path: str, limit: int) -> bytes | None:
        """The bytes of output/`path`: sent inline by the guest unless a backend can read its disk."""
        return decode_base64(file["data"]) if "data" in file else None

    def _start_tool_call(self, call: int, server: str, tool: str, arguments: str, deliver: Deliver) -> None:
        if self._tool_calls is None:
            raise RuntimeError("no execution is running")
        self._tool_calls.start(call, server, tool, arguments, deliver)

    def _start_describe(self, call: int, query: str, limit: int, deliver: Deliver) -> None:
        if self._tool_calls is None:
            raise RuntimeError("no execution is running")
        self._tool_calls.start_describe(call, query, limit, deliver)

    def _output(self, line: str) -> None:
        """A line the running program printed: to its run's `on_output`, if anyone watches."""
        if self._on_output is not None:
            self._on_output(line[:MAX_PROGRESS_LINE_CHARS])

    async def run(
        self,
        code: str,
        timeout: float,
        stop: anyio.Event | None = None,
        on_output: OutputHook | None = None,
    ) -> ExecutionResult:
        """Run `code` for at most `timeout` seconds, or until `stop` is set (the caller went away),
        whichever comes first; either way the program is interrupted, then killed if it ignores
        that. `on_output` gets the latest line the program printed, while it runs. Implementations
        never raise: what happened is in the result."""
        tools = self.hooks.tools
        manifest = None
        if tools is not None and tools.version != self._tools_version:
            manifest, self._tools_version = tools.manifest_json, tools.version
        async with anyio.create_task_group() as task_group:
            self._tool_calls = calls = ToolCalls(tools, task_group, self.limits.max_tool_calls)
            self._on_output = on_output
            try:
                result = await self._run(code, manifest, timeout, stop or anyio.Event())
            finally:
                # Bridged calls still pending when the execution ends are cancelled and answered.
                calls.cancel_all()
                self._tool_calls = None
                self._on_output = None
        return result

    async def _outcome_within(self, seconds: float, stop: anyio.Event) -> GuestOutcome | None:
        """The run's outcome, or None when `seconds` pass or `stop` is set first. Raises SandboxDied."""
        with anyio.move_on_after(seconds):
            try:
                async with stopped_by(stop):
                    return await self._await_outcome()
            except CallStopped:
                pass
        return None

    async def _run(
        self, code: str, manifest: str | None, timeout: float, stop: anyio.Event
    ) -> ExecutionResult:
        started = time.perf_counter()
        grace = self.limits.grace

        def stopped_why() -> tuple[SandboxErrorType, str]:
            if stop.is_set():
                return (
                    "Cancelled",
                    f"Execution was cancelled by its caller after {time.perf_counter() - started:.1f} s",
                )
            return "Timeout", f"Execution timed out after {timeout:g} s"

        def elapsed_ms() -> int:
            return int((time.perf_counter() - started) * 1000)

        def finished(outcome: GuestOutcome) -> ExecutionResult:
            return ExecutionResult.from_outcome(
                outcome,
                backend=self.backend,
                duration_ms=elapsed_ms(),
                max_output_chars=self.limits.max_output_chars,
                output=self.limits.guest["output"],
                read_file=self._read_output_file,
                max_kept_output_chars=self.limits.guest["max_kept_output_chars"],
            )

        def interrupted(outcome: ExecutionResult) -> ExecutionResult:
            if outcome.exception != "KeyboardInterrupt":
                return outcome  # it finished on its own just as the deadline passed
            kind, why = stopped_why()
            return ExecutionResult.failure(
                kind,
                f"{why} and was interrupted; the session's variables are kept.",
                backend=self.backend,
                duration_ms=elapsed_ms(),
                stdout=outcome.stdout,
                stderr=outcome.stderr,
            )

        self.found_dead = False
        try:
            try:
                await self._submit(code, manifest)
            except SandboxDied:
                self.found_dead = True
                raise
            if (outcome := await self._outcome_within(timeout, stop)) is not None:
                return finished(outcome)
            await self.interrupt()
            if self._tool_calls is not None:
                self._tool_calls.cancel_all()
            with anyio.move_on_after(grace):
                return interrupted(finished(await self._await_outcome()))
            death: SandboxDied | None = None
            if self.can_kill:
                logger.info(
                    "%s sandbox ignored the interrupt for %g s; killing the program", self.backend, grace
                )
                await self.kill()
                with anyio.move_on_after(KILL_WAIT):
                    try:
                        return interrupted(finished(await self._await_outcome()))
                    except SandboxDied as died:
                        death = died
            if not (death is not None and death.renewed and await self.renew(death)):
                logger.warning("%s sandbox ignored the interrupt for %g s; killing it", self.backend, grace)
                await self.close()
            kind, why = stopped_why()
            return ExecutionResult.failure(
                kind,
                f"{why} and did not stop when interrupted, so it was killed; "
                "the session's variables are gone with it.",
                backend=self.backend,
                duration_ms=elapsed_ms(),
                session_lost=True,
            )
        except SandboxDied as died:
            if not (died.renewed and await self.renew(died)):
                await self.close()
            return ExecutionResult.failure(
                died.error_type, str(died), backend=self.backend, duration_ms=elapsed_ms(), session_lost=True
            )
        except anyio.get_cancelled_exc_class():
            # Cancelled without a stop (the server shutting down): the sandbox's state is unknown, so it goes.
            with anyio.CancelScope(shield=True):
                await self.close()
            raise


class Backend(ABC):
    """Makes ready-to-use executors of one kind, all with the same limits and hooks."""

    name: ClassVar[str]

    #: Whether its executors can be reset in place (`Executor.recycle`) and reused.
    recycles: ClassVar[bool] = False
    #: Whether its executors save and restore sessions (`Executor.checkpoint`, `restore`).
    saves_sessions: ClassVar[bool] = False

    def __init__(self, settings: Settings, hooks: ExecutorHooks) -> None:
        self._settings = settings
        self._limits = ExecutorLimits.from_settings(settings)
        self._hooks = hooks

    async def prepare(self) -> None:  # noqa: B027 - an optional hook, not every backend has set-up
        """One-time set-up before the first `start` (fetching a runtime, say)."""

    @property
    def build(self) -> str:
        """What saved state depends on: a checkpoint restores only into a backend of the same build."""
        return self.name

    @abstractmethod
    async def start(self, principal: str | None = None) -> Executor:
        """A new sandbox, started and ready to run code, for `principal`'s call (None: for whoever
        comes). Raises SandboxStartError."""

    @abstractmethod
    def summary(self) -> str:
        """For the tool description: what the sandbox is and what it allows, and (one short
        sentence) what it can import."""

    async def close(self) -> None:  # noqa: B027 - optional: only what a backend holds besides sandboxes
        """Give back what the backend holds beyond its sandboxes (its folders). Called once, at
        shutdown, after every sandbox is closed."""

    def start_background_work(self) -> None:  # noqa: B027 - optional: only pyodide has any
        """Start what the backend does in the background while it serves (pyodide: fetching the
        default packages); returns at once. Called once, after `prepare`."""

    def import_note(self, module: str) -> str | None:
        """What a program whose `import module` failed should be told (how to get the package), or
        None when the backend has nothing to say."""
        return None

    def notes_for(self, result: ExecutionResult) -> list[str]:
        """Notes a finished result gets from the backend: what to do about a failed import."""
        module = failed_import(result)
        # Only a missing top-level module is a missing package: 'pandas.nope' means pandas is there.
        note = self.import_note(module) if module is not None and "." not in module else None
        return [note] if note else []


class HostPythonBackend(Backend):
    """A backend that runs the server's own Python: a failed import's note says how to install the
    package, or that the pyodide backend has it."""

    @functools.cached_property
    def _pyodide_lock(self) -> Lock:
        return cached_pyodide_lock(self._settings.cache_dir)

    def import_note(self, module: str) -> str | None:
        return host_import_note(module, self._pyodide_lock)


#: The message of a ModuleNotFoundError, as the guest's traceback ends.
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'")


def failed_import(result: ExecutionResult) -> str | None:
    """The module whose import failed the program, or None when it did not fail so."""
    if result.error_type != "ModuleNotFoundError" or not result.error:
        return None
    found = MISSING_MODULE.findall(result.error)
    return found[-1] if found else None


def prepare_workspace(workdir: Path, data_dir: Path | None) -> None:
    """A CPython sandbox's working directory: output/ to write results to, data/ linking the host's data."""
    (workdir / OUTPUT_DIR).mkdir(exist_ok=True)
    if data_dir is not None and not (workdir / DATA_DIR).exists():
        (workdir / DATA_DIR).symlink_to(data_dir, target_is_directory=True)
