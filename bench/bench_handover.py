"""What a routing change costs: a session's call that reaches the instance not holding it.

Run from the repository root:  .venv/bin/python bench/bench_handover.py [--moves N] [--state-url URL]

Two real server processes (`serve --transport http`, the subprocess backend) share a store: a
temporary folder, or the Redis at --state-url (e.g. a redis-server you started with
`redis-server --port 6390 --save ''`). One session's calls go to the two instances in turn, so
every call is a move: the instance asks the other for the session, which checkpoints it and lets
go, and the asker restores it. Timed: each moved call, and the call after it on the same instance.
About 30 seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from common import free_port, wait_for_port
from mcp import Client

SERVER_START_LIMIT_S = 60.0
CALL_LIMIT_S = 60.0


@asynccontextmanager
async def server(env: dict[str, str]) -> AsyncIterator[int]:
    port = free_port()
    process = await anyio.open_process(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)],
        env={**os.environ, "MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_LOG_LEVEL": "WARNING", **env},
    )
    try:
        await wait_for_port(port, SERVER_START_LIMIT_S)
        yield port
    finally:
        process.terminate()
        with anyio.fail_after(30):
            await process.wait()
        await process.aclose()


async def timed(client: Client, code: str) -> tuple[float, dict[str, object]]:
    start = time.perf_counter()
    with anyio.fail_after(CALL_LIMIT_S):
        result = await client.call_tool("execute_python", {"code": code, "session_id": "moving"})
    elapsed = time.perf_counter() - start
    assert not result.is_error and result.structured_content is not None, result
    return elapsed, result.structured_content


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--state-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        env = (
            {"MCP_SANDBOX_STATE_URL": args.state_url}
            if args.state_url
            else {"MCP_SANDBOX_STATE_DIR": scratch}
        )
        async with AsyncExitStack() as stack:
            ports = [await stack.enter_async_context(server(env)) for _ in range(2)]
            clients = [
                await stack.enter_async_context(Client(f"http://127.0.0.1:{port}/mcp")) for port in ports
            ]
            await timed(clients[0], "x = 0")
            moved, stayed = [], []
            for index in range(args.moves):
                client = clients[(index + 1) % 2]
                elapsed, result = await timed(client, "x += 1; x")
                assert result["result"] == str(index + 1) and result["session_restored"], result
                moved.append(elapsed * 1e3)
                stayed.append((await timed(client, "x"))[0] * 1e3)
    store = "Redis" if args.state_url else "a folder"
    print(f"{args.moves} moves of one session between two instances on {store} (subprocess backend)")
    print(f"moved call: p50 {statistics.median(moved):.0f} ms, min {min(moved):.0f}, max {max(moved):.0f}")
    print(f"the next call on that instance: p50 {statistics.median(stayed):.1f} ms")
    print(json.dumps({"moved_ms": moved, "stayed_ms": stayed}))


if __name__ == "__main__":
    anyio.run(main)
