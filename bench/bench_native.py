"""Native code on pyodide: a real C extension (dummy-pyodide-ext-test, from PyPI) through
checkpoints, restores, recycling and preloading, against the same in pure Python.

Run from the repository root:  .venv/bin/python bench/bench_native.py [--json PATH]

1. Sandboxes (the backend alone): a checkpoint's size and time and a restore's time into a new
   sandbox, for a session that loaded the extension and one that did not; a recycle's time after
   each; the start of a sandbox and its idle memory (PSS), with and without the extension preloaded.
2. Through the Python API (the App the MCP server runs), pool of 2: 40 calls without a session
   that import the extension, with and without it preloaded; a new session's first call that
   imports it.
About 2 minutes. The wheel is fetched as the tests fetch it (tests/native.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from bench_latency import NO_HOOKS

from mcp_sandbox import Sandbox
from mcp_sandbox.backends.base import Checkpoint, Executor
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.native import MODULE, packages_folder_with_the_extension

REPEATS = 7
SESSIONLESS_CALLS = 40
NEW_SESSIONS = 10
PURE = "import json, re, collections\nx = 41"
NATIVE = f"import {MODULE} as d\nx = d.add(40, 1)"
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "native.json"


def pss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Pss")


def settings(packages: Path, preload: str = "") -> Settings:
    return Settings(
        backend="pyodide",
        packages_dir=packages,
        preload_packages=preload,
        default_packages="",
        pool_size=2,
        log_level="WARNING",
    )


async def sandboxes(packages: Path) -> dict[str, Any]:
    """Checkpoint, restore and recycle per kind of session; start and idle memory per preload."""
    results: dict[str, Any] = {}
    async with anyio.create_task_group() as group:
        backend = await prepare_backend(settings(packages), NO_HOOKS, group)
        for kind, code in (("pure Python", PURE), ("the extension", NATIVE)):
            sizes, takes, restores, recycles = [], [], [], []
            for _ in range(REPEATS):
                executor = await backend.start()
                assert (await executor.run(code, 10)).success
                began = time.perf_counter()
                saved = await executor.checkpoint()
                takes.append((time.perf_counter() - began) * 1000)
                assert isinstance(saved, Checkpoint), saved
                sizes.append(len(saved.payload) / 2**20)
                began = time.perf_counter()
                assert await executor.recycle() is None, "recycled"
                recycles.append((time.perf_counter() - began) * 1000)
                await executor.close()
                fresh = await backend.start()
                began = time.perf_counter()
                assert await fresh.restore(saved.payload) is None, "restored"
                restores.append((time.perf_counter() - began) * 1000)
                check = await fresh.run("x", 10)
                assert check.result == "41", check
                await fresh.close()
            results[kind] = {
                "checkpoint_mb": statistics.median(sizes),
                "checkpoint_ms": statistics.median(takes),
                "restore_ms": statistics.median(restores),
                "recycle_ms": statistics.median(recycles),
            }
        group.cancel_scope.cancel()
    for preload in ("", "dummy-pyodide-ext-test"):
        async with anyio.create_task_group() as group:
            backend = await prepare_backend(settings(packages, preload), NO_HOOKS, group)
            starts, memory = [], []
            for _ in range(3):
                began = time.perf_counter()
                executor: Executor = await backend.start()
                starts.append((time.perf_counter() - began) * 1000)
                await anyio.sleep(1)
                memory.append(pss_mb(executor.pid))  # type: ignore[attr-defined]
                await executor.close()
            results[f"preload {preload or 'none'}"] = {
                "start_ms": statistics.median(starts),
                "idle_pss_mb": statistics.median(memory),
            }
            group.cancel_scope.cancel()
    return results


async def calls(packages: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for preload in ("", "dummy-pyodide-ext-test"):
        async with Sandbox(settings=settings(packages, preload)) as sandbox:
            await anyio.sleep(8)  # the pool fills and settles
            samples = []
            began = time.perf_counter()
            for _ in range(SESSIONLESS_CALLS):
                start = time.perf_counter()
                result = await sandbox.run(f"import {MODULE} as d\nd.add(2, 3)")
                samples.append((time.perf_counter() - start) * 1000)
                assert result.result == "5", result
            rate = SESSIONLESS_CALLS / (time.perf_counter() - began)
            firsts = []
            for i in range(NEW_SESSIONS):
                await anyio.sleep(1)  # a ready sandbox waits in the pool, as it would for a new agent
                start = time.perf_counter()
                result = await sandbox.run(f"import {MODULE} as d\nd.add(2, 3)", session_id=f"new-{i}")
                firsts.append((time.perf_counter() - start) * 1000)
                assert result.result == "5", result
                await sandbox.reset(f"new-{i}")
        results[f"preload {preload or 'none'}"] = {
            "sessionless_calls_per_s": rate,
            "sessionless_p50_ms": statistics.median(samples),
            "new_session_first_call_p50_ms": statistics.median(firsts),
        }
    return results


async def measure() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-native-") as tmp:
        packages = packages_folder_with_the_extension(Path(tmp) / "packages")
        return {"sandboxes": await sandboxes(packages), "calls": await calls(packages)}


def report(results: dict[str, Any], path: Path) -> None:
    results["machine"] = {"python": platform.python_version(), "when": datetime.datetime.now().isoformat()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    print("| session | checkpoint | its time | restore into a new sandbox | recycle after |")
    print("| --- | --- | --- | --- | --- |")
    for kind, row in results["sandboxes"].items():
        if kind.startswith("preload"):
            continue
        print(
            f"| {kind} | {row['checkpoint_mb']:.2f} MB | {row['checkpoint_ms']:.1f} ms | "
            f"{row['restore_ms']:.1f} ms | {row['recycle_ms']:.1f} ms |"
        )
    print(
        "\n| preload | sandbox start | idle PSS | calls without a session importing it | their p50 "
        "| a new session's first call, p50 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in ("preload none", "preload dummy-pyodide-ext-test"):
        box, run = results["sandboxes"][name], results["calls"][name]
        print(
            f"| {name.removeprefix('preload ')} | {box['start_ms']:.0f} ms | {box['idle_pss_mb']:.0f} MB | "
            f"{run['sessionless_calls_per_s']:.1f}/s | {run['sessionless_p50_ms']:.1f} ms | "
            f"{run['new_session_first_call_p50_ms']:.1f} ms |"
        )
    print(f"\n(written to {path})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    arguments = parser.parse_args()
    report(anyio.run(measure), arguments.json)
