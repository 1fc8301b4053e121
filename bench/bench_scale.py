"""Many sessions through few sandboxes: N sessions (1,000 by default) through one server with
MCP_SANDBOX_MAX_LIVE_SANDBOXES=8, their state in Redis, and the peak memory of the server, its
sandboxes and Redis together.

Run from the repository root:  .venv/bin/python bench/bench_scale.py [--sessions N]
                               [--backend subprocess|pyodide] [--json PATH]

A redis-server of its own (persistence off) on 127.0.0.1. Each session runs one call that keeps a
list of 10,000 ints, in 8 concurrent streams; sessions past the 8th live sandbox are hibernated
(checkpointed to Redis, their sandbox given back). Then every 10th session is called again and
must still hold its list (restored from Redis). Memory is the sum of resident memory (VmRSS) of
the server's process tree and of redis-server, sampled every 0.2 s; Redis's own `used_memory`
is read at the end.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import redis.asyncio
from common import children, free_port, save, wait_for_port
from mcp import Client

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "scale.json"
STREAMS = 8
LIVE = 8
START_LIMIT_S = 60.0
RUN_LIMIT_S = 1800.0


def rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(pid: int) -> list[int]:
    tree_of, found, todo = children(), [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(tree_of.get(current, []))
    return found


@asynccontextmanager
async def process(command: list[str], env: dict[str, str] | None = None) -> AsyncIterator[int]:
    started = await anyio.open_process(command, env=env, stdout=subprocess.DEVNULL)
    try:
        yield started.pid
    finally:
        started.terminate()
        with anyio.fail_after(60):
            await started.wait()
        await started.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--backend", default="subprocess", choices=["subprocess", "pyodide"])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    redis_binary = shutil.which("redis-server")
    if redis_binary is None:
        sys.exit("redis-server is not installed (Debian: apt-get install redis-server)")
    peak = {"total_kb": 0, "server_kb": 0, "redis_kb": 0}
    with tempfile.TemporaryDirectory() as scratch:
        redis_port, port = free_port(), free_port()
        redis_command = [redis_binary, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""]
        redis_command += ["--appendonly", "no", "--dir", scratch]
        env = {
            **os.environ,
            "MCP_SANDBOX_BACKEND": args.backend,
            "MCP_SANDBOX_STATE_URL": f"redis://127.0.0.1:{redis_port}/0",
            "MCP_SANDBOX_MAX_LIVE_SANDBOXES": str(LIVE),
            "MCP_SANDBOX_MAX_SESSIONS": str(args.sessions + 10),
            "MCP_SANDBOX_POOL_SIZE": "2",
            "MCP_SANDBOX_LOG_LEVEL": "WARNING",
        }
        server_command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http"]
        async with (
            process(redis_command) as redis_pid,
            process([*server_command, "--port", str(port)], env) as server_pid,
        ):
            await wait_for_port(redis_port, START_LIMIT_S)
            await wait_for_port(port, START_LIMIT_S)

            async def sample(stop: anyio.Event) -> None:
                while not stop.is_set():
                    server = sum(rss_kb(pid) for pid in tree(server_pid))
                    redis_now = rss_kb(redis_pid)
                    if server + redis_now > peak["total_kb"]:
                        peak.update(total_kb=server + redis_now, server_kb=server, redis_kb=redis_now)
                    with anyio.move_on_after(0.2):
                        await stop.wait()

            first_calls: list[float] = []
            returns: list[float] = []

            async def stream(client: Client, indexes: range) -> None:
                for index in indexes:
                    start = time.perf_counter()
                    result = await client.call_tool(
                        "execute_python",
                        {"code": "x = list(range(10_000)); len(x)", "session_id": f"s{index}"},
                    )
                    first_calls.append(time.perf_counter() - start)
                    assert not result.is_error, result

            stop = anyio.Event()
            started = time.perf_counter()
            with anyio.fail_after(RUN_LIMIT_S):
                async with (
                    Client(f"http://127.0.0.1:{port}/mcp") as client,
                    anyio.create_task_group() as group,
                ):
                    group.start_soon(sample, stop)
                    async with anyio.create_task_group() as streams:
                        for offset in range(STREAMS):
                            streams.start_soon(stream, client, range(offset, args.sessions, STREAMS))
                    for index in range(0, args.sessions, 10):
                        start = time.perf_counter()
                        result = await client.call_tool(
                            "execute_python", {"code": "len(x)", "session_id": f"s{index}"}
                        )
                        returns.append(time.perf_counter() - start)
                        assert result.structured_content is not None, result
                        assert result.structured_content["result"] == "10000", result.structured_content
                    stop.set()
            elapsed = time.perf_counter() - started
            async with redis.asyncio.Redis(port=redis_port) as client:
                used = (await client.info("memory"))["used_memory"]
    results = {
        "sessions": args.sessions,
        "backend": args.backend,
        "seconds": elapsed,
        "first_call_p50_ms": statistics.median(first_calls) * 1e3,
        "return_call_p50_ms": statistics.median(returns) * 1e3,
        "peak_total_mb": peak["total_kb"] / 1024,
        "peak_server_and_sandboxes_mb": peak["server_kb"] / 1024,
        "peak_redis_rss_mb": peak["redis_kb"] / 1024,
        "redis_used_memory_mb": used / 2**20,
    }
    table = "\n".join(
        [
            f"mcp-sandbox at scale — {datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}: "
            f"{args.sessions} sessions, {args.backend}, MCP_SANDBOX_MAX_LIVE_SANDBOXES={LIVE}, Redis",
            f"wall time                                  {elapsed:8.1f} s",
            f"a session's first call, p50                {results['first_call_p50_ms']:8.1f} ms",
            f"a hibernated session's next call, p50      {results['return_call_p50_ms']:8.1f} ms",
            f"peak memory, server + sandboxes + Redis    {results['peak_total_mb']:8.0f} MB",
            f"  of which server and sandboxes            {results['peak_server_and_sandboxes_mb']:8.0f} MB",
            f"  of which redis-server (resident)         {results['peak_redis_rss_mb']:8.0f} MB",
            f"Redis used_memory at the end               {results['redis_used_memory_mb']:8.0f} MB",
        ]
    )
    save(results, args.json, table)


if __name__ == "__main__":
    anyio.run(main)
