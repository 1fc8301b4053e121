"""What a subprocess sandbox spends of its memory limit before, and while, a program runs.

    .venv/bin/python bench/bench_subprocess_memory.py [--tiers bubblewrap,landlock,none] [--json PATH]

Each tier the machine offers gets its own `SubprocessBackend` in this process (no MCP), with the
default settings (so the default MCP_SANDBOX_MEMORY_MB), timed from `prepare()` (the server's
start) on. Per tier, each in a new sandbox:

- idle worker: VmSize, VmPeak and VmRSS of the worker (/proc/<pid>/status) once it is ready;
- first matplotlib call: `import matplotlib.pyplot as plt; plt.plot([1, 2]); plt.savefig(...)`,
  timed as the host's `Executor.run`, and its CPU time in the sandbox (the worker's and its
  children's: steadier than wall time on a busy machine), and whether matplotlib built its font
  cache (it ran `fc-list`, or wrote its fontlist file);
- a 300 MB program: numpy's 300 MB array, every page touched, with matplotlib imported; whether
  it passed, and the worker's VmPeak and VmHWM (peak resident memory) after it.

Writes bench/results/subprocess_memory.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import anyio
import anyio.abc
from common import save

from mcp_sandbox.backends.base import ExecutorHooks, SandboxStartError
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.backends.subprocess import SubprocessExecutor
from mcp_sandbox.settings import Settings

NO_HOOKS = ExecutorHooks(None)
PHASE_LIMIT_S = 600
#: The first matplotlib call, and whether it built the font cache.
FIRST_PLOT = """
import json, os, resource, time
def cpu():
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
folder = os.path.expanduser("~/.cache/matplotlib")
def stamps():
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return {name: os.stat(os.path.join(folder, name)).st_mtime_ns for name in names}
before = stamps()
started, cpu_started = time.perf_counter(), cpu()
import matplotlib.pyplot as plt
plt.plot([1, 2]); plt.savefig("output/first.png"); plt.close("all")
ms, cpu_ms = (time.perf_counter() - started) * 1000, (cpu() - cpu_started) * 1000
import matplotlib.font_manager as fm
print(json.dumps({"ms": ms, "cpu_ms": cpu_ms, "fc_list_ran": fm._get_fontconfig_fonts.cache_info().misses > 0,
                  "cache_written": stamps() != before}))
"""
#: A program that needs 300 MB of real memory, with matplotlib loaded.
BIG = """
import numpy as np
import matplotlib.pyplot as plt
a = np.ones(300 * 2**20 // 8)  # np.ones writes every page
plt.plot(a[:10]); plt.savefig("output/big.png"); plt.close("all")
float(a.sum())
"""


def status(pid: int) -> dict[str, int]:
    """The worker's memory lines of /proc/<pid>/status, in MB."""
    wanted = ("VmSize", "VmPeak", "VmRSS", "VmHWM")
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in wanted:
            found[name] = round(int(value.split()[0]) / 1024)
    return found


async def measure_tier(tier: str, group: anyio.abc.TaskGroup) -> dict[str, Any]:
    settings = Settings.model_validate({"backend": "subprocess", "isolation": tier})
    started = time.perf_counter()
    try:
        backend = await prepare_backend(settings, NO_HOOKS, group)
    except SandboxStartError as error:
        return {"missing": str(error)[:200]}
    row: dict[str, Any] = {
        "memory_mb": settings.memory_mb,
        "prepare_ms": (time.perf_counter() - started) * 1000,
    }

    executor = cast(SubprocessExecutor, await backend.start())
    await anyio.sleep(0.5)  # let it settle after `ready`
    row["idle"] = status(executor.signal_pid)
    await executor.close()

    executor = cast(SubprocessExecutor, await backend.start())
    started = time.perf_counter()
    result = await executor.run(FIRST_PLOT, 120)
    host_ms = (time.perf_counter() - started) * 1000
    if not result.success:
        raise RuntimeError(f"{tier}: the first plot failed: {result.error}")
    row["first_plot"] = {**json.loads(result.stdout.strip().splitlines()[-1]), "host_ms": host_ms}
    await executor.close()

    executor = cast(SubprocessExecutor, await backend.start())
    result = await executor.run(BIG, 120)
    row["big"] = {
        "passed": result.success,
        "error": None if result.success else (result.error or "")[-200:],
        **status(executor.signal_pid),
    }
    await executor.close()
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiers", default="bubblewrap,landlock,none", help="comma-separated")
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "subprocess_memory.json"
    )
    args = parser.parse_args()
    tiers: dict[str, Any] = {}
    with anyio.fail_after(PHASE_LIMIT_S):
        async with anyio.create_task_group() as group:
            for tier in args.tiers.split(","):
                tiers[tier] = await measure_tier(tier, group)
    lines = [
        f"subprocess sandbox memory — {datetime.now(UTC).isoformat(timespec='seconds')}, "
        f"{platform.platform()}, Python {platform.python_version()}",
        f"{'':<12}{'prepare':>9}{'idle VmSize':>12}{'VmPeak':>8}{'VmRSS':>7}"
        f"{'1st plot':>10}{'its CPU':>9}{'fc-list':>8}"
        f"{'300 MB':>8}{'VmPeak':>8}{'VmHWM':>7}",
    ]
    for tier, row in tiers.items():
        if "missing" in row:
            lines.append(f"{tier:<12}not on this machine: {row['missing']}")
            continue
        idle, plot, big = row["idle"], row["first_plot"], row["big"]
        lines.append(
            f"{tier:<12}{row['prepare_ms']:>6.0f} ms"
            f"{idle['VmSize']:>9} MB{idle['VmPeak']:>5} MB{idle['VmRSS']:>4} MB"
            f"{plot['host_ms']:>7.0f} ms{plot['cpu_ms']:>6.0f} ms{'ran' if plot['fc_list_ran'] else 'no':>8}"
            f"{'passed' if big['passed'] else 'FAILED':>8}{big['VmPeak']:>5} MB{big['VmHWM']:>4} MB"
        )
    save(
        {"date": datetime.now(UTC).isoformat(timespec="seconds"), "tiers": tiers}, args.json, "\n".join(lines)
    )


if __name__ == "__main__":
    anyio.run(main)
