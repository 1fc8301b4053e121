"""Bridged tool calls per second from inside one execution, on each backend, against the upstream's own rate.

Run from the repository root:  .venv/bin/python bench/bench_bridge.py [--calls N] [--json PATH]

The upstream is bench/fast_upstream.py over stdio: a minimal MCP server whose `add` answers in
microseconds (the SDK's own server takes about 2 ms a call, which would hide the bridge). So the
numbers are the cost of the path, not of the tool. Everything is measured in one run.
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
from pathlib import Path
from typing import Any

import anyio
from common import save
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("pyodide", "subprocess", "inprocess")
UPSTREAM_ARGS = [str(REPO / "bench" / "fast_upstream.py")]
UPSTREAM = {"command": sys.executable, "args": UPSTREAM_ARGS}
ROUNDS = 5  # each row is the median of this many timed rounds
PHASE_LIMIT_S = 180.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "bridge.json"

SEQUENTIAL = """
import time
started = time.perf_counter()
for i in range({calls}):
    tools.calc.add(a=i, b=1)
time.perf_counter() - started
"""
PARALLEL = """
import asyncio, time
started = time.perf_counter()
await asyncio.gather(*[tools.calc.add_async(a=i, b=1) for i in range({calls})])
time.perf_counter() - started
"""


async def upstream_alone(calls: int) -> dict[str, float]:
    """The upstream's own rate: the bench process calls it directly with mcp.Client."""
    params = StdioServerParameters(command=sys.executable, args=UPSTREAM_ARGS)
    sequential: list[float] = []
    parallel: list[float] = []
    async with Client(params) as client:
        for _ in range(20):
            await client.call_tool("add", {"a": 1, "b": 1})
        for _ in range(ROUNDS):
            started = time.perf_counter()
            for i in range(calls):
                await client.call_tool("add", {"a": i, "b": 1})
            sequential.append(time.perf_counter() - started)
            started = time.perf_counter()
            async with anyio.create_task_group() as group:
                for i in range(calls):
                    group.start_soon(client.call_tool, "add", {"a": i, "b": 1})
            parallel.append(time.perf_counter() - started)
    return {
        "sequential_calls_per_s": calls / statistics.median(sequential),
        "parallel_calls_per_s": calls / statistics.median(parallel),
    }


async def bridged(backend: str, calls: int, config: Path) -> dict[str, float]:
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_BRIDGE_CONFIG": str(config),
        "MCP_SANDBOX_BRIDGE_MAX_CALLS": str(calls * 2),
        "MCP_SANDBOX_LOG_LEVEL": "WARNING",
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)
    results: dict[str, list[float]] = {"sequential": [], "parallel": []}
    async with Client(params) as client:

        async def timed(code: str) -> float:
            response = await client.call_tool(
                "execute_python", {"code": code, "session_id": "bench", "timeout": 120}
            )
            result = response.structured_content
            if response.is_error or result is None or not result["success"]:
                raise RuntimeError(f"{backend}: {response.content}")
            return float(result["result"])

        await timed(SEQUENTIAL.format(calls=20))
        await timed(PARALLEL.format(calls=20))
        for _ in range(ROUNDS):
            results["sequential"].append(await timed(SEQUENTIAL.format(calls=calls)))
            results["parallel"].append(await timed(PARALLEL.format(calls=calls)))
    return {
        "sequential_calls_per_s": calls / statistics.median(results["sequential"]),
        "parallel_calls_per_s": calls / statistics.median(results["parallel"]),
    }


def table(r: dict[str, Any]) -> str:
    columns = ["upstream alone", *r["backends"]]
    rows = [r["upstream_alone"], *r["backends"].values()]
    lines = [
        f"bridged calls to a trivial upstream tool — {r['date']}, {r['calls']} calls per round, "
        f"median of {ROUNDS} rounds",
        f"machine: {r['cpu_count']} CPUs, {r['platform']}, Python {r['python']}",
        f"{'':<34}" + "".join(f"{c:>16}" for c in columns),
    ]
    for key, label in (
        ("sequential_calls_per_s", "calls/s, one after another"),
        ("parallel_calls_per_s", "calls/s, asyncio.gather"),
    ):
        lines.append(f"{label:<34}" + "".join(f"{row[key]:>16,.0f}" for row in rows))
    base = r["upstream_alone"]["sequential_calls_per_s"]
    lines.append(
        f"{'bridge cost per call, sequential':<34}{'':>16}"
        + "".join(
            f"{(1000 / row['sequential_calls_per_s'] - 1000 / base):>13.2f} ms"
            for row in r["backends"].values()
        )
    )
    return "\n".join(lines)


async def measure(calls: int, backends: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "calls": calls,
        "backends": {},
    }
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "upstreams.json"
        config.write_text(json.dumps({"mcpServers": {"calc": UPSTREAM}}))
        with anyio.fail_after(PHASE_LIMIT_S):
            before = await upstream_alone(calls)
        for backend in backends:
            print(f"measuring {backend} ...", file=sys.stderr)
            with anyio.fail_after(PHASE_LIMIT_S):
                results["backends"][backend] = await bridged(backend, calls, config)
        with anyio.fail_after(PHASE_LIMIT_S):
            after = await upstream_alone(calls)
    # Measured before and after the backends; the faster of the two is the fairer baseline.
    results["upstream_alone_phases"] = [before, after]
    results["upstream_alone"] = {key: max(before[key], after[key]) for key in before}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200, help="calls per timed round (default 200)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated (default: all three)")
    args = parser.parse_args()
    backends = [name.strip() for name in args.backends.split(",") if name.strip()]
    if not 10 <= args.calls <= 900 or not backends or set(backends) - set(BACKENDS):
        parser.error(f"--calls must be 10..900; --backends takes names from {', '.join(BACKENDS)}")
    results = anyio.run(measure, args.calls, backends)
    save(results, args.json, table(results))


if __name__ == "__main__":
    main()
