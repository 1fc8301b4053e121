"""Soak with restarts: sessions under load on two instances sharing a state folder (or a real
redis-server), while the instance serving them is killed (SIGKILL) or stopped (SIGTERM) and
started again, and the load moves to the other one. Every session's counter survives, or its
result says exactly why not: `session_restored` with the call its state is from. Bounded in
rounds and in time; run on its own: `pytest -m soak`."""

from __future__ import annotations

import ast
import random
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.helpers import free_port, redis_server, server_env, stop_process, wait_for_port

pytestmark = [pytest.mark.anyio, pytest.mark.soak]

SESSIONS = 6
WORKERS = 4
CALLS_PER_ROUND = 24
#: Each fault below comes once, and the first twice.
ROUNDS = 4
TIME_LIMIT = 75.0
LEASE_S = 2
#: Each round ends with one of these done to the instance that served it.
FAULTS = ["sigkill", "sigterm", "none"]


@dataclass
class Instance:
    port: int
    process: anyio.abc.Process


async def start(env: dict[str, str]) -> Instance:
    port = free_port()
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    process = await anyio.open_process(command, env=server_env(MCP_SANDBOX_POOL_SIZE="2", **env))
    await wait_for_port(port, process)
    return Instance(port, process)


async def stop(instance: Instance, how: str) -> None:
    await stop_process(instance.process, signal.SIGKILL if how == "sigkill" else signal.SIGTERM, grace=20)


@dataclass
class Tally:
    #: Each session's log as the client last saw it: the numbers of the calls that appended to it.
    logs: dict[str, list[int]] = field(default_factory=dict)
    wrong: list[str] = field(default_factory=list)
    said: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(["calls", "restored", "lost", "faults"], 0)
    )
    next_call: int = 0


async def calls(client: Client, queue: list[str], tally: Tally) -> None:
    """Each session in `queue` appends a new number to its log, WORKERS at a time, one call at a
    time per session (as an agent makes them). A log that comes back without some of the calls
    the client saw must say so (`session_restored`, or `session_lost` when it is gone)."""
    locks = {session: anyio.Lock() for session in set(queue)}

    async def one_call(session: str) -> None:
        async with locks[session]:
            tally.next_call += 1
            number, before = tally.next_call, tally.logs.get(session)
            code = f"log.append({number})\nlog" if before is not None else f"log = [{number}]\nlog"
            with anyio.fail_after(60):
                response = await client.call_tool("execute_python", {"code": code, "session_id": session})
            result: dict[str, Any] | None = response.structured_content
            tally.said["calls"] += 1
            if response.is_error or result is None:
                tally.wrong.append(f"{session}: no result: {response.content}")
                return
            if result.get("error_type") == "NameError":
                # Said plainly: it had no checkpoint yet (lost), or its checkpoint is from before
                # the log began (restored: a call that failed on a lost session counts as a call).
                if result.get("session_lost") or result.get("session_restored"):
                    tally.said["lost" if result.get("session_lost") else "restored"] += 1
                else:
                    tally.wrong.append(f"{session}: its variables are gone, and nothing says so: {result}")
                tally.logs.pop(session, None)
                return
            log = ast.literal_eval(result.get("result") or "None")
            tally.said["restored"] += bool(result.get("session_restored"))
            seen = before or []
            if not isinstance(log, list) or not log or log[-1] != number or log[:-1] != seen[: len(log) - 1]:
                tally.wrong.append(f"{session}: log {log}, after {seen}: {result}")
            elif len(log) - 1 < len(seen) and not result.get("session_restored"):
                tally.wrong.append(
                    f"{session}: calls {seen[len(log) - 1 :]} are gone, and nothing says so: {result}"
                )
            tally.logs[session] = log if isinstance(log, list) else []

    async def worker() -> None:
        while queue:
            await one_call(queue.pop())

    async with anyio.create_task_group() as group:
        for _ in range(WORKERS):
            group.start_soon(worker)


#: Each backend once and each store once: the store does not depend on the backend (the oracle,
#: tests/soak/test_oracle.py, crosses them all).
RUNS = [("pyodide", "folder"), ("subprocess", "redis")]


@pytest.mark.parametrize(("backend", "store"), RUNS, ids=[f"{backend}-{store}" for backend, store in RUNS])
async def test_sessions_survive_restarts_and_moves(backend: str, store: str, tmp_path: Path) -> None:
    if store == "folder":
        await soak(backend, {"MCP_SANDBOX_STATE_DIR": str(tmp_path / "state")})
    else:
        async with redis_server(tmp_path / "redis") as url:
            await soak(backend, {"MCP_SANDBOX_STATE_URL": url})


async def soak(backend: str, state: dict[str, str]) -> None:
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        **state,
        "MCP_SANDBOX_STATELESS_HTTP": "true",
        "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S),
        "MCP_SANDBOX_LOG_LEVEL": "ERROR",
    }
    rng = random.Random(17)
    tally = Tally()
    instances = [await start(env), await start(env)]
    serving = 0
    deadline = time.monotonic() + TIME_LIMIT
    try:
        for round_number in range(ROUNDS):
            if time.monotonic() > deadline:
                break
            url = f"http://127.0.0.1:{instances[serving].port}/mcp"
            queue = [f"s{rng.randrange(SESSIONS)}" for _ in range(CALLS_PER_ROUND)]
            async with Client(url) as client:
                await calls(client, queue, tally)
            fault = FAULTS[round_number % len(FAULTS)]
            if fault != "none":
                tally.said["faults"] += 1
                await anyio.sleep(rng.uniform(0, 3))  # before, during or after the checkpoints
                await stop(instances[serving], fault)
                instances[serving] = await start(env)
                # The load moves to the other instance, which started after it last served (a
                # live instance keeps its sessions' leases: calls sent elsewhere would wait).
                serving = 1 - serving
    finally:
        for instance in instances:
            await stop(instance, "sigterm")
    print(f"{backend} on {', '.join(state)}: {tally.said}")
    assert not tally.wrong, tally.wrong[:5]
    assert tally.said["calls"] >= ROUNDS * CALLS_PER_ROUND // 2, tally.said
    assert tally.said["restored"] > 0, "no session was ever restored: the faults tested nothing"
