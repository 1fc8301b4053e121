"""Host side of a sandbox that is a child process speaking the runner protocol (protocol.py):
the Pyodide runner and the CPython worker. The executor runs programs and answers requests
between runs over its runner channel (channel.py), and learns why its process died from its
process watch (watch.py)."""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import anyio
import anyio.abc

from mcp_sandbox import protocol
from mcp_sandbox.backends.base import (
    Checkpoint,
    Executor,
    ExecutorHooks,
    ExecutorLimits,
    NotDone,
    SandboxDied,
    SandboxStartError,
)
from mcp_sandbox.backends.channel import BetweenRuns, Malformed, RunnerChannel, RunnerPipe
from mcp_sandbox.backends.watch import MB, ProcessWatch, is_running, resident_bytes
from mcp_sandbox.protocol import GuestOutcome, reply_error

logger = logging.getLogger(__name__)


def _guest_source(name: str) -> str:
    """The source of guest module `name` (mcp_sandbox.x.y), read from this installed package."""
    path = Path(protocol.__file__).parent.joinpath(*name.split(".")[1:])
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text(encoding="utf-8")


#: What a runner loads before anything else, in order: the protocol, then the guest runtime.
GUEST_MODULES: list[tuple[str, str]] = [
    (name, _guest_source(name)) for name in ("mcp_sandbox.protocol", *protocol.GUEST_MODULES)
]
#: Seconds a sandbox may take to replace a crashed worker (pyodide: about 0.4 s of a core).
RENEW_TIMEOUT = 30.0
#: Workers one sandbox replaces before it is closed instead.
MAX_RENEWALS = 3


def init_message(limits: ExecutorLimits, *, token: bool) -> protocol.InitMessage:
    """A new sandbox's `init` message, with a new session token if `token` (a runner that takes
    its own elsewhere gets none); the backend adds the host folders the sandbox reads, the hosts
    it may reach and the packages it preloads."""
    init: protocol.InitMessage = {"type": "init", "guest_modules": GUEST_MODULES, "limits": limits.guest}
    if token:
        init["token"] = secrets.token_hex(16)
    return init


class CheckpointFiles(Protocol):
    """Where checkpoint files pass between the host and a sandbox, by name."""

    async def read(self, name: str, limit: int) -> bytes:
        """The checkpoint file `name` the sandbox wrote, read to at most `limit` + 1 bytes (more
        is over the limit). Raises OSError."""
        ...

    async def remove(self, name: str) -> None:
        """Delete the checkpoint file `name`, if it is there."""
        ...

    async def hand_in(self, name: str, state: bytes) -> None:
        """Write a checkpoint where the sandbox's `restore` reads it, as file `name`. Raises OSError."""
        ...


def max_line(limits: ExecutorLimits) -> int:
    """The longest runner line a sandbox with these limits may send."""
    return protocol.max_line_bytes(
        limits.max_output_chars,
        limits.guest["output"]["max_bytes"],
        limits.guest["max_kept_output_chars"],
    )


class SandboxWatch(Protocol):
    """What an executor asks of its sandbox's watch: a whole process's (watch.ProcessWatch), or
    one co-hosted sandbox's (pyodide/host.py)."""

    @property
    def alive(self) -> bool: ...

    @property
    def closed(self) -> bool: ...

    @property
    def killed_from_outside(self) -> bool: ...

    def fail(self, reason: str) -> None:
        """End the sandbox because of `reason`, which is then why it died."""
        ...

    async def end(self) -> None:
        """End the sandbox on purpose, and wait until it is gone."""
        ...

    def stderr_tail(self) -> str: ...

    def reason(self) -> str: ...

    async def report(self) -> SandboxDied: ...


@dataclass(frozen=True)
class RunnerLink:
    """How an executor reaches its sandbox: its process's pid, the sandbox's watch and channel."""

    pid: int
    watch: SandboxWatch
    channel: RunnerChannel


def solo_link(
    process: anyio.abc.Process, token: str, limits: ExecutorLimits
) -> tuple[RunnerLink, RunnerPipe]:
    """The link to a runner process that hosts one sandbox, and the process's pipe."""
    watch = ProcessWatch(process)
    pipe = RunnerPipe(process, watch, token, max_line(limits), enveloped=False)
    return RunnerLink(process.pid, watch, RunnerChannel(pipe, 0, watch, watch.fail)), pipe


def start_reading(
    pipe: RunnerPipe,
    watch: ProcessWatch,
    task_group: anyio.abc.TaskGroup,
    memory_limit: int | Callable[[], int] | None = None,
) -> None:
    """Read a runner process's stdout and stderr (and watch its memory, given a limit in bytes)."""
    task_group.start_soon(pipe.pump)
    task_group.start_soon(watch.read_stderr)
    if memory_limit is not None and resident_bytes(watch.pid) is not None:
        task_group.start_soon(watch.watch_memory, memory_limit)


async def start_process_executor(
    executor: ProcessExecutor,
    pipe: RunnerPipe,
    task_group: anyio.abc.TaskGroup,
    start_timeout: float,
    memory_limit: int | None = None,
) -> ProcessExecutor:
    """Wire up the readers of a process that hosts one sandbox, and wait for its `ready`; raises
    SandboxStartError."""
    assert isinstance(executor.watch, ProcessWatch)
    start_reading(pipe, executor.watch, task_group, memory_limit)
    return await initialize(executor, start_timeout)


async def initialize(executor: ProcessExecutor, start_timeout: float) -> ProcessExecutor:
    """Send the executor's `init` and wait for its `ready`; raises SandboxStartError."""
    try:
        with anyio.fail_after(start_timeout):
            await executor.initialize()
    except (SandboxDied, TimeoutError) as error:
        killed = executor.watch.killed_from_outside
        await executor.close()
        raise SandboxStartError(
            f"{executor.backend} sandbox failed to start: {error}{executor.watch.stderr_tail()}",
            killed=killed,
        ) from None
    return executor


#: Start-up warnings said once per server, not once per sandbox.
_said: set[str] = set()


class ProcessExecutor(Executor):
    """A sandbox that is a child process speaking the runner protocol (protocol.py) on its
    stdin and stdout. Subclasses name the backend and may interrupt differently."""

    #: Seconds a checkpoint or a restore may take before the sandbox counts as not answering.
    checkpoint_timeout: ClassVar[float] = 20.0

    def __init__(
        self,
        link: RunnerLink,
        limits: ExecutorLimits,
        hooks: ExecutorHooks,
        init: protocol.InitMessage,
        files: CheckpointFiles,
    ) -> None:
        """`link`: how its sandbox is reached; `init`: the message the runner gets first
        (`init_message`), whose token seals the runner's messages; `files`: where its checkpoint
        files pass."""
        super().__init__(limits, hooks)
        self.pid = link.pid
        self.watch = link.watch
        self.channel = link.channel
        self._init = init
        self._files = files
        self._run_id = 0
        #: A crash started a new worker (`renew`), whose `ready` the next request waits for.
        self._renewing = False
        self._renewals = 0

    @property
    def alive(self) -> bool:
        return self.watch.alive

    async def initialize(self) -> None:
        await self.channel.send(self._init)
        await self._await_ready()

    async def _await_ready(self) -> None:
        message = await self.channel.receive()
        if isinstance(message, Malformed):
            raise SandboxDied(f"the sandbox's first message, {message.kind!r}, did not match the protocol")
        if message["type"] == "fatal" or message["type"] == "crashed":
            raise SandboxDied(message["message"])
        if message["type"] != "ready":
            raise SandboxDied(f"the sandbox sent {message['type']!r} before it was ready")
        phases = ", ".join(f"{name} {ms}" for name, ms in message.get("phases", []))
        code_cache = message.get("code_cache")
        snapshot_read = message.get("snapshot_read")
        logger.debug(
            "%s sandbox %d ready in %d ms%s%s%s",
            self.backend,
            self.pid,
            message["load_ms"],
            f" ({phases})" if phases else "",
            f", code cache {code_cache}" if code_cache else "",
            f", snapshot read {snapshot_read}" if snapshot_read else "",
        )
        if code_cache in ("refused", "damaged") and "code cache" not in _said:
            _said.add("code cache")
            why = "V8 refused it" if code_cache == "refused" else "its file is missing or not the one made"
            logger.warning(
                "not using the code cache of Pyodide's runtime script (%s): each sandbox compiles the "
                "script itself, about 80 ms more per start; a restart makes it again",
                why,
            )
        for failed in message.get("preload_failed", []):
            if failed not in _said:
                _said.add(failed)
                logger.warning("a sandbox could not preload %s", failed)

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        await self._renewed()
        if not is_running(self.pid):
            # Killed between calls, before anything here saw it: the program never starts.
            raise SandboxDied("the sandbox process had ended before the call")
        self.channel.drain()
        self._run_id += 1
        message: protocol.RunMessage = {"type": "run", "id": self._run_id, "code": code}
        if tools_manifest is not None:
            message["tools"] = tools_manifest
        await self.channel.send(message)

    async def _await_outcome(self) -> GuestOutcome:
        deliver = self.channel.send_tool_result
        while True:
            message = await self.channel.receive()
            if isinstance(message, Malformed):
                logger.warning(
                    "%s sandbox %d sent a %r message the protocol does not describe",
                    self.backend,
                    self.pid,
                    message.kind,
                )
                if message.kind == "fatal" or message.id == self._run_id:
                    raise SandboxDied(f"the sandbox sent a malformed {message.kind} message")
                if message.kind in ("tool_call", "describe") and isinstance(message.call, int):
                    # Answered, so a program blocked on it is not left waiting for its timeout.
                    await deliver(message.call, reply_error("the tool call was malformed"))
                continue
            if message["type"] == "result" and message["id"] == self._run_id:
                return message["outcome"]
            if message["type"] == "crashed" and message["id"] == self._run_id:
                raise SandboxDied(
                    f"the sandbox crashed: {message['message']}",
                    renewed=message.get("renewed", False),
                    recycled=message.get("recycled", False),
                )
            if message["type"] == "fatal":
                raise SandboxDied(f"the sandbox runner failed: {message['message']}")
            if message["type"] == "progress":
                self._output(message["line"])
            if message["type"] == "tool_call":
                self._start_tool_call(
                    message["call"], message["server"], message["tool"], message["arguments"], deliver
                )
            if message["type"] == "describe":
                self._start_describe(message["call"], message["query"], message["limit"], deliver)
            # Anything else is stale or forged by the sandbox itself: it only concerns this run.

    async def _not_ready_for(self, request: BetweenRuns) -> NotDone | None:
        """Why the sandbox cannot take a request between runs now; None when it can, and then
        the request has its `id`: ask it with `channel.ask`."""
        if not self.alive:
            return NotDone("the sandbox is not alive")
        try:
            await self._renewed()
        except SandboxDied as error:
            return NotDone(f"the sandbox died: {error}")
        self.channel.drain()
        self._run_id += 1
        request["id"] = self._run_id
        return None

    async def checkpoint(self) -> Checkpoint | NotDone:
        name = f"checkpoint-{self._run_id + 1}"
        request: protocol.CheckpointMessage = {"type": "checkpoint", "id": 0, "file": name}
        try:
            message = await self._not_ready_for(request) or await self.channel.ask(
                request, self.checkpoint_timeout
            )
            if isinstance(message, NotDone):
                return message
            if not message["saved"]:
                return NotDone(message["reason"] or "the sandbox did not say why")
            limit = self.limits.max_state_bytes
            try:
                payload = await self._files.read(name, limit)
            except OSError as error:
                return NotDone(f"the checkpoint file could not be read: {error}")
            if len(payload) > limit:
                return NotDone(f"the session's state is over {limit // MB} MB (MCP_SANDBOX_MAX_STATE_MB)")
        finally:
            await self._files.remove(name)
        logger.debug(
            "%s sandbox %d checkpointed %d bytes in %.1f ms",
            self.backend,
            self.pid,
            len(payload),
            message["ms"],
        )
        return Checkpoint(payload, tuple(message["lost"]))

    async def restore(self, state: bytes) -> NotDone | None:
        name = f"restore-{self._run_id + 1}"
        try:
            await self._files.hand_in(name, state)
        except OSError as error:
            return NotDone(f"the checkpoint could not be handed to the sandbox: {error}")
        request: protocol.RestoreMessage = {"type": "restore", "id": 0, "file": name}
        message = await self._not_ready_for(request) or await self.channel.ask(
            request, self.checkpoint_timeout
        )
        if isinstance(message, NotDone):
            return message
        if not message["restored"]:
            return NotDone(message["reason"] or "the sandbox did not say why")
        logger.debug("%s sandbox %d restored in %.1f ms", self.backend, self.pid, message["ms"])
        self._tools_version = -1  # the guest's `tools` are rebuilt from the catalog
        return None

    async def interrupt(self) -> None:
        try:
            await self.channel.send({"type": "interrupt", "id": self._run_id})
        except SandboxDied:
            pass

    async def kill(self) -> None:
        try:
            await self.channel.send({"type": "kill", "id": self._run_id})
        except SandboxDied:
            pass

    async def renew(self, died: SandboxDied) -> bool:
        # The guest's `tools` went with its state; its JIT warm-up is not needed again: the
        # compiled code is the same.
        self._tools_version = -1
        if died.recycled:
            return True  # the same worker, back at its clean point: nothing of the program runs on
        # JavaScript the crashed program left running may outlive its worker (a busy loop survives
        # Worker.terminate, deno#35657): the process serves only this caller from now on, and a
        # caller that keeps crashing it gets a new one.
        self.reusable = False
        self._renewals += 1
        if self._renewals > MAX_RENEWALS:
            return False
        self._renewing = True
        return True

    async def _renewed(self) -> None:
        """Wait, once, for the new worker a crash started (`renew`). Raises SandboxDied."""
        if not self._renewing:
            return
        try:
            with anyio.fail_after(RENEW_TIMEOUT):
                await self._await_ready()
        except BaseException as error:
            # Not ready, or no longer waited for: never used half renewed.
            death = f"the sandbox could not replace its crashed worker: {error or 'it took too long'}"
            with contextlib.suppress(ProcessLookupError):
                self.watch.fail(death)
            if isinstance(error, (SandboxDied, TimeoutError)):
                raise SandboxDied(death) from None
            raise
        self._renewing = False

    async def close(self) -> None:
        if self.watch.closed:
            return
        with anyio.CancelScope(shield=True):
            await self.watch.end()
            self.channel.close()
