"""A clean sandbox per caller: session-less calls back to back, and a mixed load.

Run from the repository root:  .venv/bin/python bench/bench_clean_sandbox.py [--json PATH]
                               [--configs pyodide,pyodide-new-process,subprocess]

Each configuration gets its own server process, bridging bench/fast_upstream.py as `calc`; the
session-less calls run twice, plain and with two bridged tool calls (one blocking, one `_async`).
`pyodide` recycles a used sandbox in place (the default); `pyodide-new-process` is the same server
with MCP_SANDBOX_RECYCLE=false, which is how every session-less call was served before: a new Deno
process each. About 5 minutes.
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
import httpx
from bench_latency import percentile, server_pid
from common import save
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

CONFIGS: dict[str, dict[str, str]] = {
    "pyodide": {"MCP_SANDBOX_BACKEND": "pyodide"},
    "pyodide-new-process": {"MCP_SANDBOX_BACKEND": "pyodide", "MCP_SANDBOX_RECYCLE": "false"},
    "subprocess": {"MCP_SANDBOX_BACKEND": "subprocess"},
}
#: The measured settings: a pool of 8 on a 2-core machine.
SERVER_ENV = {
    "MCP_SANDBOX_POOL_SIZE": "8",
    "MCP_SANDBOX_LOG_LEVEL": "WARNING",
    "MCP_SANDBOX_MAX_SESSIONS": "64",
}
SESSIONLESS_CALLS = 60
CODE = "x = sum(range(1000))\nx"
#: The same, through the tool bridge: one blocking call and one `_async` call to a microsecond upstream.
BRIDGED_CODE = (
    "import asyncio\n(tools.calc.add(a=1, b=2), (await asyncio.gather(tools.calc.add_async(a=2, b=2)))[0])"
)
BRIDGED_RESULT = "({'sum': 3}, {'sum': 4})"
UPSTREAM = {"command": sys.executable, "args": [str(Path(__file__).resolve().parent / "fast_upstream.py")]}
POOL_SETTLE_S = 25.0  # eight Pyodide sandboxes starting on two cores
#: The mixed load: clients at once, calls each, over streamable HTTP.
MIXED_CLIENTS, MIXED_CALLS = 16, 20
#: One client's calls, in turn: in-session calls that count, timeouts (the session survives them),
#: crashes (in a session of their own), and calls without a session.
MIX = ["session", "sessionless", "session", "timeout", "session", "crash", "session", "sessionless"]
#: A sandbox that exits (inprocess has no sandbox to crash: os._exit would end the server).
CRASH = "import os\nos._exit(3)"
#: What agents time out on most: a wait (a polling loop's sleep).
TIMEOUT = "import time\ntime.sleep(5)"
PHASE_LIMIT_S = 300.0
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "clean_sandbox.json"


def cpu_seconds(pid: int) -> float:
    """CPU of `pid` and everything it has reaped, plus its live descendants."""
    ticks = os.sysconf("SC_CLK_TCK")

    def stat(p: int) -> list[bytes]:
        with open(f"/proc/{p}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()

    fields = stat(pid)
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != pid:
            try:
                child = stat(int(entry))
                if int(child[1]) == pid:
                    total += sum(int(child[i]) for i in (11, 12))
            except (OSError, ValueError, IndexError):
                continue
    return total / ticks


async def sessionless(client: Client, server: int) -> dict[str, Any]:
    for code in (CODE, BRIDGED_CODE) * 2:  # the first calls compile what later calls reuse
        await client.call_tool("execute_python", {"code": code})
    await anyio.sleep(POOL_SETTLE_S)
    row: dict[str, Any] = {}
    for prefix, code, expected in (
        ("sessionless", CODE, "499500"),
        ("bridged", BRIDGED_CODE, BRIDGED_RESULT),
    ):
        samples = []
        cpu_before, started = cpu_seconds(server), time.perf_counter()
        for _ in range(SESSIONLESS_CALLS):
            began = time.perf_counter()
            response = await client.call_tool("execute_python", {"code": code})
            samples.append((time.perf_counter() - began) * 1000)
            assert response.structured_content and response.structured_content["result"] == expected, response
        elapsed = time.perf_counter() - started
        cpu = cpu_seconds(server) - cpu_before
        row |= {
            f"{prefix}_calls_per_s": SESSIONLESS_CALLS / elapsed,
            f"{prefix}_p50_ms": statistics.median(samples),
            f"{prefix}_p99_ms": percentile(samples, 99),
            f"{prefix}_cpu_ms_per_call": cpu * 1000 / SESSIONLESS_CALLS,
        }
        await anyio.sleep(POOL_SETTLE_S / 5)  # sandboxes replaced in the first phase start again
    return row


def mixed_call(client_index: int, call: int) -> tuple[str, dict[str, Any]]:
    """What call `call` of client `client_index` sends: the kind, and the arguments."""
    state, crashy = f"state-{client_index}", f"crashy-{client_index}"
    kind = MIX[call % len(MIX)]
    if kind == "session":
        return kind, {"code": "n = globals().get('n', 0) + 1\nn", "session_id": state}
    if kind == "timeout":
        return kind, {"code": TIMEOUT, "session_id": state, "timeout": 1}
    if kind == "crash":
        return kind, {"code": CRASH, "session_id": crashy}
    return kind, {"code": CODE}


async def mixed(url: str) -> dict[str, Any]:
    samples: list[float] = []
    by_kind: dict[str, list[float]] = {}
    problems: list[str] = []
    restores: list[str] = []

    async def one_client(index: int) -> None:
        async with (
            httpx.AsyncClient(timeout=120) as http,
            Client(streamable_http_client(url, http_client=http)) as client,
        ):
            counted, restored = 0, False
            for call in range(MIXED_CALLS):
                kind, arguments = mixed_call(index, call)
                began = time.perf_counter()
                response = await client.call_tool("execute_python", arguments)
                samples.append((time.perf_counter() - began) * 1000)
                by_kind.setdefault(kind, []).append(samples[-1])
                result = response.structured_content
                if response.is_error or result is None:
                    problems.append(f"{kind}: unanswered")
                    continue
                if result.get("session_restored") and arguments.get("session_id") == f"state-{index}":
                    # Killed (an interrupt that missed its grace) and brought back from its last
                    # checkpoint, which the result says: n may go back to it, once, and it is counted.
                    restores.append(f"client {index}: restored from call {result['restored_from_call']}")
                    restored = True
                if kind == "session":
                    counted += 1
                    if restored and result["result"] is not None and int(result["result"]) < counted:
                        counted, restored = int(result["result"]), False
                    if result["result"] != str(counted):
                        problems.append(
                            f"client {index}: state lost, n={result['result']} after {counted} calls"
                        )
                elif kind == "timeout" and result["error_type"] != "Timeout":
                    problems.append(f"timeout: {result['error_type']}")

    started = time.perf_counter()
    with anyio.fail_after(PHASE_LIMIT_S):
        async with anyio.create_task_group() as group:
            for index in range(MIXED_CLIENTS):
                group.start_soon(one_client, index)
    elapsed = time.perf_counter() - started
    return {
        "mixed_calls_per_s": MIXED_CLIENTS * MIXED_CALLS / elapsed,
        "mixed_p50_ms": statistics.median(samples),
        "mixed_p99_ms": percentile(samples, 99),
        "mixed_p50_ms_by_kind": {kind: statistics.median(times) for kind, times in by_kind.items()},
        "mixed_max_ms_by_kind": {kind: max(times) for kind, times in by_kind.items()},
        "mixed_problems": problems,
        "mixed_restores": restores,
    }


async def measure_config(name: str, bridge_config: Path, only_mixed: bool) -> dict[str, Any]:
    marker = f"MCP_SANDBOX_BENCH_MARKER={os.getpid()}-{name}"
    env = {**os.environ, **SERVER_ENV, **CONFIGS[name], marker.split("=")[0]: marker.split("=")[1]}
    env["MCP_SANDBOX_BRIDGE_CONFIG"] = str(bridge_config)
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env)
    row: dict[str, Any] = {}
    if not only_mixed:
        with anyio.fail_after(PHASE_LIMIT_S):
            async with Client(params) as client:
                server = server_pid(marker)
                assert server is not None
                row = await sessionless(client, server)
    port = 18_600 + list(CONFIGS).index(name)
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    async with await anyio.open_process(command, env=env) as process:
        try:
            url = f"http://127.0.0.1:{port}/mcp"
            with anyio.fail_after(60):
                while True:
                    try:
                        async with httpx.AsyncClient() as http:
                            await http.get(url)
                        break
                    except httpx.TransportError:
                        await anyio.sleep(0.2)
            await anyio.sleep(POOL_SETTLE_S)
            cpu_before = cpu_seconds(process.pid)
            row |= await mixed(url)
            # The server and its sandboxes, those that ended (reaped) included.
            row["mixed_cpu_s"] = cpu_seconds(process.pid) - cpu_before
        finally:
            if process.returncode is None:
                process.terminate()
            with anyio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                process.kill()
    return row


ROWS = [
    ("session-less calls back to back", "sessionless_calls_per_s", "{:,.1f}/s"),
    ("  p50", "sessionless_p50_ms", "{:,.1f} ms"),
    ("  p99", "sessionless_p99_ms", "{:,.1f} ms"),
    ("  CPU per call (server + sandboxes)", "sessionless_cpu_ms_per_call", "{:,.1f} ms"),
    ("the same with two bridged tool calls", "bridged_calls_per_s", "{:,.1f}/s"),
    ("  p50", "bridged_p50_ms", "{:,.1f} ms"),
    ("  p99", "bridged_p99_ms", "{:,.1f} ms"),
    ("  CPU per call (server + sandboxes)", "bridged_cpu_ms_per_call", "{:,.1f} ms"),
    (f"mixed load, {MIXED_CLIENTS} clients x {MIXED_CALLS} calls", "mixed_calls_per_s", "{:,.1f}/s"),
    ("  p50", "mixed_p50_ms", "{:,.1f} ms"),
    ("  p99", "mixed_p99_ms", "{:,.1f} ms"),
]


def table(results: dict[str, Any]) -> str:
    names = list(results["configs"])
    lines = [f"mcp-sandbox clean sandbox — {results['date']}, {results['cpu_count']} cores, pool of 8"]
    lines.append(f"{'':<42}" + "".join(f"{name:>22}" for name in names))
    for label, key, form in ROWS:
        if any(key not in results["configs"][name] for name in names):
            continue
        cells = "".join(f"{form.format(results['configs'][name][key]):>22}" for name in names)
        lines.append(f"{label:<42}{cells}")
    for name in names:
        if problems := results["configs"][name]["mixed_problems"]:
            lines.append(f"{name}: {len(problems)} problems in the mixed load, e.g. {problems[:3]}")
        if restores := results["configs"][name].get("mixed_restores"):
            lines.append(
                f"{name}: {len(restores)} sessions restored after a kill, said in the result: {restores[:3]}"
            )
    return "\n".join(lines)


async def measure(configs: list[str], only_mixed: bool) -> dict[str, Any]:
    results: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "configs": {},
    }
    with tempfile.TemporaryDirectory() as folder:
        bridge_config = Path(folder) / "upstreams.json"
        bridge_config.write_text(json.dumps({"mcpServers": {"calc": UPSTREAM}}))
        for name in configs:
            print(f"measuring {name} ...", file=sys.stderr)
            results["configs"][name] = await measure_config(name, bridge_config, only_mixed)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--only-mixed", action="store_true", help="the mixed load alone")
    args = parser.parse_args()
    configs = [name.strip() for name in args.configs.split(",") if name.strip()]
    if not configs or set(configs) - set(CONFIGS):
        parser.error(f"--configs takes names from {', '.join(CONFIGS)}")
    results = anyio.run(measure, configs, args.only_mixed)
    save(results, args.json, table(results))


if __name__ == "__main__":
    main()
