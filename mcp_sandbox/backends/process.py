"""Host side of a sandbox that is a child process speaking the runner protocol (protocol.py):
the Pyodide runner and the CPython worker."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import signal
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, overload

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import Field, TypeAdapter, ValidationError

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
from mcp_sandbox.protocol import GuestOutcome, RunnerMessage, reply_error

logger = logging.getLogger(__name__)


def _guest_source(name: str) -> str:
    """The source of guest module `name` (mcp_sandbox.x.y), read from this installed package."""
    path = Path(protocol.__file__).parent.joinpath(*name.split(".")[1:])
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text(encoding="utf-8")


#: What a runner loads before anything else, in order: the protocol, then the guest runtime.
GUEST_MODULES: list[tuple[str, str]] = [
    (name, _guest_source(name)) for name in ("mcp_sandbox.protocol", *protocol.GUEST_MODULES)
]
#: The requests a sandbox answers between runs, and the type of each one's answer.
BetweenRuns = protocol.RecycleMessage | protocol.CheckpointMessage | protocol.RestoreMessage
BetweenRunsAnswer = protocol.RecycledMessage | protocol.CheckpointedMessage | protocol.RestoredMessage
ANSWERS = {"recycle": "recycled", "checkpoint": "checkpointed", "restore": "restored"}
STDERR_TAIL_BYTES = 4096
MB = 1024 * 1024
#: Seconds between two looks at a sandbox's resident memory.
MEMORY_POLL = 0.1
#: Seconds a sandbox may take to replace a crashed worker (pyodide: about 0.4 s of a core).
RENEW_TIMEOUT = 30.0
#: Workers one sandbox replaces before it is closed instead.
MAX_RENEWALS = 3

#: Validates what a runner sends (refusing any field the protocol does not name).
RUNNER_MESSAGE: TypeAdapter[RunnerMessage] = TypeAdapter(
    Annotated[RunnerMessage, Field(discriminator="type")]
)


@dataclass(frozen=True)
class Malformed:
    """A genuine runner line whose message does not match the protocol."""

    kind: object
    id: object
    call: object = None


def resident_bytes(pid: int) -> int | None:
    """The process's resident memory (VmRSS), or None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


async def start_process_executor(
    executor: ProcessExecutor,
    task_group: anyio.abc.TaskGroup,
    start_timeout: float,
    memory_limit: int | None = None,
) -> ProcessExecutor:
    """Wire up the executor's readers (and memory watchdog, given a limit in bytes) and wait for
    its `ready`; raises SandboxStartError."""
    task_group.start_soon(executor.read_stdout)
    task_group.start_soon(executor.read_stderr)
    if memory_limit is not None and resident_bytes(executor.pid) is not None:
        task_group.start_soon(executor.watch_memory, memory_limit)
    try:
        with anyio.fail_after(start_timeout):
            await executor.initialize()
    except (SandboxDied, TimeoutError) as error:
        killed = executor.killed_from_outside
        await executor.close()
        raise SandboxStartError(
            f"{executor.backend} sandbox failed to start: {error}{executor.stderr_tail()}", killed=killed
        ) from None
    return executor


#: Start-up warnings said once per server, not once per sandbox.
_said: set[str] = set()


@functools.cache
def _proc_is_ours() -> bool:
    """Whether /proc shows this process's PID namespace (it may not, under `unshare --pid`)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False


def is_running(pid: int) -> bool:
    """False when process `pid` has ended, even before anyone reaped it (a zombie); True when it
    runs, or where there is no /proc of this PID namespace to tell."""
    if not _proc_is_ours():
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


class ProcessExecutor(Executor):
    """A sandbox that is a child process speaking the runner protocol (protocol.py) on its
    stdin and stdout. Subclasses name the backend and may interrupt differently."""

    #: Seconds a checkpoint or a restore may take before the sandbox counts as not answering.
    checkpoint_timeout: ClassVar[float] = 20.0

    def __init__(
        self,
        process: anyio.abc.Process,
        limits: ExecutorLimits,
        hooks: ExecutorHooks,
        **init_fields: str | list[str] | int,
    ) -> None:
        """`init_fields`: the host folders the sandbox reads, the hosts it may reach and the
        packages it preloads, as the `init` message names them."""
        super().__init__(limits, hooks)
        self._process = process
        self._token = secrets.token_hex(16)
        self._max_line = protocol.max_line_bytes(
            limits.max_output_chars,
            limits.guest["output"]["max_bytes"],
            limits.guest["max_kept_output_chars"],
        )
        self._send_messages: MemoryObjectSendStream[RunnerMessage | Malformed]
        self._messages: MemoryObjectReceiveStream[RunnerMessage | Malformed]
        self._send_messages, self._messages = anyio.create_memory_object_stream[RunnerMessage | Malformed](16)
        self._stdin_lock = anyio.Lock()
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_len = 0
        self._run_id = 0
        self._closed = False
        self._init: protocol.InitMessage = {
            "type": "init",
            "token": self._token,
            "guest_modules": GUEST_MODULES,
            "limits": limits.guest,
            **init_fields,  # type: ignore[typeddict-item]
        }
        self._death: str | None = None
        self._over_memory = False
        #: A crash started a new worker (`renew`), whose `ready` the next request waits for.
        self._renewing = False
        self._renewals = 0

    @property
    def alive(self) -> bool:
        return not self._closed and self._death is None and self._process.returncode is None

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def killed_from_outside(self) -> bool:
        """Ended by a SIGKILL this host did not send."""
        return self._death is None and not self._closed and self._process.returncode == -signal.SIGKILL

    async def initialize(self) -> None:
        await self._send(self._init)
        await self._await_ready()

    async def _await_ready(self) -> None:
        message = await self._next_message()
        if isinstance(message, Malformed):
            raise SandboxDied(f"the sandbox's first message, {message.kind!r}, did not match the protocol")
        if message["type"] == "fatal" or message["type"] == "crashed":
            raise SandboxDied(message["message"])
        if message["type"] != "ready":
            raise SandboxDied(f"the sandbox sent {message['type']!r} before it was ready")
        logger.debug("%s sandbox %d ready in %d ms", self.backend, self.pid, message["load_ms"])
        for failed in message.get("preload_failed", []):
            if failed not in _said:
                _said.add(failed)
                logger.warning("a sandbox could not preload %s", failed)

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        await self._renewed()
        if not is_running(self.pid):
            # Killed between calls, before anything here saw it: the program never starts.
            raise SandboxDied("the sandbox process had ended before the call")
        self._drain_stale_messages()
        self._run_id += 1
        message: protocol.RunMessage = {"type": "run", "id": self._run_id, "code": code}
        if tools_manifest is not None:
            message["tools"] = tools_manifest
        await self._send(message)

    async def _await_outcome(self) -> GuestOutcome:
        while True:
            message = await self._next_message()
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
                    await self._deliver_tool_result(message.call, reply_error("the tool call was malformed"))
                continue
            if message["type"] == "result" and message["id"] == self._run_id:
                return message["outcome"]
            if message["type"] == "crashed" and message["id"] == self._run_id:
                renewed = message.get("renewed", False)
                raise SandboxDied(f"the sandbox crashed: {message['message']}", renewed=renewed)
            if message["type"] == "fatal":
                raise SandboxDied(f"the sandbox runner failed: {message['message']}")
            if message["type"] == "progress":
                self._output(message["line"])
            if message["type"] == "tool_call":
                self._start_tool_call(
                    message["call"],
                    message["server"],
                    message["tool"],
                    message["arguments"],
                    self._deliver_tool_result,
                )
            if message["type"] == "describe":
                self._start_describe(
                    message["call"], message["query"], message["limit"], self._deliver_tool_result
                )
            # Anything else is stale or forged by the sandbox itself: it only concerns this run.

    @overload
    async def _between_runs(
        self, request: protocol.RecycleMessage, timeout: float
    ) -> protocol.RecycledMessage | NotDone: ...
    @overload
    async def _between_runs(
        self, request: protocol.CheckpointMessage, timeout: float
    ) -> protocol.CheckpointedMessage | NotDone: ...
    @overload
    async def _between_runs(
        self, request: protocol.RestoreMessage, timeout: float
    ) -> protocol.RestoredMessage | NotDone: ...
    async def _between_runs(self, request: BetweenRuns, timeout: float) -> BetweenRunsAnswer | NotDone:
        """Send a request between runs and wait for its answer (the message of type
        `ANSWERS[request type]`), or say why there is none. Its `id` is set here."""
        if not self.alive:
            return NotDone("the sandbox is not alive")
        try:
            await self._renewed()
        except SandboxDied as error:
            return NotDone(f"the sandbox died: {error}")
        self._drain_stale_messages()
        self._run_id += 1
        request["id"] = self._run_id
        answer = ANSWERS[request["type"]]
        try:
            await self._send(request)
            with anyio.fail_after(timeout):
                while True:
                    message = await self._next_message()
                    if isinstance(message, Malformed) or message["type"] != answer:
                        continue
                    if message["id"] == self._run_id:  # type: ignore[typeddict-item]
                        return message  # type: ignore[return-value]
        except SandboxDied as error:
            return NotDone(f"the sandbox died: {error}")
        except TimeoutError:
            return NotDone(f"the sandbox did not answer within {timeout:g} s")

    async def checkpoint(self) -> Checkpoint | NotDone:
        name = f"checkpoint-{self._run_id + 1}"
        try:
            message = await self._between_runs(
                {"type": "checkpoint", "id": 0, "file": name}, self.checkpoint_timeout
            )
            if isinstance(message, NotDone):
                return message
            if not message["saved"]:
                return NotDone(message["reason"] or "the sandbox did not say why")
            limit = self.limits.max_state_bytes
            try:
                payload = await self._read_checkpoint(name, limit)
            except OSError as error:
                return NotDone(f"the checkpoint file could not be read: {error}")
            if len(payload) > limit:
                return NotDone(f"the session's state is over {limit // MB} MB (MCP_SANDBOX_MAX_STATE_MB)")
        finally:
            await self._remove_checkpoint(name)
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
            await self._hand_in_checkpoint(name, state)
        except OSError as error:
            return NotDone(f"the checkpoint could not be handed to the sandbox: {error}")
        message = await self._between_runs(
            {"type": "restore", "id": 0, "file": name}, self.checkpoint_timeout
        )
        if isinstance(message, NotDone):
            return message
        if not message["restored"]:
            return NotDone(message["reason"] or "the sandbox did not say why")
        logger.debug("%s sandbox %d restored in %.1f ms", self.backend, self.pid, message["ms"])
        self._tools_version = -1  # the guest's `tools` are rebuilt from the catalog
        return None

    async def _read_checkpoint(self, name: str, limit: int) -> bytes:
        """The checkpoint file `name` the sandbox wrote, read to at most `limit` + 1 bytes (more
        is over the limit). Raises OSError."""
        raise OSError(f"{self.backend} sandboxes do not write checkpoints")

    async def _remove_checkpoint(self, name: str) -> None:
        """Delete the checkpoint file `name`, if it is there."""

    async def _hand_in_checkpoint(self, name: str, state: bytes) -> None:
        """Write a checkpoint where the sandbox's `restore` reads it, as file `name`. Raises OSError."""
        raise OSError(f"{self.backend} sandboxes do not restore checkpoints")

    def _drain_stale_messages(self) -> None:
        """Drop what arrived between runs: a program may leave a timer that forges messages."""
        while True:
            try:
                self._messages.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return

    async def _deliver_tool_result(self, call: int, reply: str) -> None:
        await self._send({"type": "tool_result", "call": call, "reply": reply})

    async def interrupt(self) -> None:
        try:
            await self._send({"type": "interrupt", "id": self._run_id})
        except SandboxDied:
            pass

    async def kill(self) -> None:
        try:
            await self._send({"type": "kill", "id": self._run_id})
        except SandboxDied:
            pass

    async def renew(self) -> bool:
        # JavaScript the crashed program left running may outlive its worker (a busy loop survives
        # Worker.terminate, deno#35657): the process serves only this caller from now on, and a
        # caller that keeps crashing it gets a new one.
        self.reusable = False
        self._renewals += 1
        if self._renewals > MAX_RENEWALS:
            return False
        # The new worker's guest has no `tools` yet; its JIT warm-up is not needed again: the
        # compiled code it shares with the old one is warm.
        self._tools_version = -1
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
            self._death = f"the sandbox could not replace its crashed worker: {error or 'it took too long'}"
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            if isinstance(error, (SandboxDied, TimeoutError)):
                raise SandboxDied(self._death) from None
            raise
        self._renewing = False

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with anyio.CancelScope(shield=True):
            if self._process.returncode is None:
                self._process.kill()
            await self._process.wait()
            await self._process.aclose()
            self._send_messages.close()

    async def _send(self, message: protocol.HostMessage) -> None:
        if self._process.stdin is None or not self.alive:
            raise SandboxDied(self._death_reason())
        try:
            async with self._stdin_lock:
                await self._process.stdin.send(protocol.encode(message))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            raise SandboxDied(self._death_reason()) from None

    async def _next_message(self) -> RunnerMessage | Malformed:
        try:
            return await self._messages.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise await self._death_report() from None

    async def read_stdout(self) -> None:
        """Feed genuine runner messages to `_messages` until the process ends."""
        assert self._process.stdout is not None
        reader = BufferedByteReceiveStream(self._process.stdout)
        try:
            while True:
                line = await reader.receive_until(b"\n", self._max_line)
                raw = protocol.open_envelope(line, self._token)
                if raw is None:
                    continue  # not from the runner: forged by the sandbox
                await self._send_messages.send(_parse(raw))
        except anyio.DelimiterNotFound:
            self._death = "the sandbox wrote a line longer than the protocol allows"
            self._process.kill()
        except (
            anyio.EndOfStream,
            anyio.IncompleteRead,
            anyio.BrokenResourceError,
            anyio.ClosedResourceError,
        ):
            pass
        finally:
            self._send_messages.close()

    async def watch_memory(self, limit: int) -> None:
        """Kill the sandbox when its resident memory passes `limit` bytes: the host-side cap for
        a runtime (Pyodide) whose WebAssembly memory no in-process limit bounds."""
        while self._process.returncode is None and not self._closed:
            used = resident_bytes(self.pid)
            if used is not None and used > limit:
                self._over_memory = True
                self._death = (
                    f"the sandbox used {used // MB} MB of memory, over its limit of {limit // MB} MB "
                    "(MCP_SANDBOX_MEMORY_MB); it was stopped"
                )
                self._process.kill()
                return
            await anyio.sleep(MEMORY_POLL)

    async def read_stderr(self) -> None:
        """Keep the tail of the runner's stderr for error messages; never let the pipe fill."""
        assert self._process.stderr is not None
        try:
            async for chunk in self._process.stderr:
                self._stderr_tail.append(chunk)
                self._stderr_len += len(chunk)
                while self._stderr_len > STDERR_TAIL_BYTES and len(self._stderr_tail) > 1:
                    self._stderr_len -= len(self._stderr_tail.popleft())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass

    def stderr_tail(self) -> str:
        text = b"".join(self._stderr_tail).decode(errors="replace").strip()[-STDERR_TAIL_BYTES:]
        return f"\n{text}" if text else ""

    def _death_reason(self) -> str:
        if self._death is not None:
            return self._death
        code = self._process.returncode
        if code is None:
            return "the sandbox was closed"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            hint = " (its CPU-time limit)" if name == "SIGXCPU" else ""
            return f"the sandbox process was killed by {name}{hint}"
        return f"the sandbox process exited with status {code}"

    async def _death_report(self) -> SandboxDied:
        """Why the sandbox went away, once its exit status and last words are in."""
        if self._death is None and not self._closed:
            with anyio.move_on_after(1):
                await self._process.wait()
        reason, tail = self._death_reason(), self.stderr_tail()
        if self._over_memory:
            return SandboxDied(reason, "MemoryLimit")
        if "out of memory" in tail.lower() or "heap limit" in tail.lower():
            return SandboxDied(f"{reason}: out of memory{tail}", "MemoryLimit")
        return SandboxDied(reason + tail)


def _parse(raw: dict[str, Any]) -> RunnerMessage | Malformed:
    try:
        return RUNNER_MESSAGE.validate_python(raw)
    except ValidationError:
        return Malformed(raw.get("type"), raw.get("id"), raw.get("call"))
