"""Checkpoints: what one costs, how big it is, and how fast a session comes back.

Run from the repository root:  .venv/bin/python bench/bench_checkpoints.py [--json PATH]
[--state-url redis://127.0.0.1:6379/0] (the store: a temporary folder unless a URL is given)

Through the Python API (the same App the MCP server runs), pyodide, pool of 2:

1. A session's warm calls made 3 s apart, so each is followed by a checkpoint: p50 with
   checkpoints on against off, and the CPU (server and sandboxes) per call, gaps included.
2. One checkpoint, for three sessions (nothing, `x = 41` after a few imports, a 1 MB list):
   the worker's time, the bytes before compression and as stored.
3. Resume: a second server on the same state folder; the first call of a saved session (load,
   restore, run) against the first call of a new session, median of several.
About 3 minutes. With --sessions 1000 instead: 1,000 sessions each holding a 1 MB list, 8 live at
once (the rest hibernated), then every one asked about its list; the highest memory (PSS) of the
server and its sandboxes, and the disk used. About 5 minutes.
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
from bench_clean_sandbox import cpu_seconds

from mcp_sandbox import Sandbox
from mcp_sandbox.backends.base import Checkpoint

GAP_S = 3.0  # longer than the quiet time a checkpoint waits for, plus the checkpoint
SPACED_CALLS = 25
RESUMES = 7
#: The sessions-held row: sandboxes live at once (the rest hibernated).
MAX_LIVE = 8
SESSIONS = {
    "empty": "pass",
    "x = 41 after imports": "import json, re, collections, dataclasses, statistics\nx = 41",
    "a 1 MB list": "data = list(range(1_000_000 // 8))\nfiller = bytearray(b'x') * 1_000_000",
}
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "checkpoints.json"


#: --state-url: the store every phase uses (a redis:// URL), each phase under keys of its own.
STATE_URL: str | None = None


def options(state_dir: Path, checkpoints: bool = True) -> dict[str, Any]:
    where: dict[str, Any] = {"state_dir": state_dir}
    if STATE_URL is not None:
        where = {"state_url": STATE_URL, "state_key_prefix": f"bench-{state_dir.name}-{os.getpid()}:"}
    return {"pool_size": 2, **where, "checkpoints": checkpoints, "log_level": "WARNING"}


async def spaced_calls(state_dir: Path, checkpoints: bool) -> dict[str, float]:
    async with Sandbox("pyodide", **options(state_dir, checkpoints)) as sandbox:
        await sandbox.run("import json\nn = 0", session_id="spaced")
        for _ in range(5):  # the first calls compile what later calls reuse
            await sandbox.run("n += 1", session_id="spaced")
        await anyio.sleep(3)
        samples = []
        cpu_before = cpu_seconds(os.getpid())
        for _ in range(SPACED_CALLS):
            began = time.perf_counter()
            result = await sandbox.run("n += 1\njson.dumps({'n': n})", session_id="spaced")
            samples.append((time.perf_counter() - began) * 1000)
            assert result.success, result
            await anyio.sleep(GAP_S)
        cpu = cpu_seconds(os.getpid()) - cpu_before
    return {"p50_ms": statistics.median(samples), "cpu_ms_per_call": cpu * 1000 / SPACED_CALLS}


async def checkpoint_sizes(state_dir: Path) -> dict[str, dict[str, float]]:
    sizes: dict[str, dict[str, float]] = {}
    async with Sandbox("pyodide", **options(state_dir, checkpoints=False)) as sandbox:
        app = sandbox._started()
        for index, (name, code) in enumerate(SESSIONS.items()):
            session_id = f"size-{index}"
            result = await sandbox.run(code, session_id=session_id)
            assert result.success, result
            executor = app.sessions._sessions[session_id].executor
            assert executor is not None
            began = time.perf_counter()
            saved = await executor.checkpoint()
            took = (time.perf_counter() - began) * 1000
            assert isinstance(saved, Checkpoint), saved
            store = app.sessions._store
            assert store is not None
            from mcp_sandbox.store import SavedState

            stored = await store.save(session_id, SavedState("pyodide", app.backend.build, saved.payload, 1))
            sizes[name] = {"checkpoint_ms": took, "raw_bytes": len(saved.payload), "stored_bytes": stored}
    return sizes


async def resumes(state_dir: Path) -> dict[str, float]:
    async with Sandbox("pyodide", **options(state_dir)) as sandbox:
        for i in range(RESUMES):
            await sandbox.run("import json, re, collections\nx = 41", session_id=f"resume-{i}")
        await anyio.sleep(3)
    fresh, restored = [], []
    async with Sandbox("pyodide", **options(state_dir)) as sandbox:
        await anyio.sleep(5)  # the pool is full and settled
        for i in range(RESUMES):
            began = time.perf_counter()
            result = await sandbox.run("x + 1", session_id=f"resume-{i}")
            restored.append((time.perf_counter() - began) * 1000)
            assert result.session_restored and result.result == "42", result
            await anyio.sleep(2)  # the pool refills
            began = time.perf_counter()
            result = await sandbox.run("x = 41\nx + 1", session_id=f"new-{i}")
            fresh.append((time.perf_counter() - began) * 1000)
            assert result.result == "42", result
            await anyio.sleep(2)
    return {
        "resume_first_call_p50_ms": statistics.median(restored),
        "new_session_first_call_p50_ms": statistics.median(fresh),
        "ratio": statistics.median(restored) / statistics.median(fresh),
    }


def summary(report: dict[str, Any]) -> str:
    off, on, sizes, resumed = report["spaced_off"], report["spaced_on"], report["sizes"], report["resume"]
    lines = [
        f"\nmcp-sandbox checkpoints — {report['date']}, {report['cpu_count']} cores, pyodide",
        f"warm call p50, calls {GAP_S:g} s apart: off {off['p50_ms']:.2f} ms, on {on['p50_ms']:.2f} ms "
        f"({on['p50_ms'] / off['p50_ms']:.2f}x)",
        f"CPU per call, gap included: off {off['cpu_ms_per_call']:.1f} ms, on {on['cpu_ms_per_call']:.1f} ms "
        f"(so a checkpoint: {on['cpu_ms_per_call'] - off['cpu_ms_per_call']:.1f} ms)",
    ]
    for name, size in sizes.items():
        lines.append(
            f"checkpoint of {name}: {size['checkpoint_ms']:.1f} ms, {size['raw_bytes'] / 2**20:.2f} MB raw, "
            f"{size['stored_bytes'] / 2**20:.2f} MB stored"
        )
    lines.append(
        f"first call of a restored session p50 {resumed['resume_first_call_p50_ms']:.1f} ms, of a new "
        f"session {resumed['new_session_first_call_p50_ms']:.1f} ms ({resumed['ratio']:.2f}x)"
    )
    return "\n".join(lines)


def pss_bytes(root: int) -> int:
    """Proportional set size of `root` and every process under it (shared pages counted once)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as file:
                    parents[int(entry)] = int(file.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    total = 0
    for pid in tree:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as file:
                total += sum(int(line.split()[1]) * 1024 for line in file if line.startswith("Pss:"))
        except OSError:
            continue
    return total


async def many_sessions(state_dir: Path, count: int) -> dict[str, float]:
    """`count` sessions, each holding a 1 MB list, then every one asked about its list, with at
    most MAX_LIVE sandboxes live: the memory of the server and its sandboxes, at its highest."""
    settings = options(state_dir) | {"max_sessions": count + 10, "max_live_sandboxes": MAX_LIVE}
    peak = 0

    async def watch() -> None:
        nonlocal peak
        while True:
            peak = max(peak, await anyio.to_thread.run_sync(pss_bytes, os.getpid()))
            await anyio.sleep(0.5)

    async with Sandbox("pyodide", **settings) as sandbox, anyio.create_task_group() as group:
        group.start_soon(watch)
        began = time.perf_counter()
        for i in range(count):
            # 1 MB of references: tuple.__itemsize__ is a pointer's size (4 bytes in WebAssembly).
            result = await sandbox.run(f"data = [{i}] * (2**20 // tuple.__itemsize__)", session_id=f"s{i}")
            assert result.success, result
        filled = time.perf_counter() - began
        wrong = 0
        began = time.perf_counter()
        for i in range(count):
            result = await sandbox.run(
                f"len(data) == 2**20 // tuple.__itemsize__ and data[-1] == {i}", session_id=f"s{i}"
            )
            wrong += result.result != "True"
        answered = time.perf_counter() - began
        group.cancel_scope.cancel()
    stored = sum(path.stat().st_size for path in (state_dir / "sessions").glob("*.state"))
    return {
        "sessions": count,
        "max_live_sandboxes": MAX_LIVE,
        "wrong_answers": wrong,
        "fill_s": filled,
        "answer_all_s": answered,
        "peak_pss_mb": peak / 2**20,
        "stored_mb": stored / 2**20,
    }


async def main(json_path: Path, sessions: int) -> None:
    report: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        if sessions:
            print(f"{sessions} sessions held ...", file=sys.stderr)
            report["many"] = held = await many_sessions(root / "many", sessions)
            print(
                f"{held['sessions']} sessions of a 1 MB list, {MAX_LIVE} live: "
                f"filled in {held['fill_s']:.0f} s, all answered in {held['answer_all_s']:.0f} s "
                f"({held['wrong_answers']} wrong), peak {held['peak_pss_mb']:.0f} MB "
                f"(PSS, server and sandboxes), {held['stored_mb']:.0f} MB stored"
            )
            await anyio.Path(json_path.parent).mkdir(parents=True, exist_ok=True)
            await anyio.Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
            return
        print("spaced calls, checkpoints off ...", file=sys.stderr)
        off = await spaced_calls(root / "off", checkpoints=False)
        print("spaced calls, checkpoints on ...", file=sys.stderr)
        on = await spaced_calls(root / "on", checkpoints=True)
        print("checkpoint sizes ...", file=sys.stderr)
        sizes = await checkpoint_sizes(root / "sizes")
        print("resumes ...", file=sys.stderr)
        resumed = await resumes(root / "resume")
    report |= {"spaced_off": off, "spaced_on": on, "sizes": sizes, "resume": resumed}
    print(summary(report))
    await anyio.Path(json_path.parent).mkdir(parents=True, exist_ok=True)
    await anyio.Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {json_path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument(
        "--sessions", type=int, default=0, help="instead: the sessions-held row with this many (1000)"
    )
    parser.add_argument("--state-url", help="keep sessions there (redis://...) instead of in a folder")
    arguments = parser.parse_args()
    STATE_URL = arguments.state_url
    anyio.run(main, arguments.json, arguments.sessions)
