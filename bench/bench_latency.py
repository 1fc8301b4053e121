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
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp import Client, StdioServerParameters

from mcp_sandbox.backends.base import Backend
from mcp_sandbox.backends.choice import create_backend
from mcp_sandbox.backends.pyodide import pyodide_version
from mcp_sandbox.settings import Settings

BACKENDS = ("pyodide", "subprocess", "inprocess")
SERVER_ENV = {"MCP_SANDBOX_POOL_SIZE": "2", "MCP_SANDBOX_LOG_LEVEL": "WARNING"}
CODE = "1 + 1"
WARMUP_CALLS = 5
# A pool of 2 refills in a few seconds on 2 cores; a start still running would steal CPU from
# the calls being timed, so every timed phase begins after the pool has had time to settle.
POOL_SETTLE_S = 8.0
FRESH_SESSIONS, FRESH_SETTLE_S = 3, 6.0
COLD_STARTS = 3
# Upper bounds so a hung server or sandbox fails the run instead of stalling it.
SERVER_PHASE_LIMIT_S = 120.0
WARM_LOOP_LIMIT_S = 45.0
COLD_PHASE_LIMIT_S = 90.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "latest.json"


async def call(client: Client, session_id: str) -> tuple[float, int]:
    """One execute_python call: (client round trip in ms, server-side duration_ms)."""
    started = time.perf_counter()
    response = await client.call_tool("execute_python", {"code": CODE, "session_id": session_id})
    elapsed_ms = (time.perf_counter() - started) * 1000
    result = response.structured_content
    if response.is_error or result is None or not result.get("success"):
        raise RuntimeError(f"execute_python failed: {response.content}")
    return elapsed_ms, int(result["duration_ms"])


async def measure_server(backend: str, calls: int) -> dict[str, Any]:
    env = {**SERVER_ENV, "MCP_SANDBOX_BACKEND": backend}
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)
    with anyio.fail_after(SERVER_PHASE_LIMIT_S):
        async with Client(params) as client:
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

            fresh: list[float] = []
            for i in range(FRESH_SESSIONS):
                await anyio.sleep(FRESH_SETTLE_S)
                fresh.append((await call(client, f"bench-fresh-{i}"))[0])
                # Each session holds a sandbox until it expires; free it now.
                await client.call_tool("reset_session", {"session_id": f"bench-fresh-{i}"})

    # "inclusive" keeps p99 inside the observed range: with 200 samples, between the 3rd and 2nd worst.
    cuts = statistics.quantiles(round_trips, n=100, method="inclusive")
    return {
        "warm_calls": len(round_trips),
        "warm_p50_ms": statistics.median(round_trips),
        "warm_p99_ms": cuts[98],
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
            backend: Backend = create_backend(Settings.model_validate({"backend": backend_name}), tg)
            await backend.prepare()
            for _ in range(COLD_STARTS):
                started = time.perf_counter()
                executor = await backend.start()
                starts.append(time.perf_counter() - started)
                await executor.close()
            executor = await backend.start()
            try:
                for i in range(WARMUP_CALLS + calls):
                    started = time.perf_counter()
                    result = await executor.run(CODE, timeout=10, grace=1, max_output_chars=32_768)
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
    ("warm Executor.run p50 (no MCP)", "executor_run_p50_ms", "{:.3f} ms"),
    ("new session, first call (median of 3)", "fresh_session_median_ms", "{:.2f} ms"),
    ("cold start, spawn to ready (median of 3)", "cold_start_median_ms", "{:,.2f} ms"),
    ("ratio cold start / warm p50", "cold_over_warm_p50", "{:,.2f}x"),
    ("ratio warm p50 / pyodide warm p50", "warm_p50_vs_pyodide", "{:.2f}x"),
]


def table(r: dict[str, Any]) -> str:
    names = [name for name in BACKENDS if name in r["backends"]]
    header = (
        f"mcp-sandbox latency — {r['date']}, code {r['code']!r}, {r['calls']} warm calls per backend\n"
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
    for name in backends:
        print(f"measuring {name} ...", file=sys.stderr)
        row = await measure_server(name, calls)
        # After the server has exited, so no pool refill competes with the starts for CPU.
        row |= await measure_executor(name, calls)
        row["cold_start_median_ms"] = row["cold_start_median_s"] * 1000
        row["cold_over_warm_p50"] = row["cold_start_median_ms"] / row["warm_p50_ms"]
        results["backends"][name] = row
    if "pyodide" in results["backends"]:
        base = results["backends"]["pyodide"]["warm_p50_ms"]
        for row in results["backends"].values():
            row["warm_p50_vs_pyodide"] = row["warm_p50_ms"] / base
    return results


def report(results: dict[str, Any], json_path: Path) -> None:
    print(table(results))
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {json_path}")


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
