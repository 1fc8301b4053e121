"""Latency of execute_python on each backend: warm calls, a new session's first call, cold start.

Run from the repository root:  .venv/bin/python bench/bench_latency.py [--calls N] [--json PATH]
                               [--backends pyodide,subprocess,inprocess]

Everything is measured in one run on one machine, so the rows and columns can be compared.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from bench_bridge import UPSTREAM as BRIDGE_UPSTREAM
from bench_bridge import bridged
from common import save
from mcp import Client, StdioServerParameters

from mcp_sandbox.backends.base import Backend, ExecutorHooks
from mcp_sandbox.backends.pyodide import RUNNER_DIR, PyodideBackend, find_deno, pyodide_version
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings

BACKENDS = ("pyodide", "subprocess", "inprocess")
SERVER_ENV = {"MCP_SANDBOX_POOL_SIZE": "2", "MCP_SANDBOX_LOG_LEVEL": "WARNING"}
CODE = "1 + 1"
#: A million characters of output (capped to MCP_SANDBOX_MAX_OUTPUT_CHARS on the way back).
BIG_OUTPUT_CODE = "print('x' * 1_000_000)"
BIG_OUTPUT_CALLS = 50
THROUGHPUT_SESSIONS = 8
ALTERNATIVE_SAMPLES = {"fresh_pyodide_process": 3, "fresh_python_process": 10}
WARMUP_CALLS = 5
#: Calls 2 to 51 of a new session, timed back to back (no idle time for the JIT to warm up).
FIRST_CALLS = 50
# A pool of 2 refills in a few seconds on 2 cores; a start still running would steal CPU from
# the calls being timed, so every timed phase begins after the pool has had time to settle.
POOL_SETTLE_S = 8.0
FRESH_SESSIONS, FRESH_SETTLE_S = 3, 6.0
COLD_STARTS = 3
# Upper bounds so a hung server or sandbox fails the run instead of stalling it.
SERVER_PHASE_LIMIT_S = 180.0
WARM_LOOP_LIMIT_S = 45.0
COLD_PHASE_LIMIT_S = 90.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"
#: Executors measured without a server: no tool bridge, nobody watching progress.
NO_HOOKS = ExecutorHooks(tools=None)


async def call(client: Client, session_id: str, code: str = CODE) -> tuple[float, int]:
    """One execute_python call: (client round trip in ms, server-side duration_ms)."""
    started = time.perf_counter()
    response = await client.call_tool("execute_python", {"code": code, "session_id": session_id})
    elapsed_ms = (time.perf_counter() - started) * 1000
    result = response.structured_content
    if response.is_error or result is None or not result.get("success"):
        raise RuntimeError(f"execute_python failed: {response.content}")
    return elapsed_ms, int(result["duration_ms"])


def percentile(samples: list[float], cut: int) -> float:
    # "inclusive" keeps p99 inside the observed range: with 200 samples, between the 3rd and 2nd worst.
    return statistics.quantiles(samples, n=100, method="inclusive")[cut - 1]


def server_pid(marker: str) -> int | None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if marker.encode() in environ.read():
                        return int(entry)
            except OSError:
                continue
    return None


def sandbox_rss_mb(server: int, field: str = "VmRSS") -> list[float]:
    """Memory of each child process of the server (its sandboxes), in MB: resident (VmRSS), or
    proportional (Pss), which divides pages shared with other processes, such as the Deno binary's."""
    sizes = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            if parent != server:
                continue
            source = "status" if field == "VmRSS" else "smaps_rollup"
            with open(f"/proc/{entry}/{source}") as status:
                for line in status:
                    if line.startswith(f"{field}:"):
                        sizes.append(int(line.split()[1]) / 1024)
        except (OSError, ValueError, IndexError):
            continue
    return sizes


async def measure_throughput(client: Client, calls: int) -> float:
    """Trivial calls per second with THROUGHPUT_SESSIONS sessions calling at once."""
    for i in range(THROUGHPUT_SESSIONS):
        await call(client, f"tp-{i}")
    # Steady state: the pool refills and the new sessions' sandboxes warm up first.
    await anyio.sleep(POOL_SETTLE_S)
    per_session = max(calls // THROUGHPUT_SESSIONS, 10)

    async def session(i: int) -> None:
        for _ in range(per_session):
            await call(client, f"tp-{i}")

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for i in range(THROUGHPUT_SESSIONS):
            group.start_soon(session, i)
    return per_session * THROUGHPUT_SESSIONS / (time.perf_counter() - started)


async def measure_server(backend: str, calls: int) -> dict[str, Any]:
    marker = f"MCP_SANDBOX_BENCH_MARKER={os.getpid()}-{backend}"
    env = {**SERVER_ENV, "MCP_SANDBOX_BACKEND": backend, marker.split("=")[0]: marker.split("=")[1]}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)
    with anyio.fail_after(SERVER_PHASE_LIMIT_S):
        async with Client(params) as client:
            # A session's first calls, back to back, before its sandbox has had idle time to warm up.
            first_calls = [(await call(client, "bench-first"))[0] for _ in range(1 + FIRST_CALLS)][1:]
            await client.call_tool("reset_session", {"session_id": "bench-first"})
            for _ in range(WARMUP_CALLS):
                await call(client, "bench")
            await anyio.sleep(POOL_SETTLE_S)

            round_trips: list[float] = []
            server_ms: list[int] = []
            deadline = time.perf_counter() + WARM_LOOP_LIMIT_S
            for _ in range(calls):
                if time.perf_counter() > deadline:
                    break
                elapsed, duration = await call(client, "bench")
                round_trips.append(elapsed)
                server_ms.append(duration)

            big: list[float] = []
            for _ in range(WARMUP_CALLS + BIG_OUTPUT_CALLS):
                big.append((await call(client, "bench", BIG_OUTPUT_CODE))[0])
            big = big[WARMUP_CALLS:]

            server = server_pid(marker)
            idle_rss = sandbox_rss_mb(server) if server is not None else []
            idle_pss = sandbox_rss_mb(server, "Pss") if server is not None else []

            fresh: list[float] = []
            for i in range(FRESH_SESSIONS):
                await anyio.sleep(FRESH_SETTLE_S)
                fresh.append((await call(client, f"bench-fresh-{i}"))[0])
                # Each session holds a sandbox until it expires; free it now.
                await client.call_tool("reset_session", {"session_id": f"bench-fresh-{i}"})

            await anyio.sleep(FRESH_SETTLE_S)
            throughput = await measure_throughput(client, calls)

    return {
        "warm_calls": len(round_trips),
        "warm_p50_ms": statistics.median(round_trips),
        "warm_p99_ms": percentile(round_trips, 99),
        "big_output_p50_ms": statistics.median(big),
        "big_output_p99_ms": percentile(big, 99),
        "idle_sandbox_rss_mb": statistics.median(idle_rss) if idle_rss else None,
        "idle_sandbox_pss_mb": statistics.median(idle_pss) if idle_pss else None,
        "first_calls_p50_ms": statistics.median(first_calls),
        "throughput_calls_per_s": throughput,
        "server_duration_median_ms": statistics.median(server_ms),
        # duration_ms is whole (truncated) milliseconds, so the median alone hides the spread.
        "server_duration_ms_counts": dict(sorted(Counter(server_ms).items())),
        "fresh_session_samples_ms": fresh,
        "fresh_session_median_ms": statistics.median(fresh),
    }


async def measure_executor(backend_name: str, calls: int) -> dict[str, Any]:
    """Without MCP: cold starts, and warm `Executor.run` round trips, in this process."""
    starts: list[float] = []
    runs: list[float] = []
    with anyio.fail_after(COLD_PHASE_LIMIT_S):
        async with anyio.create_task_group() as tg:
            settings = Settings.model_validate({"backend": backend_name})
            backend: Backend = await prepare_backend(settings, NO_HOOKS, tg)
            for _ in range(COLD_STARTS):
                started = time.perf_counter()
                executor = await backend.start()
                starts.append(time.perf_counter() - started)
                await executor.close()
            executor = await backend.start()
            try:
                for i in range(WARMUP_CALLS + calls):
                    started = time.perf_counter()
                    result = await executor.run(CODE, 10)
                    if i >= WARMUP_CALLS:
                        runs.append((time.perf_counter() - started) * 1000)
                    if not result.success:
                        raise RuntimeError(f"{backend_name}: {result.error}")
            finally:
                await executor.close()
    return {
        "cold_start_samples_s": starts,
        "cold_start_median_s": statistics.median(starts),
        "executor_run_p50_ms": statistics.median(runs),
    }


ROWS: list[tuple[str, str, str]] = [
    ("warm call p50 (MCP stdio round trip)", "warm_p50_ms", "{:.2f} ms"),
    ("warm call p99", "warm_p99_ms", "{:.2f} ms"),
    (f"a new session's calls 2-{FIRST_CALLS + 1}, back to back, p50", "first_calls_p50_ms", "{:.2f} ms"),
    ("1 MB-output call p50", "big_output_p50_ms", "{:.2f} ms"),
    ("1 MB-output call p99", "big_output_p99_ms", "{:.2f} ms"),
    ("warm Executor.run p50 (no MCP)", "executor_run_p50_ms", "{:.3f} ms"),
    ("new session, first call (median of 3)", "fresh_session_median_ms", "{:.2f} ms"),
    (f"throughput, {THROUGHPUT_SESSIONS} sessions at once", "throughput_calls_per_s", "{:,.0f}/s"),
    ("bridged calls, one after another", "bridged_sequential_per_s", "{:,.0f}/s"),
    ("bridged calls, asyncio.gather", "bridged_parallel_per_s", "{:,.0f}/s"),
    ("idle sandbox resident memory (median)", "idle_sandbox_rss_mb", "{:.0f} MB"),
    ("idle sandbox proportional memory (PSS)", "idle_sandbox_pss_mb", "{:.0f} MB"),
    ("cold start, spawn to ready (median of 3)", "cold_start_median_ms", "{:,.2f} ms"),
    ("ratio cold start / warm p50", "cold_over_warm_p50", "{:,.2f}x"),
    ("ratio warm p50 / pyodide warm p50", "warm_p50_vs_pyodide", "{:.2f}x"),
    ("fresh process per call (the alternative)", "alternative_ms", "{:,.1f} ms"),
    ("ratio alternative / warm p50", "speedup_vs_alternative", "{:,.0f}x"),
]


async def measure_alternatives() -> dict[str, float]:
    """Median wall time of one call done the per-call-process way, in ms."""
    settings = Settings()
    deno = find_deno(settings)
    if deno is None:
        raise RuntimeError("no Deno binary found")
    async with anyio.create_task_group() as group:
        backend = PyodideBackend(settings, NO_HOOKS, group, deno)  # only prepare() is used
    await backend.prepare()
    readable = f"{RUNNER_DIR},{backend.lock_file().parent}"
    fresh_pyodide = [
        str(deno), "run", "--no-prompt", "--cached-only", "--config", str(RUNNER_DIR / "deno.json"),
        f"--allow-read={readable}", str(Path(__file__).with_name("fresh_pyodide.ts")), CODE,
    ]  # fmt: skip
    env = {"DENO_DIR": str(settings.cache_dir / "deno"), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
    commands = {
        "fresh_pyodide_process": (fresh_pyodide, env),
        "fresh_python_process": ([sys.executable, "-c", f"print({CODE})"], None),
    }
    medians: dict[str, float] = {}
    with anyio.fail_after(COLD_PHASE_LIMIT_S):
        for name, (command, command_env) in commands.items():
            samples = []
            for _ in range(ALTERNATIVE_SAMPLES[name]):
                started = time.perf_counter()
                done = await anyio.run_process(command, env=command_env, check=False)
                samples.append((time.perf_counter() - started) * 1000)
                if done.returncode != 0 or done.stdout.strip() != b"2":
                    raise RuntimeError(f"{name} failed: {done.stderr.decode()[-500:]}")
            medians[name] = statistics.median(samples)
    return medians


def table(r: dict[str, Any]) -> str:
    names = [name for name in BACKENDS if name in r["backends"]]
    alternatives = ", ".join(f"{name} {ms:,.1f} ms" for name, ms in r["alternatives"].items())
    header = (
        f"mcp-sandbox latency — {r['date']}, code {r['code']!r}, {r['calls']} warm calls per backend\n"
        f"alternatives (median wall time of one call): {alternatives}\n"
        f"machine: {r['cpu_count']} CPUs, {r['platform']}, Python {r['python']}, Pyodide {r['pyodide']}\n"
    )
    width = max(len(label) for label, _, _ in ROWS)
    lines = [f"{'':<{width}}" + "".join(f"{name:>14}" for name in names)]
    for label, key, fmt in ROWS:
        cells = []
        for name in names:
            value = r["backends"][name].get(key)
            cells.append(f"{fmt.format(value) if value is not None else '-':>14}")
        lines.append(f"{label:<{width}}" + "".join(cells))
    return header + "\n".join(lines)


async def measure(calls: int, backends: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyodide": pyodide_version(),
        "code": CODE,
        "calls": calls,
        "backends": {},
    }
    print("measuring the alternatives ...", file=sys.stderr)
    results["alternatives"] = await measure_alternatives()
    with tempfile.TemporaryDirectory() as folder:
        bridge_config = Path(folder) / "upstreams.json"
        bridge_config.write_text(json.dumps({"mcpServers": {"calc": BRIDGE_UPSTREAM}}))
        for name in backends:
            print(f"measuring {name} ...", file=sys.stderr)
            row = await measure_server(name, calls)
            # After the server has exited, so no pool refill competes with the starts for CPU.
            row |= await measure_executor(name, calls)
            bridged_rates = await bridged(name, calls, bridge_config)
            row["bridged_sequential_per_s"] = bridged_rates["sequential_calls_per_s"]
            row["bridged_parallel_per_s"] = bridged_rates["parallel_calls_per_s"]
            row["cold_start_median_ms"] = row["cold_start_median_s"] * 1000
            row["cold_over_warm_p50"] = row["cold_start_median_ms"] / row["warm_p50_ms"]
            alternative = "fresh_pyodide_process" if name == "pyodide" else "fresh_python_process"
            row["alternative"] = alternative
            row["alternative_ms"] = results["alternatives"][alternative]
            row["speedup_vs_alternative"] = row["alternative_ms"] / row["warm_p50_ms"]
            results["backends"][name] = row
    if "pyodide" in results["backends"]:
        base = results["backends"]["pyodide"]["warm_p50_ms"]
        for row in results["backends"].values():
            row["warm_p50_vs_pyodide"] = row["warm_p50_ms"] / base
    return results


def report(results: dict[str, Any], json_path: Path) -> None:
    save(results, json_path, table(results))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--calls", type=int, default=200, help="timed warm calls (default 200; p99 wants 100+)"
    )
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, help="results file (bench/results/latest.json)"
    )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    args = parser.parse_args()
    if not 2 <= args.calls <= 10_000:
        parser.error("--calls must be between 2 and 10000")
    args.backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    if not args.backends or set(args.backends) - set(BACKENDS):
        parser.error(f"--backends takes names from {', '.join(BACKENDS)}")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    report(anyio.run(measure, arguments.calls, arguments.backends), arguments.json)
