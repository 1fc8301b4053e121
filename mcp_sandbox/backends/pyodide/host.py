"""Runner processes that host several sandboxes: each sandbox a Pyodide worker of one Deno
process, all of them instantiated from the module the process compiled once.

A process holds the sandboxes of one principal at a time (`claim`): it is bound to the
principal of its first sandbox handed out, and free again once none of its sandboxes is. A
process with a worker that may still be running code it could not stop (closed mid-run, given
up on) is retiring: it takes no new sandbox, none of its sandboxes is handed to
another caller, and it ends once its last sandbox is closed.
"""

from __future__ import annotations

import itertools
import logging
import shutil
from pathlib import Path

import anyio
import anyio.abc

from mcp_sandbox.backends.base import SandboxDied
from mcp_sandbox.backends.channel import RunnerChannel, RunnerPipe
from mcp_sandbox.backends.watch import ProcessWatch

logger = logging.getLogger(__name__)


class RunnerProcess:
    """One Deno runner process and the sandboxes it hosts, at most `capacity`, numbered from 0.
    Its checkpoint folder holds one folder per sandbox."""

    def __init__(
        self,
        process: anyio.abc.Process,
        token: str,
        checkpoint_dir: Path,
        *,
        capacity: int,
        max_line: int,
        principals: bool,
    ) -> None:
        """`principals`: the server has more than one, so a process is bound to one at a time."""
        self.watch = ProcessWatch(process)
        self.pipe = RunnerPipe(process, self.watch, token, max_line, enveloped=True)
        self.checkpoint_dir = checkpoint_dir
        self.capacity = capacity
        self._principals = principals
        self._numbers = itertools.count()
        #: The sandboxes it hosts, by number, and the ones handed out (not in the pool).
        self._hosted: set[int] = set()
        self._claimed: set[int] = set()
        #: Whose sandboxes it holds while any is handed out (None: nobody's).
        self.principal: str | None = None
        #: Takes no new sandbox, and its sandboxes serve only the callers they already serve.
        self.retiring = False

    @property
    def pid(self) -> int:
        return self.watch.pid

    @property
    def hosted(self) -> int:
        return len(self._hosted)

    def has_room(self, principal: str | None) -> bool:
        """Whether a new sandbox for `principal` (None: for whoever comes) may go here."""
        if not self.watch.alive or self.retiring or len(self._hosted) >= self.capacity:
            return False
        return self.principal is None or self.principal == principal

    def add(self) -> int:
        """A new sandbox's number; its checkpoint folder is made."""
        number = next(self._numbers)
        self.folder(number).mkdir(mode=0o700)
        self._hosted.add(number)
        return number

    def folder(self, sandbox: int) -> Path:
        return self.checkpoint_dir / f"sandbox-{sandbox}"

    def serves(self, principal: str) -> bool:
        return not self._principals or self.principal in (None, principal)

    def claim(self, sandbox: int, principal: str) -> None:
        self._claimed.add(sandbox)
        if self._principals:
            self.principal = principal

    def unclaim(self, sandbox: int) -> None:
        self._claimed.discard(sandbox)
        if not self._claimed:
            self.principal = None

    def retire(self, why: str) -> None:
        if not self.retiring:
            self.retiring = True
            logger.info("pyodide process %d takes no new sandboxes: %s", self.pid, why)

    async def remove(self, sandbox: int) -> None:
        """Close sandbox `sandbox`; the process ends with its last one."""
        if sandbox not in self._hosted:
            return
        self._hosted.discard(sandbox)
        self.unclaim(sandbox)
        self.pipe.close(sandbox)
        shutil.rmtree(self.folder(sandbox), ignore_errors=True)
        if not self._hosted:
            await self.end()
            return
        try:
            await self.pipe.write({"type": "close"}, sandbox)
        except SandboxDied:
            pass

    async def end(self) -> None:
        """End the process and every sandbox in it."""
        self.retiring = True
        await self.watch.end()
        shutil.rmtree(self.checkpoint_dir, ignore_errors=True)


class HostedWatch:
    """The watch of one sandbox in a runner process: it dies with its process, or alone, when its
    runner ends it or the host gives up on it. Never shows the process's stderr, which any of the
    process's sandboxes may have written."""

    def __init__(self, host: RunnerProcess, sandbox: int, task_group: anyio.abc.TaskGroup) -> None:
        self._host = host
        self._sandbox = sandbox
        self._task_group = task_group
        #: Why it is gone while its process goes on (None: it is not).
        self._ended: str | None = None
        self.closed = False

    def channel(self) -> RunnerChannel:
        return RunnerChannel(self._host.pipe, self._sandbox, self, self.ended)

    @property
    def alive(self) -> bool:
        return not self.closed and self._ended is None and self._host.watch.alive

    @property
    def killed_from_outside(self) -> bool:
        return self._host.watch.killed_from_outside

    def ended(self, reason: str) -> None:
        """Its runner ended it, after its worker ended itself or failed: nothing of it runs on."""
        if self._ended is None:
            self._ended = reason

    def fail(self, reason: str) -> None:
        # The host gave up on it, perhaps busy in JavaScript that Worker.terminate does not stop
        # (deno#35657): its process takes no new sandboxes.
        self.ended(reason)
        self._host.retire(f"sandbox {self._sandbox} was given up: {reason}")
        self._task_group.start_soon(self._host.remove, self._sandbox)

    async def end(self) -> None:
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self._host.remove(self._sandbox)

    def stderr_tail(self) -> str:
        return ""

    def reason(self) -> str:
        if self._ended is not None:
            return self._ended
        if self.closed:
            return "the sandbox was closed"
        return self._host.watch.reason()

    async def report(self) -> SandboxDied:
        if self._ended is not None or self.closed:
            return SandboxDied(self.reason())
        return await self._host.watch.report(tail=False)
