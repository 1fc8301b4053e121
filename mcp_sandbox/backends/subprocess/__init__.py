"""The CPython fallback: each sandbox is a worker process of the server's own interpreter.

It runs whatever the host has installed (numpy, pandas), under resource limits, with an empty
environment and a private temporary directory. It is not isolated from the host's files or
network: it is the fallback for when Deno is not available, not a wall.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.abc

from mcp_sandbox.backends.base import Backend, Executor, ExecutorHooks, ExecutorLimits, prepare_workspace
from mcp_sandbox.backends.process import ProcessExecutor, start_process_executor
from mcp_sandbox.protocol import GuestFile, ProcessLimits
from mcp_sandbox.result import read_output_file
from mcp_sandbox.settings import Settings

WORKER = Path(__file__).resolve().with_name("worker.py")
#: A new user namespace (so no privilege is needed) with a new, empty network namespace.
UNSHARE_ARGS = ["--user", "--map-root-user", "--net", "--"]

logger = logging.getLogger(__name__)


class SubprocessBackend(Backend):
    name: ClassVar[str] = "subprocess"

    def __init__(self, settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> None:
        super().__init__(settings, hooks)
        self._task_group = task_group
        limits: ProcessLimits = {
            "memory_mb": settings.memory_mb,
            "cpu_seconds": settings.cpu_seconds,
            "open_files": settings.max_open_files,
            "file_mb": settings.max_file_mb,
            "processes": settings.max_processes,
        }
        self._process_limits = json.dumps(limits)
        #: The command prefix that puts a worker in its own network namespace, when Linux allows it.
        self.isolation: list[str] = []

    async def prepare(self) -> None:
        unshare = shutil.which("unshare")
        if unshare is not None:
            probe = [unshare, *UNSHARE_ARGS, "true"]
            with anyio.move_on_after(10):
                if (await anyio.run_process(probe, check=False)).returncode == 0:
                    self.isolation = [unshare, *UNSHARE_ARGS]
        if self.isolation:
            logger.info("subprocess backend: each worker has its own empty network namespace (no network)")
        else:
            logger.warning(
                "subprocess backend: user namespaces are not available (unshare), so workers share the "
                "host's network"
            )

    async def start(self) -> Executor:
        workdir = Path(tempfile.mkdtemp(prefix="mcp-sandbox-"))
        prepare_workspace(workdir, self._settings.data_dir)
        # No host variable reaches the worker; single-threaded maths keeps it inside RLIMIT_AS.
        env = {
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "LANG": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
        }
        command = [*self.isolation, sys.executable, "-I", str(WORKER), self._process_limits]
        process = await anyio.open_process(command, cwd=workdir, env=env, start_new_session=True)
        folders = {"data_dir": str(self._settings.data_dir)} if self._settings.data_dir is not None else {}
        executor = SubprocessExecutor(process, self._limits, self._hooks, workdir, **folders)
        return await start_process_executor(executor, self._task_group, self._settings.start_timeout)

    def describe(self) -> str:
        return (
            f"Python {sys.version.split()[0]} runs in a separate CPython process with the server's "
            f"packages (numpy and pandas where installed), limited to {self._settings.memory_mb} MB of "
            "memory, with an empty environment and a private temporary working directory"
            + ("; it has no network." if self.isolation else ".")
        )


class SubprocessExecutor(ProcessExecutor):
    backend: ClassVar[str] = "subprocess"

    def __init__(
        self,
        process: anyio.abc.Process,
        limits: ExecutorLimits,
        hooks: ExecutorHooks,
        workdir: Path,
        **init_fields: str,
    ) -> None:
        super().__init__(process, limits, hooks, **init_fields)
        self._workdir = workdir

    def _read_output_file(self, file: GuestFile, path: str) -> bytes | None:
        return read_output_file(self._workdir, path)

    async def interrupt(self) -> None:
        if self._process.returncode is None:
            self._process.send_signal(signal.SIGINT)

    async def close(self) -> None:
        await super().close()
        shutil.rmtree(self._workdir, ignore_errors=True)
