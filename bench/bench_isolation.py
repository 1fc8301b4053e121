"""What each isolation tier of the subprocess backend costs: cold start and a warm call.

    .venv/bin/python bench/bench_isolation.py [--starts 20] [--calls 200] [--json PATH]

Each tier the machine offers gets its own `SubprocessBackend` in this process (no MCP): a cold
start is `Backend.start()`, process spawn to the worker's `ready`, after one start to warm the
page cache, in blocks taken in turns across the tiers; a warm call is `Executor.run('1 + 1')` in one
started worker. A tier this machine
lacks is reported as such. Run against a checkout without tiers, it measures its one backend
(the "before" column of a comparison).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import anyio

from mcp_sandbox.backends.base import Backend, ExecutorHooks, SandboxStartError
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings

NO_HOOKS = ExecutorHooks(None)
CODE = "1 + 1"
PHASE_LIMIT_S = 300
ROUNDS = 3


async def measure_tiers(tiers: list[str | None], starts: int, calls: int) -> dict[str, Any]:
    """Cold starts in rounds, a block per tier per round, so the machine's drift (this VM's
    start times wander by a fifth from one minute to the next) falls on every tier alike; each
    block begins with a start that is not counted, so a tier does not pay for the last one's exit."""
    results: dict[str, Any] = {}
    with anyio.fail_after(PHASE_LIMIT_S):
        async with anyio.create_task_group() as group:
            backends: dict[str, Backend] = {}
            for tier in tiers:
                options: dict[str, Any] = {"backend": "subprocess"}
                if tier is not None:
                    options["isolation"] = tier
                try:
                    backend = await prepare_backend(Settings.model_validate(options), NO_HOOKS, group)
                except SandboxStartError as error:
                    results[tier or "subprocess"] = {"missing": str(error)[:200]}
                    continue
                await (await backend.start()).close()  # the page cache, not the tier, pays for this one
                backends[tier or "subprocess"] = backend
            cold: dict[str, list[float]] = {name: [] for name in backends}
            for _ in range(ROUNDS):
                for name, backend in backends.items():
                    await (await backend.start()).close()  # after the other tier's sandbox is gone
                    for _ in range(max(starts // ROUNDS, 1)):
                        started = time.perf_counter()
                        executor = await backend.start()
                        cold[name].append((time.perf_counter() - started) * 1000)
                        await executor.close()
            for name, backend in backends.items():
                executor = await backend.start()
                warm: list[float] = []
                try:
                    for _ in range(calls):
                        started = time.perf_counter()
                        result = await executor.run(CODE, 10)
                        warm.append((time.perf_counter() - started) * 1000)
                        if not result.success:
                            raise RuntimeError(f"{name}: {result.error}")
                finally:
                    await executor.close()
                results[name] = {
                    "cold_start_median_ms": statistics.median(cold[name]),
                    "cold_start_samples_ms": cold[name],
                    "warm_run_p50_ms": statistics.median(warm),
                }
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tiers", default="bubblewrap,landlock,none", help="comma-separated")
    args = parser.parse_args()
    tiers: list[str | None] = list(args.tiers.split(",")) if "isolation" in Settings.model_fields else [None]
    results = await measure_tiers(tiers, args.starts, args.calls)
    print(f"subprocess backend, {args.starts} cold starts and {args.calls} warm calls of {CODE!r} per tier")
    print(f"{'':<28}{'cold start p50':>16}{'warm run p50':>14}")
    for name, row in results.items():
        if "missing" in row:
            print(f"{name:<28}  not on this machine: {row['missing']}")
            continue
        print(f"{name:<28}{row['cold_start_median_ms']:>13.1f} ms{row['warm_run_p50_ms']:>11.3f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    anyio.run(main)
