"""The process watch: a sandbox's child process as the host watches it. Its memory (the
watchdog), the tail of its stderr, whether it still runs, and why it ended, in words for the
caller."""

from __future__ import annotations

import functools
import os
import signal
from collections import deque
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from mcp_sandbox.backends.base import SandboxDied

STDERR_TAIL_BYTES = 4096
MB = 1024 * 1024
#: Seconds between two looks at a sandbox's resident memory.
MEMORY_POLL = 0.1


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


class ProcessWatch:
    """Watches one sandbox process: kills it past its memory limit, keeps the tail of its stderr,
    and says why it ended (`report`). The host ending it on purpose (`end`) is no death."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self._process = process
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_len = 0
        #: Why the host ended the process, when it did so for a reason (None: it did not).
        self.death: str | None = None
        self._over_memory = False
        #: The host ended the process on purpose (`end`): its sandbox was closed.
        self.closed = False

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def alive(self) -> bool:
        return not self.closed and self.death is None and self._process.returncode is None

    @property
    def killed_from_outside(self) -> bool:
        """Ended by a SIGKILL this host did not send."""
        return self.death is None and not self.closed and self._process.returncode == -signal.SIGKILL

    def fail(self, reason: str) -> None:
        """Kill the process because of `reason`, which is then why it died."""
        self.death = reason
        self._process.kill()

    async def end(self) -> None:
        """End the process on purpose, and wait until it is gone."""
        self.closed = True
        if self._process.returncode is None:
            self._process.kill()
        await self._process.wait()
        await self._process.aclose()

    async def wait(self) -> None:
        """Wait until the process has ended."""
        await self._process.wait()

    async def watch_memory(self, limit: int | Callable[[], int]) -> None:
        """Kill the sandbox when its resident memory passes `limit` bytes (or what `limit()` says
        at each look): the host-side cap for a runtime (Pyodide) whose JavaScript buffers no
        in-process limit bounds."""
        while self._process.returncode is None and not self.closed:
            used = resident_bytes(self._process.pid)
            bound = limit() if callable(limit) else limit
            if used is not None and used > bound:
                self._over_memory = True
                self.fail(
                    f"the sandbox used {used // MB} MB of memory, over its limit of {bound // MB} MB "
                    "(MCP_SANDBOX_MEMORY_MB); it was stopped"
                )
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

    def reason(self) -> str:
        """Why the process is unusable, as far as is known now."""
        if self.death is not None:
            return self.death
        code = self._process.returncode
        if code is None:
            return "the sandbox was closed"
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            hint = " (its CPU-time limit)" if name == "SIGXCPU" else ""
            return f"the sandbox process was killed by {name}{hint}"
        return f"the sandbox process exited with status {code}"

    async def report(self, *, tail: bool = True) -> SandboxDied:
        """Why the sandbox went away, once its exit status and last words are in (with the tail
        of its stderr, unless not `tail`)."""
        if self.death is None and not self.closed:
            with anyio.move_on_after(1):
                await self._process.wait()
        reason, last = self.reason(), self.stderr_tail()
        said = last if tail else ""
        if self._over_memory:
            return SandboxDied(reason, "MemoryLimit")
        if "out of memory" in last.lower() or "heap limit" in last.lower():
            return SandboxDied(f"{reason}: out of memory{said}", "MemoryLimit")
        return SandboxDied(reason + said)
