"""Faults that should cost neither the session nor the process, through a real MCP client.

Run from the repository root:  .venv/bin/python bench/bench_faults.py [--json PATH]
                               [--backends pyodide,subprocess]

For each backend a server runs over stdio (pool of 2). Each program below runs in a session that
first set `x = 41`; the row says what came back, how long it took, the CPU the server and its
sandboxes used for it, and whether `x` was still there afterwards (and whether the result said it
had been restored). Then: the CPU a crash costs (`os._exit` and the call after it), and the idle
memory (PSS) of a started sandbox. About 2 minutes a backend.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from bench_clean_sandbox import cpu_seconds
from bench_latency import server_pid
from common import children, save
from mcp import Client, StdioServerParameters

#: name, program, timeout.
PROGRAMS: list[tuple[str, str, float]] = [
    ("time.sleep(5), timeout 0.5", "import time\ntime.sleep(5)", 0.5),
    ("await asyncio.sleep(5), timeout 0.5", "import asyncio\nawait asyncio.sleep(5)", 0.5),
    ("input()", "input()", 10),
    ("time.sleep(2)", "import time\ntime.sleep(2)", 10),
    (
        "asyncio.run(main())",
        "import asyncio\nasync def main():\n    await asyncio.sleep(0.01)\n    return 7\nasyncio.run(main())",
        10,
    ),
    (
        "40 x 100 MB allocations",
        "blocks = []\nfor _ in range(40):\n    blocks.append(bytearray(100 * 2**20))",
        30,
    ),
    (
        "a loop swallowing KeyboardInterrupt, timeout 0.5",
        "while True:\n    try:\n        while True:\n            pass\n"
        "    except KeyboardInterrupt:\n        pass",
        0.5,
    ),
]
CRASH = "import os\nos._exit(3)"
CRASHES = 5
SERVER_ENV = {
    "MCP_SANDBOX_POOL_SIZE": "2",
    "MCP_SANDBOX_LOG_LEVEL": "WARNING",
    "MCP_SANDBOX_MEMORY_MB": "512",
}
SETTLE_S = 8.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "faults.json"


def pss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def sandbox_pss(server: int) -> list[float]:
    """PSS of each of the server's sandboxes: a child process with everything under it."""
    tree = children()

    def total(pid: int) -> float:
        return pss_mb(pid) + sum(total(child) for child in tree.get(pid, []))

    return [total(pid) for pid in tree.get(server, [])]


async def one_program(client: Client, server: int, name: str, code: str, timeout: float) -> dict[str, Any]:
    session = f"s-{abs(hash(name))}"
    await client.call_tool("execute_python", {"code": "x = 41", "session_id": session})
    await anyio.sleep(3.0)  # its checkpoint, taken after 2 s idle
    cpu_before, began = cpu_seconds(server), time.perf_counter()
    response = await client.call_tool(
        "execute_python", {"code": code, "session_id": session, "timeout": timeout}
    )
    seconds = time.perf_counter() - began
    cpu = cpu_seconds(server) - cpu_before
    result = response.structured_content or {}
    after = (
        await client.call_tool("execute_python", {"code": "x", "session_id": session})
    ).structured_content or {}
    return {
        "program": name,
        "seconds": round(seconds, 3),
        "cpu_s": round(cpu, 3),
        "error_type": result.get("error_type"),
        "result": result.get("result"),
        "error": (result.get("error") or "")[:160],
        "x_kept": after.get("result") == "41",
        "restored": bool(result.get("session_restored") or after.get("session_restored")),
        "killed": bool(result.get("session_lost") or result.get("session_restored")),
    }


async def crash_cost(client: Client, server: int) -> dict[str, Any]:
    """CPU of a crash plus the call after it, less that of two ordinary calls."""
    session = "crashy"
    costs = []
    for _ in range(CRASHES):
        await client.call_tool("execute_python", {"code": "y = 1", "session_id": session})
        await anyio.sleep(3.0)  # its checkpoint, taken after 2 s idle
        cpu_before = cpu_seconds(server)
        await client.call_tool("execute_python", {"code": "y = 2", "session_id": session})
        await client.call_tool("execute_python", {"code": "y", "session_id": session})
        plain = cpu_seconds(server) - cpu_before
        cpu_before = cpu_seconds(server)
        await client.call_tool("execute_python", {"code": CRASH, "session_id": session})
        await client.call_tool("execute_python", {"code": "y", "session_id": session})
        await anyio.sleep(SETTLE_S)  # the pool's replacement, if one was started, is counted too
        costs.append(cpu_seconds(server) - cpu_before - plain)
    return {"crash_cpu_s": round(statistics.median(costs), 3)}


async def measure_backend(backend: str) -> dict[str, Any]:
    marker = f"MCP_SANDBOX_BENCH_MARKER={os.getpid()}-{backend}"
    env = {
        **os.environ,
        **SERVER_ENV,
        "MCP_SANDBOX_BACKEND": backend,
        marker.split("=")[0]: marker.split("=")[1],
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)
    with anyio.fail_after(600):
        async with Client(params) as client:
            server = server_pid(marker)
            assert server is not None
            await client.call_tool("execute_python", {"code": "1"})
            await anyio.sleep(SETTLE_S)
            idle = sandbox_pss(server)
            rows = [await one_program(client, server, *program) for program in PROGRAMS]
            row: dict[str, Any] = {
                "programs": rows,
                "idle_pss_mb": round(statistics.median(idle), 1) if idle else None,
            }
            row |= await crash_cost(client, server)
    return row


def table(results: dict[str, Any]) -> str:
    lines = [f"mcp-sandbox faults — {results['date']}, {results['cpu_count']} cores"]
    for backend, row in results["backends"].items():
        lines.append(
            f"\n{backend}: idle PSS per sandbox {row['idle_pss_mb']} MB; CPU per crash {row['crash_cpu_s']} s"
        )
        lines.append(
            f"{'program':<50}{'s':>7}{'cpu s':>7}  {'error_type':<16}{'x kept':<8}{'restored':<9}result"
        )
        for p in row["programs"]:
            lines.append(
                f"{p['program']:<50}{p['seconds']:>7.2f}{p['cpu_s']:>7.2f}  {p['error_type'] or '-':<16}"
                f"{p['x_kept']!s:<8}{p['restored']!s:<9}{p['result'] or p['error'][:60]}"
            )
    return "\n".join(lines)


async def measure(backends: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "backends": {},
    }
    for backend in backends:
        print(f"measuring {backend} ...", file=sys.stderr)
        results["backends"][backend] = await measure_backend(backend)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--backends", default="pyodide,subprocess")
    args = parser.parse_args()
    results = anyio.run(measure, [name.strip() for name in args.backends.split(",") if name.strip()])
    save(results, args.json, table(results))


if __name__ == "__main__":
    main()
