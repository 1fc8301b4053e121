"""Pyodide versions: the figures a move to another Pyodide turns on, for the one this
checkout pins in mcp_sandbox/backends/pyodide/deno.json.

Run from the repository root, once per checkout, each version with its own cache folder:

    PYTHONPATH=. MCP_SANDBOX_CACHE_DIR=~/.cache/mcp-sandbox-VERSION \\
        .venv/bin/python bench/bench_pyodide_versions.py [--json PATH]

(PYTHONPATH=. so that this checkout's mcp_sandbox is the one measured, not an installed one; the
header says which was.) About 3 minutes. Through the real backend (no MCP):

1. The memory snapshot's size; cold starts of one sandbox, spawn to ready, from the snapshot and
   without it (Pyodide loaded from scratch); the idle memory (PSS and RSS) of a new sandbox.
2. A warm `Executor.run('1 + 1')`, after the JIT warm-up a session's sandbox gets.
3. A small session's checkpoint (bytes raw and compressed as the store does), restored into a new
   sandbox.
4. pyodide#6254 (a memory snapshot over 30 MB does not restore): a session holding a 40 MB
   bytearray checkpointed and restored into a new sandbox (this project's checkpoints), and the
   same through Pyodide's own makeMemorySnapshot / loadPyodide({_loadSnapshot}) (snapshot_restore.ts).

Then through the real MCP server over stdio: a warm call's round trip in a session and without
one, and the idle memory of the server's sandboxes.
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
from pathlib import Path
from typing import Any

import anyio
import zstandard
from bench_checkpoints import pss_bytes
from bench_latency import percentile, server_pid
from common import children
from mcp import Client, StdioServerParameters

import mcp_sandbox
from mcp_sandbox.backends.base import Executor, ExecutorHooks, NotDone, SandboxDied
from mcp_sandbox.backends.pyodide import (
    RUNNER_DIR,
    PyodideBackend,
    PyodideExecutor,
    find_deno,
    pyodide_version,
)
from mcp_sandbox.settings import Settings

NO_HOOKS = ExecutorHooks(tools=None)
#: The checkout measured: the server is started with it on its PYTHONPATH too.
CHECKOUT = Path(mcp_sandbox.__file__).resolve().parent.parent
COLD_STARTS = 3
IDLE_SETTLE_S = 3.0  # a new sandbox's memory, this long after `ready`
WARM_CALLS, WARMUP_CALLS = 200, 5
JIT_WARM_UP_S = 6.0  # 100 rounds of the guest's sample program, in idle time
SESSIONLESS_CALLS = 60
POOL_SETTLE_S = 8.0
SMALL_SESSION = "import json, re, collections, dataclasses, statistics\nx = 41"
BIG_MB = 40
BIG_SESSION = f"""
import hashlib
big = bytearray(range(256)) * ({BIG_MB} * 4096)
digest = hashlib.sha256(big).hexdigest()
len(big)
"""
BIG_CHECK = "hashlib.sha256(big).hexdigest() == digest and len(big) == " + str(BIG_MB * 2**20)
# Upper bounds: a hung sandbox or server fails the run instead of stalling it.
PHASE_LIMIT_S = 180.0
LOOP_LIMIT_S = 45.0
DENO_LIMIT_S = 120.0
RESULTS = Path(__file__).resolve().parent / "results"
MB = 2**20


def memory_mb(pid: int) -> tuple[float, float]:
    """(PSS of `pid` and everything under it, RSS of `pid`), in MB."""
    rss = 0
    try:
        with open(f"/proc/{pid}/status") as status:
            rss = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
    except OSError:
        pass
    return pss_bytes(pid) / MB, rss / MB


async def cold_starts(backend: PyodideBackend, snapshot: bool) -> dict[str, Any]:
    """COLD_STARTS starts, spawn to `ready`, each closed after its idle memory is read."""
    kept = backend._snapshot
    if not snapshot:
        backend._snapshot = None  # the runner loads Pyodide from scratch
    times, pss, rss = [], [], []
    try:
        for _ in range(COLD_STARTS):
            began = time.perf_counter()
            executor = await backend.start()
            assert isinstance(executor, PyodideExecutor)
            times.append((time.perf_counter() - began) * 1000)
            try:
                await anyio.sleep(IDLE_SETTLE_S)
                p, r = memory_mb(executor.pid)
                pss.append(p)
                rss.append(r)
            finally:
                await executor.close()
    finally:
        backend._snapshot = kept
    return {
        "samples_ms": times,
        "median_ms": statistics.median(times),
        "idle_pss_mb": statistics.median(pss),
        "idle_rss_mb": statistics.median(rss),
    }


async def run_ok(executor: Executor, code: str) -> str | None:
    result = await executor.run(code, 30)
    if not result.success:
        raise RuntimeError(f"{code[:40]!r} failed: {result.error}")
    return result.result


async def warm_run(backend: PyodideBackend) -> dict[str, Any]:
    executor = await backend.start()
    try:
        python = await run_ok(executor, "import sys\nsys.version.split()[0]")
        await executor.jit_warm_up()  # as a session's sandbox gets after its first call
        await anyio.sleep(JIT_WARM_UP_S)
        samples = []
        deadline = time.perf_counter() + LOOP_LIMIT_S
        for i in range(WARMUP_CALLS + WARM_CALLS):
            if time.perf_counter() > deadline:
                break
            began = time.perf_counter()
            await run_ok(executor, "1 + 1")
            if i >= WARMUP_CALLS:
                samples.append((time.perf_counter() - began) * 1000)
    finally:
        await executor.close()
    return {"python": (python or "").strip("'"), "calls": len(samples), "p50_ms": statistics.median(samples)}


async def checkpoint_and_restore(backend: PyodideBackend, code: str, check: str) -> dict[str, Any]:
    """Run `code` in a new sandbox, checkpoint it, restore the checkpoint into another new sandbox
    and run `check` there, which should give True."""
    report: dict[str, Any] = {}
    source = await backend.start()
    try:
        await run_ok(source, code)
        began = time.perf_counter()
        saved = await source.checkpoint()
        report["checkpoint_ms"] = (time.perf_counter() - began) * 1000
    finally:
        await source.close()
    if isinstance(saved, NotDone):
        return report | {"saved": False, "reason": saved.reason}
    report |= {
        "saved": True,
        "raw_bytes": len(saved.payload),
        "stored_bytes": len(zstandard.ZstdCompressor(level=1).compress(saved.payload)),
    }
    target = await backend.start()
    try:
        began = time.perf_counter()
        problem = await target.restore(saved.payload)
        report["restore_ms"] = (time.perf_counter() - began) * 1000
        report["restored"] = problem is None
        if problem is not None:
            return report | {"reason": problem.reason, "survived": False}
        try:
            report["survived"] = await run_ok(target, check) == "True"
        except (RuntimeError, SandboxDied) as error:  # a restore that "worked" into a broken sandbox
            report |= {"survived": False, "reason": str(error)[:300]}
    finally:
        await target.close()
    return report


async def pyodide_snapshot_restore(
    backend: PyodideBackend, deno: Path, settings: Settings, mb: int
) -> dict[str, Any]:
    """snapshot_restore.ts: Pyodide's own snapshot of `mb` MB of Python data, restored."""
    script = Path(__file__).with_name("snapshot_restore.ts")
    command = [
        str(deno), "run", "--no-prompt", "--cached-only", "--config", str(RUNNER_DIR / "deno.json"),
        f"--allow-read={backend.lock_file().parent},{script.parent}", str(script), str(mb),
    ]  # fmt: skip
    env = {"DENO_DIR": str(settings.cache_dir / "deno"), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
    with anyio.fail_after(DENO_LIMIT_S):
        done = await anyio.run_process(command, env=env, check=False)
    lines = done.stdout.decode().strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"mb": mb, "restored": False, "error": done.stderr.decode(errors="replace").strip()[-300:]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


async def measure_backend(settings: Settings, deno: Path) -> dict[str, Any]:
    report: dict[str, Any] = {}
    with anyio.fail_after(PHASE_LIMIT_S * 2):
        async with anyio.create_task_group() as group:
            backend = PyodideBackend(settings, NO_HOOKS, group, deno)
            began = time.perf_counter()
            await backend.prepare()
            report["prepare_s"] = time.perf_counter() - began
            snapshot = backend._snapshot
            report["snapshot_bytes"] = snapshot.stat().st_size if snapshot else None
            print("cold starts ...", file=sys.stderr)
            report["cold_snapshot"] = await cold_starts(backend, snapshot=True)
            report["cold_no_snapshot"] = await cold_starts(backend, snapshot=False)
            print("warm runs ...", file=sys.stderr)
            report["warm_run"] = await warm_run(backend)
            print("checkpoints ...", file=sys.stderr)
            report["small_checkpoint"] = await checkpoint_and_restore(backend, SMALL_SESSION, "x + 1 == 42")
            report["big_checkpoint"] = await checkpoint_and_restore(backend, BIG_SESSION, BIG_CHECK)
            print("Pyodide's own snapshot restore (pyodide#6254) ...", file=sys.stderr)
            report["pyodide_snapshot"] = {
                str(mb): await pyodide_snapshot_restore(backend, deno, settings, mb) for mb in (1, BIG_MB)
            }
    return report


async def measure_server(settings: Settings) -> dict[str, Any]:
    marker = f"{os.getpid()}-versions"
    env = {
        "MCP_SANDBOX_BACKEND": "pyodide",
        "MCP_SANDBOX_POOL_SIZE": "2",
        "MCP_SANDBOX_LOG_LEVEL": "WARNING",
        "MCP_SANDBOX_CACHE_DIR": str(settings.cache_dir),
        # The server imports the same mcp_sandbox as this script.
        "PYTHONPATH": str(CHECKOUT),
        "MCP_SANDBOX_BENCH_MARKER": marker,
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)

    async def timed(client: Client, arguments: dict[str, Any]) -> float:
        began = time.perf_counter()
        response = await client.call_tool("execute_python", arguments)
        elapsed = (time.perf_counter() - began) * 1000
        result = response.structured_content
        if response.is_error or result is None or result.get("result") != "2":
            raise RuntimeError(f"execute_python failed: {response.content}")
        return elapsed

    async def loop(client: Client, arguments: dict[str, Any], count: int) -> list[float]:
        samples: list[float] = []
        deadline = time.perf_counter() + LOOP_LIMIT_S
        while len(samples) < count and time.perf_counter() < deadline:
            samples.append(await timed(client, arguments))
        return samples

    with anyio.fail_after(PHASE_LIMIT_S):
        async with Client(params) as client:
            session = {"code": "1 + 1", "session_id": "bench"}
            await loop(client, session, WARMUP_CALLS)
            await anyio.sleep(POOL_SETTLE_S)  # the JIT warm-up and the pool's refill
            in_session = await loop(client, session, WARM_CALLS)
            sessionless = {"code": "1 + 1"}
            await loop(client, sessionless, WARMUP_CALLS)
            await anyio.sleep(POOL_SETTLE_S)
            without = await loop(client, sessionless, SESSIONLESS_CALLS)
            await anyio.sleep(IDLE_SETTLE_S)
            server = server_pid(f"MCP_SANDBOX_BENCH_MARKER={marker}")
            sandboxes = sandbox_pss_mb(server) if server is not None else []
    return {
        "session_calls": len(in_session),
        "session_p50_ms": statistics.median(in_session),
        "session_p99_ms": percentile(in_session, 99),
        "sessionless_calls": len(without),
        "sessionless_p50_ms": statistics.median(without),
        "sessionless_p99_ms": percentile(without, 99),
        "server_sandboxes_pss_mb": sandboxes,
        "server_sandbox_pss_median_mb": statistics.median(sandboxes) if sandboxes else None,
    }


def sandbox_pss_mb(server: int) -> list[float]:
    """PSS of each of the server's children (its sandboxes: the session's and the pool's)."""
    return [pss_bytes(pid) / MB for pid in children().get(server, [])]


def rows(r: dict[str, Any]) -> list[tuple[str, str]]:
    b, s = r["backend"], r["server"]
    small, big = b["small_checkpoint"], b["big_checkpoint"]
    own = b["pyodide_snapshot"]

    def restored(outcome: dict[str, Any]) -> str:
        if outcome.get("restored") and outcome.get("survived"):
            return "restored, data intact"
        if outcome.get("restored"):
            return "restored, data WRONG"
        return f"FAILS: {outcome.get('error') or outcome.get('reason') or 'not saved'}"[:70]

    def size(outcome: dict[str, Any], key: str) -> str:
        return f"{outcome[key] / MB:.1f} MB" if key in outcome else "-"

    def sizes(outcome: dict[str, Any]) -> str:
        return f"{size(outcome, 'raw_bytes')} / {size(outcome, 'stored_bytes')}"

    def own_snapshot(outcome: dict[str, Any]) -> str:
        return f"{size(outcome, 'snapshot_bytes')}: {restored(outcome)}"

    cold, cold_scratch, warm = b["cold_snapshot"], b["cold_no_snapshot"], b["warm_run"]
    return [
        ("cold start from the snapshot, spawn to ready (median of 3)", f"{cold['median_ms']:,.0f} ms"),
        ("cold start without a snapshot (median of 3)", f"{cold_scratch['median_ms']:,.0f} ms"),
        ("warm Executor.run('1 + 1') p50, after the JIT warm-up", f"{warm['p50_ms']:.3f} ms"),
        ("warm call p50 in a session (MCP stdio)", f"{s['session_p50_ms']:.2f} ms"),
        ("warm call p99 in a session", f"{s['session_p99_ms']:.2f} ms"),
        ("session-less call p50, back to back (MCP stdio)", f"{s['sessionless_p50_ms']:.2f} ms"),
        ("session-less call p99", f"{s['sessionless_p99_ms']:.2f} ms"),
        ("idle new sandbox, PSS (median of 3)", f"{cold['idle_pss_mb']:.0f} MB"),
        ("idle new sandbox, RSS (median of 3)", f"{cold['idle_rss_mb']:.0f} MB"),
        (
            "idle sandbox of the server after calls, PSS (median)",
            f"{s['server_sandbox_pss_median_mb']:.0f} MB",
        ),
        ("memory snapshot", f"{b['snapshot_bytes'] / MB:.1f} MB" if b["snapshot_bytes"] else "none"),
        ("checkpoint of a small session, raw / stored", sizes(small)),
        ("  its restore into a new sandbox", f"{restored(small)}, {small.get('restore_ms', 0):.0f} ms"),
        (f"#6254: checkpoint of a {BIG_MB} MB session, raw / stored", sizes(big)),
        ("  its restore into a new sandbox", f"{restored(big)}, {big.get('restore_ms', 0):.0f} ms"),
        ("#6254: Pyodide's own snapshot, 1 MB of data", own_snapshot(own["1"])),
        (f"#6254: Pyodide's own snapshot, {BIG_MB} MB of data", own_snapshot(own[str(BIG_MB)])),
    ]


def table(r: dict[str, Any]) -> str:
    header = (
        f"mcp-sandbox Pyodide {r['pyodide']} (Python {r['backend']['warm_run']['python']}) — {r['date']}\n"
        f"machine: {r['cpu_count']} CPUs, {r['platform']}, host Python {r['python']}, {r['deno']}\n"
        f"checkout: {r['checkout']}, cache: {r['cache_dir']}\n"
    )
    lines = rows(r)
    width = max(len(label) for label, _ in lines)
    return header + "\n".join(f"{label:<{width}}  {value}" for label, value in lines)


async def measure() -> dict[str, Any]:
    settings = Settings(backend="pyodide")
    deno = find_deno(settings)
    if deno is None:
        raise RuntimeError("no Deno binary found")
    version = await anyio.run_process([str(deno), "--version"], check=False)
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "deno": version.stdout.decode().splitlines()[0] if version.stdout else "deno ?",
        "pyodide": pyodide_version(),
        "checkout": str(CHECKOUT),
        "cache_dir": str(settings.cache_dir),
        "load_average": os.getloadavg(),
    }
    print(f"Pyodide {results['pyodide']}, cache {settings.cache_dir}: the backend ...", file=sys.stderr)
    results["backend"] = await measure_backend(settings, deno)
    print("the MCP server ...", file=sys.stderr)
    results["server"] = await measure_server(settings)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--json", type=Path, default=None, help="results file (bench/results/pyodide-VERSION.json)"
    )
    arguments = parser.parse_args()
    results = anyio.run(measure)
    print(table(results))
    path: Path = arguments.json or RESULTS / f"pyodide-{results['pyodide']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
