"""Several Pyodide sandboxes per Deno process (issue 40): every row before and after, in one run.

Run from the repository root:  .venv/bin/python bench/bench_cohosting.py [--quick] [--json PATH]

Each row is measured twice, back to back: with MCP_SANDBOX_SANDBOXES_PER_PROCESS=1 (before: a
Deno process per sandbox) and =4 (after, the default), each time against its own server process
(`python -m mcp_sandbox`, pyodide, the real MCP client), printed side by side. Every server gets
a packages folder holding the real C extension `dummy-pyodide-ext-test` (fetched as the tests
fetch it, tests/native.py), no default packages and nothing preloaded. "Settled" below means: at
least 3 s after the last call (past the idle-time checkpoint at 2 s), the pool full (from the
server's /metrics, over HTTP) and the server's process tree using under 15% of a core over 0.5 s;
at most 30 s.

1. Mixed load over streamable HTTP, pool of 4: 16 clients at once, each with an MCP client and a
   session of its own, 20 calls each, in turn `x = globals().get('x', 0) + 1`,
   `import time; time.sleep(5)` (timeout 0.5), `import os; os._exit(3)`, `1 + 1` without a session,
   `x = globals().get('x', 0) + 1`. Calls/s (all calls over the wall time), p50 and p99 of the
   answered calls, calls answered (one that raises or takes over 60 s is not), and the Deno runner
   processes started during the load (the server's process tree polled every 0.1 s: distinct
   processes whose command line holds runner.ts, less those there before).
2. Calls without a session, back to back, over stdio, pool of 2: 200 calls of `1 + 1`, after 3
   unmeasured ones and a settle. Calls/s and p50.
3. The same, each importing the C extension (not preloaded: each call loads it again into a
   recycled sandbox): 100 calls. Calls/s and p50.
4. A new session's first call with the pool warm, over HTTP, pool of 2: 10 new sessions, each
   after a settle; the sessions stay, so each takes a sandbox never used before. p50.
5. 8 new sessions back to back, over HTTP, pool of 1, after a settle: p50 of their first calls
   (after the first, each waits for a start).
6. Memory, the server of row 5 settled: 8 live sessions that have each run one call and a pool of
   1. PSS (/proc/PID/smaps_rollup) of all its Deno runner processes summed, over the 9 sandboxes;
   USS (private pages) the same way. PSS splits the Deno binary's pages among every process that
   maps it, other servers' too, so it moves with what else runs; USS does not.
   Then, in this process (the backend alone): the PSS of a process with one sandbox, and the
   marginal PSS of a sandbox past a process's first, (PSS with 4 sandboxes - PSS with 1) / 3 of
   the same process, each sandbox having run one call and the process idle for 2 s before each
   reading (median over the rounds of row 7).
7. A new sandbox when the pool has none ready: `PyodideBackend.start()` in this process, p50.
   Before: each start a new process (5). After: 3 rounds of a new process's first sandbox, then 3
   more started in it; the first is a "new process" sample, the other three "room in a running
   process" samples. Each sandbox runs one call, and the process is idle for 2 s before each
   timed start.

The header gives a yardstick, timed at the run's start and end: a fixed pure-Python loop, and 64 MB
of new memory touched page by page. Runs made hours apart on one machine differ with its speed.

Meant to take under 10 minutes on a quiet 2-core machine. --quick shrinks every count, for a smoke
test only (its numbers mean nothing).
Writes bench/results/cohosting.json (every raw sample, and the servers' warnings).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx
from bench_clean_sandbox import cpu_seconds
from bench_latency import NO_HOOKS, percentile, server_pid
from common import children, free_port, save, wait_for_port
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.backends.pyodide import pyodide_version
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.native import MODULE, NAME, VERSION, packages_folder_with_the_extension

ROOT = Path(__file__).resolve().parents[1]

#: MCP_SANDBOX_SANDBOXES_PER_PROCESS of each column.
LAYOUTS = {"before": 1, "after": 4}
COUNTER = "x = globals().get('x', 0) + 1"
#: Row 1's turn of calls: (kind, code, timeout, in the client's session).
MIX: list[tuple[str, str, float | None, bool]] = [
    ("counter", COUNTER, None, True),
    ("timeout", "import time; time.sleep(5)", 0.5, True),
    ("crash", "import os; os._exit(3)", None, True),
    ("sessionless", "1 + 1", None, False),
    ("counter", COUNTER, None, True),
]
TRIVIAL = "1 + 1"
NATIVE = f"import {MODULE} as d\nd.add(2, 3)"
#: A client's bound on each call: past it, the call counts as unanswered.
CALL_BOUND_S = 60.0
#: Settling: at least this long after the last call, then until idle and the pool full, at most this.
SETTLE_LEAST_S, SETTLE_MOST_S = 3.0, 30.0
IDLE_WINDOW_S, IDLE_SHARE = 0.5, 0.15
#: Every phase of a layout (a server's life, or the backend's) ends within this.
PHASE_LIMIT_S = 240.0
WARM_UP_CALLS = 3
#: Row 1 polls the server's process tree this often.
POLL_S = 0.1
#: Row 6's and 7's backend: the process left idle this long before each timed start and memory reading.
IDLE_S = 2.0
BASE_ENV = {
    "MCP_SANDBOX_BACKEND": "pyodide",
    "MCP_SANDBOX_LOG_LEVEL": "WARNING",
    "MCP_SANDBOX_DEFAULT_PACKAGES": "",
    "MCP_SANDBOX_PRELOAD_PACKAGES": "",
    # 16 sessions of the mixed load, plus room: a refusal for too many sessions is not what is measured.
    "MCP_SANDBOX_MAX_SESSIONS": "64",
}
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "cohosting.json"


@dataclass(frozen=True)
class Counts:
    clients: int = 16
    mixed_calls: int = 20
    sessionless: int = 200
    native: int = 100
    new_sessions: int = 10
    back_to_back: int = 8
    new_process_starts: int = 5
    rounds: int = 3
    per_round: int = 3


QUICK = Counts(
    clients=4,
    mixed_calls=5,
    sessionless=20,
    native=10,
    new_sessions=3,
    back_to_back=3,
    new_process_starts=2,
    rounds=1,
    per_round=3,
)


# --- the server's processes ---------------------------------------------------------------------


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, USS) of a process in KB, from smaps_rollup; (0, 0) once it is gone."""
    fields: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                name, _, rest = line.partition(":")
                if name in ("Pss", "Private_Clean", "Private_Dirty"):
                    fields[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return 0, 0
    return fields.get("Pss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)


def runners(server: int) -> set[tuple[int, int]]:
    """The Deno runner processes under `server`: (pid, start time in clock ticks), so a reused pid
    is another process."""
    tree = children()
    found: set[tuple[int, int]] = set()
    pending = list(tree.get(server, []))
    while pending:
        pid = pending.pop()
        pending.extend(tree.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
            with open(f"/proc/{pid}/stat", "rb") as stat:
                started = int(stat.read().rsplit(b")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            continue
        if b"runner.ts" in command:
            found.add((pid, started))
    return found


def command_line(pid: int) -> str:
    """A process's command line, for the record (which checkout's runner.ts ran)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


async def ready_sandboxes(base_url: str) -> int:
    """mcp_sandbox_ready_sandboxes from the server's /metrics."""
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"{base_url}/metrics")).text
    for line in text.splitlines():
        if line.startswith("mcp_sandbox_ready_sandboxes "):
            return int(float(line.split()[1]))
    raise RuntimeError("no mcp_sandbox_ready_sandboxes in /metrics")


async def settle(server: int, waits: list[float], *, pool: int = 0, base_url: str | None = None) -> None:
    """Wait until the server has settled (see the docstring); the wait is added to `waits`, and
    one that reached SETTLE_MOST_S is recorded as negative."""
    began = time.perf_counter()
    await anyio.sleep(SETTLE_LEAST_S)
    settled = False
    with anyio.move_on_after(SETTLE_MOST_S - SETTLE_LEAST_S):
        while not settled:
            cpu = cpu_seconds(server)
            await anyio.sleep(IDLE_WINDOW_S)
            idle = (cpu_seconds(server) - cpu) / IDLE_WINDOW_S < IDLE_SHARE
            settled = idle and (base_url is None or await ready_sandboxes(base_url) >= pool)
    waited = time.perf_counter() - began
    waits.append(round(waited if settled else -waited, 2))


# --- servers and calls --------------------------------------------------------------------------


def server_env(per_process: int, pool: int, packages: Path) -> dict[str, str]:
    # PYTHONPATH: the servers run this checkout's code (a git worktree's too).
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {
        **os.environ,
        **BASE_ENV,
        "PYTHONPATH": path,
        "MCP_SANDBOX_PACKAGES_DIR": str(packages),
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": str(per_process),
        "MCP_SANDBOX_POOL_SIZE": str(pool),
    }


def appending(log: Path) -> TextIO:
    """`log` opened to append a server's stderr to."""
    return open(log, "a", encoding="utf-8")


@asynccontextmanager
async def http_server(env: dict[str, str], log: Path) -> AsyncIterator[tuple[str, int]]:
    """A server over streamable HTTP on 127.0.0.1, its stderr in `log`: (base URL, pid)."""
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    with appending(log) as stderr:
        process = await anyio.open_process(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        try:
            await wait_for_port(port, 60, process)
        except RuntimeError as error:
            raise RuntimeError(f"{error}: see {log}") from None
        yield f"http://127.0.0.1:{port}", process.pid
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(10):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()


@asynccontextmanager
async def stdio_server(env: dict[str, str], log: Path) -> AsyncIterator[tuple[Client, int]]:
    """A server over stdio, its stderr in `log`: (a client of it, its pid)."""
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcp_sandbox"], env={**env, "MCP_SANDBOX_BENCH_MARKER": marker}
    )
    with appending(log) as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            server = server_pid(f"MCP_SANDBOX_BENCH_MARKER={marker}")
            if server is None:
                raise RuntimeError("the stdio server's process was not found")
            yield client, server


async def timed_call(client: Client, code: str, expected: str | None = None, **arguments: Any) -> float:
    """One execute_python call that must succeed within CALL_BOUND_S: its round trip in ms."""
    began = time.perf_counter()
    with anyio.move_on_after(CALL_BOUND_S) as bound:
        response = await client.call_tool("execute_python", {"code": code, **arguments})
    if bound.cancelled_caught:
        raise RuntimeError(f"no answer within {CALL_BOUND_S:g} s to {code!r}")
    elapsed = (time.perf_counter() - began) * 1000
    result = response.structured_content
    if response.is_error or result is None or not result.get("success"):
        raise RuntimeError(f"execute_python {code!r} failed: {response.content}")
    if expected is not None and result.get("result") != expected:
        raise RuntimeError(f"execute_python {code!r} gave {result.get('result')!r}, not {expected!r}")
    return elapsed


def warnings_in(log: Path) -> list[str]:
    """What a server wrote to stderr, less uvicorn's start and stop lines."""
    if not log.is_file():
        return []
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("INFO:")]


# --- the rows -----------------------------------------------------------------------------------


async def mixed_load(per_process: int, packages: Path, log: Path, counts: Counts) -> dict[str, Any]:
    """Row 1."""
    pool = 4
    waits: list[float] = []
    latencies: list[float] = []
    by_kind: dict[str, list[float]] = {}
    statuses: dict[str, Counter[str]] = {}
    unanswered: list[str] = []
    wrong: list[str] = []
    #: Every answered call: client, call number, kind, ms, status, whether its session was lost or restored.
    detail: list[tuple[int, int, str, float, str, bool, bool]] = []
    seen: set[tuple[int, int]] = set()
    async with http_server(server_env(per_process, pool, packages), log) as (base_url, server):
        await settle(server, waits, pool=pool, base_url=base_url)
        before = runners(server)
        runner_command = command_line(min(before)[0]) if before else ""

        async def watch() -> None:
            while True:
                seen.update(await anyio.to_thread.run_sync(runners, server))
                await anyio.sleep(POLL_S)

        async def one_client(index: int) -> None:
            async with (
                httpx.AsyncClient(timeout=CALL_BOUND_S + 10) as http,
                Client(streamable_http_client(f"{base_url}/mcp", http_client=http)) as client,
            ):
                for number in range(counts.mixed_calls):
                    kind, code, timeout, in_session = MIX[number % len(MIX)]
                    arguments: dict[str, Any] = {"code": code}
                    if in_session:
                        arguments["session_id"] = f"mixed-{index}"
                    if timeout is not None:
                        arguments["timeout"] = timeout
                    began = time.perf_counter()
                    try:
                        with anyio.move_on_after(CALL_BOUND_S) as bound:
                            response = await client.call_tool("execute_python", arguments)
                    except Exception as error:  # noqa: BLE001 - an unanswered call is counted, not fatal
                        unanswered.append(f"client {index} call {number} ({kind}): {error!r}"[:300])
                        continue
                    if bound.cancelled_caught:
                        unanswered.append(f"client {index} call {number} ({kind}): no answer in 60 s")
                        continue
                    elapsed = (time.perf_counter() - began) * 1000
                    latencies.append(elapsed)
                    by_kind.setdefault(kind, []).append(elapsed)
                    result = response.structured_content or {}
                    status = "is_error" if response.is_error else str(result.get("status"))
                    statuses.setdefault(kind, Counter())[status] += 1
                    lost, restored = bool(result.get("session_lost")), bool(result.get("session_restored"))
                    detail.append((index, number, kind, round(elapsed, 1), status, lost, restored))
                    if kind == "sessionless" and result.get("result") != "2":
                        wrong.append(f"client {index} call {number}: 1 + 1 gave {result.get('result')!r}")

        cpu_before = cpu_seconds(server)
        began = time.perf_counter()
        async with anyio.create_task_group() as watching:
            watching.start_soon(watch)
            async with anyio.create_task_group() as group:
                for index in range(counts.clients):
                    group.start_soon(one_client, index)
            wall = time.perf_counter() - began
            watching.cancel_scope.cancel()
        seen.update(runners(server))
        cpu = cpu_seconds(server) - cpu_before
    calls = counts.clients * counts.mixed_calls
    return {
        "mixed_calls": calls,
        "mixed_wall_s": wall,
        "mixed_calls_per_s": calls / wall,
        "mixed_p50_ms": statistics.median(latencies) if latencies else None,
        "mixed_p99_ms": percentile(latencies, 99) if len(latencies) > 1 else None,
        "mixed_answered": len(latencies),
        "mixed_answered_text": f"{len(latencies)}/{calls}",
        "mixed_runners_before": len(before),
        "mixed_runners_started": len(seen - before),
        "mixed_cpu_s": cpu,
        "mixed_p50_ms_by_kind": {kind: statistics.median(times) for kind, times in by_kind.items()},
        "mixed_statuses_by_kind": {kind: dict(counter) for kind, counter in statuses.items()},
        "mixed_unanswered": unanswered,
        "mixed_wrong": wrong,
        "mixed_samples_ms": latencies,
        "mixed_samples_ms_by_kind": by_kind,
        "mixed_calls_detail": detail,
        "runner_command": runner_command,
        "mixed_settle_s": waits,
    }


async def sessionless(per_process: int, packages: Path, log: Path, counts: Counts) -> dict[str, Any]:
    """Rows 2 and 3."""
    waits: list[float] = []
    row: dict[str, Any] = {}
    async with stdio_server(server_env(per_process, 2, packages), log) as (client, server):
        for prefix, code, expected, calls in (
            ("sessionless", TRIVIAL, "2", counts.sessionless),
            ("native", NATIVE, "5", counts.native),
        ):
            for _ in range(WARM_UP_CALLS):
                await timed_call(client, code, expected)
            await settle(server, waits)
            began = time.perf_counter()
            samples = [await timed_call(client, code, expected) for _ in range(calls)]
            row |= {
                f"{prefix}_calls_per_s": calls / (time.perf_counter() - began),
                f"{prefix}_p50_ms": statistics.median(samples),
                f"{prefix}_samples_ms": samples,
            }
    return row | {"sessionless_settle_s": waits}


async def new_sessions(per_process: int, packages: Path, log: Path, counts: Counts) -> dict[str, Any]:
    """Row 4."""
    pool = 2
    waits: list[float] = []
    samples: list[float] = []
    async with (
        http_server(server_env(per_process, pool, packages), log) as (base_url, server),
        Client(f"{base_url}/mcp") as client,
    ):
        for i in range(counts.new_sessions):
            await settle(server, waits, pool=pool, base_url=base_url)
            samples.append(await timed_call(client, TRIVIAL, "2", session_id=f"new-{i}"))
        processes = len(runners(server))
    return {
        "new_session_p50_ms": statistics.median(samples),
        "new_session_samples_ms": samples,
        "new_session_runners_at_end": processes,
        "new_session_settle_s": waits,
    }


async def back_to_back(per_process: int, packages: Path, log: Path, counts: Counts) -> dict[str, Any]:
    """Rows 5 and 6 (the server's part)."""
    pool = 1
    waits: list[float] = []
    async with (
        http_server(server_env(per_process, pool, packages), log) as (base_url, server),
        Client(f"{base_url}/mcp") as client,
    ):
        await settle(server, waits, pool=pool, base_url=base_url)
        samples = [
            await timed_call(client, TRIVIAL, "2", session_id=f"b2b-{i}") for i in range(counts.back_to_back)
        ]
        await settle(server, waits, pool=pool, base_url=base_url)
        sandboxes = counts.back_to_back + pool
        memory = {pid: memory_kb(pid) for pid, _ in runners(server)}
    pss = sum(kb for kb, _ in memory.values()) / 1024
    uss = sum(kb for _, kb in memory.values()) / 1024
    return {
        "back_to_back_p50_ms": statistics.median(samples),
        "back_to_back_samples_ms": samples,
        "memory_sandboxes": sandboxes,
        "memory_runners": len(memory),
        "memory_pss_mb_total": pss,
        "memory_pss_mb_per_sandbox": pss / sandboxes,
        "memory_uss_mb_per_sandbox": uss / sandboxes,
        "memory_by_runner_kb": {str(pid): {"pss": kb[0], "uss": kb[1]} for pid, kb in memory.items()},
        "back_to_back_settle_s": waits,
    }


def backend_settings(per_process: int, packages: Path) -> Settings:
    return Settings(
        backend="pyodide",
        sandboxes_per_process=per_process,
        packages_dir=packages,
        default_packages="",
        preload_packages="",
        log_level="WARNING",
    )


async def started(start: Callable[[], Awaitable[Executor]], live: list[Executor]) -> tuple[Executor, float]:
    """A new sandbox (added to `live`) that has run one call, and its start's time in ms."""
    began = time.perf_counter()
    executor = await start()
    elapsed = (time.perf_counter() - began) * 1000
    live.append(executor)
    result = await executor.run(TRIVIAL, 10)
    if not result.success:
        raise RuntimeError(f"a new sandbox failed to run {TRIVIAL!r}: {result.error}")
    return executor, elapsed


async def starts(per_process: int, packages: Path, log: Path, counts: Counts) -> dict[str, Any]:
    """Row 7, and row 6's process with one sandbox and marginal sandbox, in this process."""
    new_process: list[float] = []
    in_process: list[float] = []
    first_pss: list[float] = []
    marginal_pss: list[float] = []
    live: list[Executor] = []  # closed however the phase ends: runners outlive this process otherwise

    async def close(executors: list[Executor]) -> None:
        with anyio.CancelScope(shield=True):
            for executor in executors:
                live.remove(executor)
                await executor.close()

    async with anyio.create_task_group() as group:
        backend = await prepare_backend(backend_settings(per_process, packages), NO_HOOKS, group)
        try:
            for _ in range(counts.new_process_starts if per_process == 1 else counts.rounds):
                first, elapsed = await started(backend.start, live)
                new_process.append(elapsed)
                pid: int = first.pid  # type: ignore[attr-defined]
                await anyio.sleep(IDLE_S)
                first_pss.append(memory_kb(pid)[0] / 1024)
                if per_process > 1:
                    for i in range(counts.per_round):
                        if i:
                            await anyio.sleep(IDLE_S)
                        if i and len(live) == per_process - 1:
                            # With room left the process holds the worker it starts ahead, as it
                            # did with one sandbox: the difference is the sandboxes' own.
                            marginal_pss.append((memory_kb(pid)[0] / 1024 - first_pss[-1]) / (len(live) - 1))
                        executor, elapsed = await started(backend.start, live)
                        if executor.pid != pid:  # type: ignore[attr-defined]
                            raise RuntimeError("a sandbox started in a new process while this one had room")
                        in_process.append(elapsed)
                await close(list(live))
                await anyio.sleep(IDLE_S)
        finally:
            await close(list(live))
        group.cancel_scope.cancel()
    return {
        "new_process_start_p50_ms": statistics.median(new_process),
        "new_process_start_samples_ms": new_process,
        "in_process_start_p50_ms": statistics.median(in_process) if in_process else None,
        "in_process_start_samples_ms": in_process,
        "one_sandbox_pss_mb": statistics.median(first_pss),
        "one_sandbox_pss_samples_mb": first_pss,
        "marginal_pss_mb": statistics.median(marginal_pss) if marginal_pss else None,
        "marginal_pss_samples_mb": marginal_pss,
    }


PHASES: list[tuple[str, Callable[[int, Path, Path, Counts], Awaitable[dict[str, Any]]]]] = [
    ("mixed load", mixed_load),
    ("calls without a session", sessionless),
    ("new sessions, pool warm", new_sessions),
    ("new sessions back to back, memory", back_to_back),
    ("Backend.start()", starts),
]


# --- the table ----------------------------------------------------------------------------------


def rows(counts: Counts) -> list[tuple[str, str, str]]:
    return [
        (
            f"1. mixed load, {counts.clients} clients x {counts.mixed_calls} calls",
            "mixed_calls_per_s",
            "{:.1f}/s",
        ),
        ("   p50", "mixed_p50_ms", "{:,.0f} ms"),
        ("   p99", "mixed_p99_ms", "{:,.0f} ms"),
        ("   calls answered", "mixed_answered_text", "{}"),
        ("   runner processes started", "mixed_runners_started", "{}"),
        ("   CPU of the server and its sandboxes", "mixed_cpu_s", "{:.1f} s"),
        (f"2. {counts.sessionless} calls without a session", "sessionless_calls_per_s", "{:.1f}/s"),
        ("   p50", "sessionless_p50_ms", "{:.1f} ms"),
        (f"3. {counts.native} of them importing a C extension", "native_calls_per_s", "{:.1f}/s"),
        ("   p50", "native_p50_ms", "{:.1f} ms"),
        (
            f"4. a new session's first call, pool warm (p50 of {counts.new_sessions})",
            "new_session_p50_ms",
            "{:.1f} ms",
        ),
        (
            f"5. {counts.back_to_back} new sessions back to back, pool of 1, p50",
            "back_to_back_p50_ms",
            "{:,.0f} ms",
        ),
        (
            f"6. PSS per sandbox, {counts.back_to_back} sessions + pool of 1",
            "memory_pss_mb_per_sandbox",
            "{:.0f} MB",
        ),
        ("   USS per sandbox, the same", "memory_uss_mb_per_sandbox", "{:.0f} MB"),
        ("   runner processes", "memory_runners", "{}"),
        ("   PSS of a process with one sandbox", "one_sandbox_pss_mb", "{:.0f} MB"),
        ("   PSS of a sandbox past a process's first", "marginal_pss_mb", "{:.0f} MB"),
        ("7. Backend.start(), room in a running process", "in_process_start_p50_ms", "{:,.0f} ms"),
        ("   Backend.start(), a new process", "new_process_start_p50_ms", "{:,.0f} ms"),
    ]


def table(results: dict[str, Any]) -> str:
    counts = Counts(**results["counts"])
    lines = [
        f"mcp-sandbox co-hosting — {results['date']}, {results['cpu_count']} cores, "
        f"Pyodide {results['pyodide']}"
        + (" (--quick: a smoke test, not a measurement)" if results["quick"] else ""),
        "yardstick, the machine's speed (a fixed Python loop / 64 MB of new pages touched): "
        + " ms at the start, ".join(f"{loop:g} / {pages:g}" for loop, pages in results["yardstick_ms"])
        + " ms at the end",
    ]
    columns = {name: f"{name}: {per} per process" for name, per in LAYOUTS.items()}
    width = max(len(label) for label, _, _ in rows(counts))
    lines.append(
        f"{'':<{width}}" + "".join(f"{title:>24}" for title in columns.values()) + f"{'after/before':>14}"
    )
    for label, key, form in rows(counts):
        values = [results["layouts"][name].get(key) for name in LAYOUTS]
        cells = "".join(f"{form.format(v) if v is not None else '-':>24}" for v in values)
        before, after = values
        numeric = isinstance(before, (int, float)) and isinstance(after, (int, float)) and before
        ratio = f"{after / before:.2f}x" if numeric and not key.endswith("_text") else ""
        lines.append(f"{label:<{width}}{cells}{ratio:>14}")
    for name in LAYOUTS:
        layout = results["layouts"][name]
        if layout.get("mixed_unanswered"):
            lines.append(f"{name}: unanswered calls in the mixed load, e.g. {layout['mixed_unanswered'][:3]}")
        if layout.get("mixed_wrong"):
            lines.append(f"{name}: wrong results in the mixed load, e.g. {layout['mixed_wrong'][:3]}")
        lines.append(f"{name}: mixed load statuses by kind {layout.get('mixed_statuses_by_kind')}")
        late = [phase for phase, waits in layout.get("settle_s", {}).items() if any(w < 0 for w in waits)]
        if late:
            lines.append(f"{name}: the server did not settle within {SETTLE_MOST_S:g} s in {late}")
        for phase, said in layout.get("server_warnings", {}).items():
            if said:
                lines.append(f"{name}: {len(said)} lines on the server's stderr in {phase}, e.g. {said[:2]}")
    return "\n".join(lines)


# --- the run ------------------------------------------------------------------------------------


def yardstick_ms() -> list[float]:
    """The machine's own speed, timed at a run's start and end, to compare runs made at other hours
    (one day's runs moved by 10-30% in rows nothing had changed): p50 of 5 of a fixed pure-Python
    loop, and of touching each page of 64 MB of new memory, as a sandbox's start does with its
    WebAssembly memory (16,384 page faults)."""
    loop, pages = [], []
    for _ in range(5):
        began = time.perf_counter()
        sum(i * i % 7 for i in range(1_000_000))
        loop.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        with mmap.mmap(-1, 64 << 20) as memory:
            for at in range(0, 64 << 20, mmap.PAGESIZE):
                memory[at] = 1
        pages.append((time.perf_counter() - began) * 1000)
    return [round(statistics.median(loop), 1), round(statistics.median(pages), 1)]


async def measure(counts: Counts, quick: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "yardstick_ms": [yardstick_ms()],
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyodide": pyodide_version(),
        "extension": f"{NAME}=={VERSION}",
        "quick": quick,
        "counts": dataclasses.asdict(counts),
        "layouts": {
            name: {"sandboxes_per_process": per, "settle_s": {}, "server_warnings": {}}
            for name, per in LAYOUTS.items()
        },
    }
    with tempfile.TemporaryDirectory(prefix="bench-cohosting-") as tmp:
        packages = packages_folder_with_the_extension(Path(tmp) / "packages")
        for phase, run in PHASES:
            for name, per_process in LAYOUTS.items():
                print(f"{phase}, {per_process} per process ...", file=sys.stderr)
                log = Path(tmp) / f"{phase}-{name}.log".replace(" ", "-")
                began = time.perf_counter()
                with anyio.fail_after(PHASE_LIMIT_S):
                    row = await run(per_process, packages, log, counts)
                layout = results["layouts"][name]
                for key in [key for key in row if key.endswith("_settle_s")]:
                    layout["settle_s"][phase] = row.pop(key)
                layout["server_warnings"][phase] = warnings_in(log)
                layout.setdefault("phase_s", {})[phase] = round(time.perf_counter() - began, 1)
                layout |= row
    results["yardstick_ms"].append(yardstick_ms())
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="every count shrunk: a smoke test")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="bench/results/cohosting.json")
    args = parser.parse_args()
    counts = QUICK if args.quick else Counts()
    results = anyio.run(measure, counts, args.quick)
    save(results, args.json, table(results))


if __name__ == "__main__":
    main()
