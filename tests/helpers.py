"""What tests share that is not a fixture: how a test server is started, called and watched, and
how a missing OS sandbox is reported."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import anyio
import anyio.abc
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from mcp_sandbox.app import App
from mcp_sandbox.backends.base import Backend
from mcp_sandbox.backends.pyodide import RUNNER_DIR, find_deno
from mcp_sandbox.server import build_server
from mcp_sandbox.settings import Settings

#: Settings every test server gets: small pool, quick kill after an ignored interrupt.
TEST_ENV = {
    # One sandbox kept ready: most test servers serve a session or two, and each Pyodide sandbox
    # started ahead costs a CPU-second of CI's two cores. Tests of concurrency set their own.
    "MCP_SANDBOX_POOL_SIZE": "1",
    "MCP_SANDBOX_INTERRUPT_GRACE": "1",
    "MCP_SANDBOX_LOG_LEVEL": "WARNING",
    # No fetching from the Pyodide CDN: tests of the default packages give their own index.
    "MCP_SANDBOX_DEFAULT_PACKAGES": "",
    # No JIT warm-up in idle time (about 2 CPU-s per Pyodide session): the suite's servers would
    # spend a third of CI's two cores on it. The conformance servers (tests/integration/conftest.py)
    # and test_faults.py's keep the default (DEFAULT_JIT), so its path is tested where programs are.
    "MCP_SANDBOX_PYODIDE_WARM_UP_ROUNDS": "0",
    # Baseline WebAssembly code only: V8's optimizing recompilation costs each Pyodide process about
    # 0.9 CPU-s, and the suite starts hundreds. The same servers as above keep it (DEFAULT_JIT).
    "MCP_SANDBOX_PYODIDE_TIER_UP": "false",
    # A host secret that must never be visible inside the sandbox.
    "MCP_SANDBOX_TEST_SECRET": "hunter2-host-secret",
    # A checkout run with PYTHONPATH (a git worktree, say): its servers run that code too.
    **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
}


#: V8's tier-up and the JIT warm-up as a server has them by default (TEST_ENV turns both off).
DEFAULT_JIT = {
    "MCP_SANDBOX_PYODIDE_WARM_UP_ROUNDS": str(Settings.model_fields["pyodide_warm_up_rounds"].default),
    "MCP_SANDBOX_PYODIDE_TIER_UP": "true",
}


def server_params(**env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env={**TEST_ENV, **env})


@asynccontextmanager
async def in_memory(**settings: Any) -> AsyncIterator[Client]:
    """The MCP server in this process, reached through the real MCP client in memory: for what the
    adapter does (schemas, descriptions, error mapping, bad input) no server process is needed."""
    defaults: dict[str, Any] = {
        "pool_size": 1,
        "interrupt_grace": 1,
        "default_packages": "",
        "pyodide_warm_up_rounds": 0,
        "pyodide_tier_up": False,
    }
    async with App(Settings(**{**defaults, **settings})) as app, Client(build_server(app)) as client:
        yield client


async def call(client: Client, code: str, **arguments: Any) -> dict[str, Any]:
    """Call execute_python and return its structured result, checking the envelope."""
    response = await client.call_tool("execute_python", {"code": code, **arguments})
    assert not response.is_error, response.content
    assert response.structured_content is not None
    return response.structured_content


def state_name(session_id: str) -> str:
    """What a session's files are called in a state folder (its state file, its lease)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:40]


def state_file(state_dir: Path, session_id: str) -> Path:
    """Where a server started with MCP_SANDBOX_STATE_DIR=`state_dir` checkpoints `session_id`."""
    return state_dir / "sessions" / f"{state_name(session_id)}.state"


def needs_pyodide(backend: str, why: str) -> None:
    if backend != "pyodide":
        pytest.skip(f"pyodide only: {why}")


def runner_deno(*args: str) -> subprocess.CompletedProcess[str]:
    """`deno ARGS` with the runner's configuration and the server's Deno cache, as the runner
    runs; skips, saying why, when Deno or Pyodide is not there yet."""
    settings = Settings()
    deno = find_deno(settings)
    deno_dir = settings.cache_dir / "deno"
    if deno is None or not any(deno_dir.glob("npm/*/pyodide")):
        pytest.skip("needs Deno and Pyodide in the cache (any test on the pyodide backend fetches them)")
    return subprocess.run(
        [str(deno), args[0], "--quiet", "--config", str(RUNNER_DIR / "deno.json"), *args[1:]],
        env={**os.environ, "DENO_DIR": str(deno_dir), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def needs_isolation(backend: str, why: str) -> None:
    """Skip on inprocess, which shares the server's interpreter by design (trusted code only)."""
    if backend == "inprocess":
        pytest.skip(f"not on inprocess: {why}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


#: How much of a test server's log a failure inside it shows.
LOG_TAIL_BYTES = 8000


def log_tail(log: BinaryIO) -> str:
    """The end of a server's log file (its stderr)."""
    log.seek(0, os.SEEK_END)
    log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
    return log.read().decode(errors="replace")


@asynccontextmanager
async def http_server(transport: str = "http", **env: str) -> AsyncIterator[tuple[int, anyio.abc.Process]]:
    """A server process serving `transport` (http or sse) on 127.0.0.1: (port, process). Stopped
    with SIGTERM (SIGKILL after 10 s) unless the test ended it itself. Its stderr goes to a file
    (a pipe nobody read would stop it once full), whose tail a failure inside shows on stderr."""
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", transport, "--port", str(port)]
    with tempfile.TemporaryFile() as log:
        process = await anyio.open_process(
            command,
            env=server_env(**{"MCP_SANDBOX_POOL_SIZE": "1", **env}),
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            await wait_for_port(port, process)
            yield port, process
        except BaseException:
            print(f"--- the test server's log, its end ---\n{log_tail(log)}", file=sys.stderr)
            raise
        finally:
            await stop_process(process)


class Serving(NamedTuple):
    """One server process of `two_instances`: its port, its process and a client of it."""

    port: int
    process: anyio.abc.Process
    client: Client


@asynccontextmanager
async def two_instances(**env: str) -> AsyncIterator[tuple[Serving, Serving]]:
    """Two server processes over streamable HTTP with the same environment (so the same store),
    each with a client of its own."""
    async with (
        http_server(**env) as (first, first_process),
        http_server(**env) as (second, second_process),
        Client(f"http://127.0.0.1:{first}/mcp") as a,
        Client(f"http://127.0.0.1:{second}/mcp") as b,
    ):
        yield Serving(first, first_process, a), Serving(second, second_process, b)


async def stop_process(process: anyio.abc.Process, sig: int = signal.SIGTERM, grace: float = 10) -> None:
    """Send `sig` to a process the test started (unless it has ended), SIGKILL it after `grace`
    seconds, and close it."""
    if process.returncode is None:
        process.send_signal(sig)
        with anyio.move_on_after(grace):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    await process.aclose()


async def wait_for_port(port: int, process: anyio.abc.Process, limit: float = 60) -> None:
    with anyio.fail_after(limit):
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"server exited with {process.returncode}")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
                continue
            await stream.aclose()
            return


def process_tree(root: int) -> dict[int, bytes]:
    """`root` and every process below it, each with its command line (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    tree: dict[int, bytes] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                tree[pid] = cmdline.read()
        except OSError:
            continue
        pending.extend(children.get(pid, []))
    return tree


def pid_with_environ(marker: str) -> int | None:
    """The process whose environment contains `marker` (how a test finds its server process)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if marker.encode() in environ.read():
                        return int(entry)
            except OSError:
                continue
    return None


def still_running(processes: dict[int, bytes]) -> dict[int, bytes]:
    """Those of `processes` that still exist with the same command line (a reused pid does not count)."""
    alive = {}
    for pid, command in processes.items():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read() == command:
                    alive[pid] = command
        except OSError:
            continue
    return alive


async def call_watched(
    client: Client, code_for_port: Callable[[int], str]
) -> tuple[dict[str, Any], list[str]]:
    """Call the program `code_for_port(port)` while a TCP listener on 127.0.0.1:port records
    every connection made to it: (the result, the connections)."""
    connections: list[str] = []

    async def note(stream: anyio.abc.SocketStream) -> None:
        connections.append("connected")
        await stream.aclose()

    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener, anyio.create_task_group() as group:
        group.start_soon(listener.serve, note)
        result = await call(client, code_for_port(port))
        group.cancel_scope.cancel()
    return result, connections


def server_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **TEST_ENV, **extra}


def missing_tier(tier: str, problem: str) -> None:
    """A test needs isolation `tier`, which this machine lacks: skip, saying why, unless the
    machine is known to have it (CI sets MCP_SANDBOX_TEST_EXPECT_TIERS), where that is a failure."""
    if tier in os.environ.get("MCP_SANDBOX_TEST_EXPECT_TIERS", "").split(","):
        pytest.fail(f"isolation {tier} should work on this machine, and does not: {problem}")
    pytest.skip(f"this machine does not offer isolation {tier}: {problem}")


def write_tokens(path: Path, table: dict[str, str]) -> None:
    """A tokens file (MCP_SANDBOX_AUTH_TOKENS_FILE) naming each principal's token, owner-only."""
    path.write_text(json.dumps(table), encoding="utf-8")
    path.chmod(0o600)


@asynccontextmanager
async def as_caller(port: int, token: str, **options: Any) -> AsyncIterator[Client]:
    """A real MCP client over streamable HTTP at 127.0.0.1:`port`, sending `token` as its bearer
    token; `options` go to Client (mode=...)."""
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        http_client,
        Client(
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client), **options
        ) as client,
    ):
        yield client


@asynccontextmanager
async def redis_server(folder: Path) -> AsyncIterator[str]:
    """A redis-server of its own on 127.0.0.1 (persistence off, its files in `folder`) answering
    PING: its URL. Skips the test, saying why, where redis-server is not installed."""
    async with restartable_redis(folder) as server:
        yield server.url


class RestartableRedis:
    """A redis-server of its own on 127.0.0.1 that a test stops, pauses and starts again on the
    same port (persistence off unless `appendonly`: a restart comes back empty). Made by
    `restartable_redis`."""

    def __init__(self, binary: str, folder: Path, *, appendonly: bool = False) -> None:
        self._binary, self._folder, self._appendonly = binary, folder, appendonly
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: anyio.abc.Process | None = None

    async def start(self) -> None:
        """Start it (again, on the same port) and wait until it answers PING."""
        import redis.asyncio

        assert self.process is None, "already running"
        command = [self._binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        command += ["--appendonly", "yes" if self._appendonly else "no", "--dir", str(self._folder)]
        self.process = process = await anyio.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = redis.asyncio.Redis.from_url(self.url, socket_connect_timeout=1, socket_timeout=1)
        try:
            with anyio.fail_after(10):
                while True:
                    if process.returncode is not None:
                        raise RuntimeError(f"redis-server exited with {process.returncode}")
                    try:
                        if await client.ping():
                            return
                    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                        await anyio.sleep(0.05)
        finally:
            await client.aclose()

    async def stop(self) -> None:
        """Stop it (SIGTERM, SIGKILL after 5 s): its port refuses connections until `start`."""
        process, self.process = self.process, None
        if process is not None:
            if process.returncode is None:
                process.send_signal(signal.SIGCONT)  # a paused one cannot end
            await stop_process(process, grace=5)

    def pause(self) -> None:
        """SIGSTOP it, as a network partition looks: connections open, nothing answered."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@asynccontextmanager
async def restartable_redis(folder: Path, *, appendonly: bool = False) -> AsyncIterator[RestartableRedis]:
    """A started `RestartableRedis` with its files in `folder`, stopped at the end. Skips the test,
    saying why, where redis-server is not installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (.ci/run installs Debian's redis-server)")
    folder.mkdir(parents=True, exist_ok=True)
    server = RestartableRedis(binary, folder, appendonly=appendonly)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def pyodide_in_own_cache(folder: Path, settings: Settings) -> Settings:
    """`settings` with `folder` as the cache folder, holding a copy of the Pyodide the usual one
    has (fetched there first if need be): the backend makes its snapshot and code cache anew."""
    from mcp_sandbox.backends.base import ExecutorHooks
    from mcp_sandbox.backends.registry import prepare_backend

    async with anyio.create_task_group() as task_group:
        await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        task_group.cancel_scope.cancel()
    shutil.copytree(settings.cache_dir / "deno" / "npm", folder / "deno" / "npm")
    return settings.model_copy(update={"cache_dir": folder})


async def computes_once(backend: Backend, task_group: anyio.abc.TaskGroup) -> None:
    """A new sandbox of `backend` computes 6 * 7; then it is closed and `task_group` ended."""
    executor = await backend.start()
    try:
        assert (await executor.run("6 * 7", 60)).result == "42"
    finally:
        await executor.close()
        task_group.cancel_scope.cancel()
