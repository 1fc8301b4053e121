"""The default backend: CPython compiled to WebAssembly (Pyodide), hosted by Deno.

Each sandbox is one Deno process running deno/runner.ts with almost no permissions: no
network, environment, subprocesses, FFI, system info or writes, and reading only its own
runner files and the Pyodide package. Deno's permission system is the wall; Pyodide's
virtual file system and environment are what sandboxed code sees.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from pydantic import ValidationError

from mcp_sandbox.backends import guest_runtime, protocol
from mcp_sandbox.backends.base import Backend, Executor, SandboxDied, SandboxStartError
from mcp_sandbox.result import GuestOutcome
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

GUEST_RUNTIME_SOURCE = Path(guest_runtime.__file__).read_text(encoding="utf-8")
STDERR_TAIL_BYTES = 4096


def runner_dir() -> Path:
    """deno/ inside the installed package, or at the top of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "deno", package.parent / "deno"):
        if (candidate / "runner.ts").is_file():
            return candidate
    raise SandboxStartError(f"the Deno runner (deno/runner.ts) is missing from {package}")


def pyodide_version() -> str:
    """The exact Pyodide version pinned in deno/deno.json."""
    config = json.loads((runner_dir() / "deno.json").read_text(encoding="utf-8"))
    specifier: str = config["imports"]["pyodide"]
    return specifier.rsplit("@", 1)[1]


def find_deno(settings: Settings) -> Path | None:
    """The Deno binary to use: the configured one (which must exist), else the `deno` package's."""
    if settings.deno_path is not None:
        return settings.deno_path if os.access(settings.deno_path, os.X_OK) else None
    try:
        # mypy sees the checkout's deno/ folder under this name; Python finds the package.
        from deno import find_deno_bin  # type: ignore[attr-defined,unused-ignore]

        found = Path(find_deno_bin())
    except (ImportError, FileNotFoundError, OSError):
        return None
    return found if os.access(found, os.X_OK) else None


class PyodideBackend(Backend):
    name: ClassVar[str] = "pyodide"

    def __init__(self, settings: Settings, task_group: anyio.abc.TaskGroup, deno: Path) -> None:
        self._settings = settings
        self._task_group = task_group
        self._deno = deno
        self._runner = runner_dir()
        self._deno_dir = settings.cache_dir / "deno"
        self._version = pyodide_version()
        self._pyodide_dir: Path | None = None

    def _sandbox_env(self) -> dict[str, str]:
        # The sandbox process gets a bare environment: nothing of the host's reaches even the runner.
        env = {"DENO_DIR": str(self._deno_dir), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
        if "NPM_CONFIG_REGISTRY" in os.environ:
            env["NPM_CONFIG_REGISTRY"] = os.environ["NPM_CONFIG_REGISTRY"]
        return env

    def _fetch_env(self) -> dict[str, str]:
        # Fetching runs no sandboxed code, and needs the host's proxy and CA settings.
        return {**os.environ, **self._sandbox_env(), "DENO_TLS_CA_STORE": "system,mozilla"}

    async def prepare(self) -> None:
        """Fetch Pyodide from the npm registry into the cache, once; later starts are offline."""
        self._deno_dir.mkdir(parents=True, exist_ok=True)
        command = [
            str(self._deno),
            "cache",
            "--config",
            str(self._runner / "deno.json"),
            str(self._runner / "runner.ts"),
            str(self._runner / "worker.ts"),
        ]
        with anyio.fail_after(600):
            done = await anyio.run_process(command, env=self._fetch_env(), check=False)
        if done.returncode != 0:
            raise SandboxStartError(
                f"Deno could not fetch Pyodide {self._version} from the npm registry: "
                + done.stderr.decode(errors="replace").strip()[-800:]
            )
        found = sorted((self._deno_dir / "npm").glob(f"*/pyodide/{self._version}"))
        if not found:
            raise SandboxStartError(f"Pyodide {self._version} is not in the Deno cache at {self._deno_dir}")
        self._pyodide_dir = found[0]
        logger.info("Pyodide %s ready in %s", self._version, self._pyodide_dir)

    def command(self) -> list[str]:
        if self._pyodide_dir is None:
            raise SandboxStartError("PyodideBackend.prepare() has not run")
        return [
            str(self._deno),
            "run",
            "--no-prompt",
            "--cached-only",
            "--config",
            str(self._runner / "deno.json"),
            # Only what loading the runner and Pyodide needs; every other permission stays denied.
            f"--allow-read={self._runner},{self._pyodide_dir}",
            str(self._runner / "runner.ts"),
        ]

    async def start(self) -> Executor:
        process = await anyio.open_process(self.command(), env=self._sandbox_env(), start_new_session=True)
        executor = PyodideExecutor(process, self._settings.max_output_chars)
        self._task_group.start_soon(executor.read_stdout)
        self._task_group.start_soon(executor.read_stderr)
        try:
            with anyio.fail_after(self._settings.start_timeout):
                await executor.initialize()
        except (SandboxDied, TimeoutError) as error:
            await executor.close()
            raise SandboxStartError(
                f"Pyodide sandbox failed to start: {error}{executor.stderr_tail()}"
            ) from None
        return executor

    def describe(self) -> str:
        return (
            f"Python runs in Pyodide {self._version} (CPython compiled to WebAssembly) inside a Deno "
            "process with no network, no host files and no host environment variables; "
            "the standard library is available."
        )


class PyodideExecutor(Executor):
    backend: ClassVar[str] = "pyodide"

    def __init__(self, process: anyio.abc.Process, max_output_chars: int) -> None:
        self._process = process
        self._token = secrets.token_hex(16)
        self._max_line = protocol.max_line_bytes(max_output_chars)
        self._send_messages: MemoryObjectSendStream[dict[str, Any]]
        self._messages: MemoryObjectReceiveStream[dict[str, Any]]
        self._send_messages, self._messages = anyio.create_memory_object_stream[dict[str, Any]](16)
        self._stdin_lock = anyio.Lock()
        self._stderr_tail: deque[bytes] = deque()
        self._stderr_len = 0
        self._run_id = 0
        self._closed = False
        self._death: str | None = None
        self.forged_lines = 0

    @property
    def alive(self) -> bool:
        return not self._closed and self._death is None and self._process.returncode is None

    @property
    def pid(self) -> int:
        return self._process.pid

    async def initialize(self) -> None:
        await self._send({"type": "init", "token": self._token, "guest_runtime": GUEST_RUNTIME_SOURCE})
        message = await self._next_message()
        if message.get("type") != "ready":
            raise SandboxDied(str(message.get("message", message)))
        logger.debug("pyodide sandbox %d ready in %s ms", self.pid, message.get("load_ms"))

    async def _submit(self, code: str, max_output_chars: int) -> None:
        self._run_id += 1
        await self._send(
            {"type": "run", "id": self._run_id, "code": code, "max_output_chars": max_output_chars}
        )

    async def _await_outcome(self) -> GuestOutcome:
        while True:
            message = await self._next_message()
            kind, run_id = message.get("type"), message.get("id")
            if kind == "result" and run_id == self._run_id:
                try:
                    return GuestOutcome.model_validate(message.get("outcome"))
                except ValidationError:
                    raise SandboxDied("the sandbox sent a malformed result") from None
            if kind == "crashed" and run_id == self._run_id:
                raise SandboxDied(f"the sandbox crashed: {message.get('message')}")
            if kind == "fatal":
                raise SandboxDied(f"the sandbox runner failed: {message.get('message')}")
            # Anything else is stale or forged by the sandbox itself: it only concerns this run.

    async def interrupt(self) -> None:
        try:
            await self._send({"type": "interrupt", "id": self._run_id})
        except SandboxDied:
            pass

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

    async def _next_message(self) -> dict[str, Any]:
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
                message = protocol.open_envelope(line, self._token)
                if message is None:
                    self.forged_lines += 1
                    continue
                await self._send_messages.send(message)
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
        return "the sandbox was closed" if code is None else f"the sandbox process exited with status {code}"

    async def _death_report(self) -> SandboxDied:
        """Why the sandbox went away, once its exit status and last words are in."""
        if self._death is None and not self._closed:
            with anyio.move_on_after(1):
                await self._process.wait()
        reason, tail = self._death_reason(), self.stderr_tail()
        if "out of memory" in tail.lower() or "heap limit" in tail.lower():
            return SandboxDied(f"{reason}: out of memory{tail}", "MemoryLimit")
        return SandboxDied(reason + tail)
