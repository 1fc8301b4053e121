"""The oracle: sessions driven through SIGKILL and SIGTERM restarts, sandbox kills, hibernation
and moves between instances at chosen moments, every result held against a model of what each
session holds, on a shared folder and on a real redis-server.

A session may roll back to a checkpoint or be lost, as long as the result says so. So every
result must be one of:
- unchanged: the session's state is the one the client last saw (or, after a call that got no
  answer, that state with or without the unanswered call);
- `session_restored`: its state is one it really had, the one after call `restored_from_call`;
- `session_lost`: it starts fresh.
Anything else fails the test, naming the seed, the session and its log.

Each program appends its call's number to `log` and returns it, so a result shows the whole state.
Three topologies: one instance that restarts; two that take turns (the load moves to the other
after each restart); two that get each call at random, so a session's calls keep moving between
live instances and each move is a handover (the holder checkpoints it and lets go, the other
restores it): there, no call may be refused as running on another instance.

Bounded in rounds and time, seeded so a failure replays: `pytest -m oracle -k "seed-7-"`. Runs on
its own (`pytest -m oracle`); CI's soak step runs QUICK.
"""

from __future__ import annotations

import ast
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.helpers import (
    RestartableRedis,
    free_port,
    process_tree,
    restartable_redis,
    server_env,
    stop_process,
    wait_for_port,
)

pytestmark = [pytest.mark.anyio, pytest.mark.oracle]

SESSIONS = 4
#: Fewer live sandboxes than sessions, so calls hibernate sessions and bring them back.
MAX_LIVE = 2
CALLS_PER_ROUND = 5
ROUNDS = 5
TIME_LIMIT = 100.0
LEASE_S = 2
#: What ends a round, done to the instance that served it: the server killed or stopped (and
#: started again on the same folder), or every sandbox process under it killed; on Redis, also
#: Redis restarted without its data (persistence off) under both instances.
FAULTS = ["sigkill", "sigterm", "sandboxes"]
REDIS_FAULTS = [*FAULTS, "redis"]
#: When, after the round's last call: at once, at fixed delays (a checkpoint lands about 2 s after
#: a call), while that checkpoint is written, or while a call that hibernates another runs.
MOMENTS: list[float | str] = [0.0, 0.3, 1.0, 2.2, 3.5, "checkpoint", "hibernation"]
#: How the calls reach the instances, by seed % 3: one that restarts; two taking turns, the load
#: moving after each restart; two getting each call at random.
TOPOLOGIES = ["one", "turns", "random"]
#: Fixed seeds: `pytest -m oracle` runs them all on both backends, odd ones on a shared folder and
#: even ones on Redis (so every topology meets both stores).
SEEDS = list(range(1, 21))
#: What CI runs in its soak step: each backend and each store, one instance and two at random.
#: (Two taking turns is the restarts soak's own load, tests/soak/test_soak_restarts.py.)
QUICK = [("pyodide", 3), ("subprocess", 14)]
#: What a call whose sandbox died answers.
SANDBOX_DIED = {"SandboxCrash", "MemoryLimit", "Timeout"}


@dataclass
class SessionModel:
    """What one session may hold now, and every state it ever held, by the server's call number."""

    name: str
    #: (call number, log) pairs the session may hold now: one, or two after a call with no answer.
    now: list[tuple[int, list[int]]] = field(default_factory=lambda: [(0, [])])
    #: Every log it held (or may have held) after each call number.
    had: dict[int, list[list[int]]] = field(default_factory=lambda: {0: [[]]})
    #: The client's view of its life, for the failure message.
    events: list[str] = field(default_factory=list)
    #: The instance that answered its latest call (a moved call is one another live instance answers).
    served_by: Instance | None = None

    def remember(self, call: int, log: list[int]) -> None:
        self.had.setdefault(call, [])
        if log not in self.had[call]:
            self.had[call].append(log)

    def unanswered(self, number: int) -> None:
        """A call appending `number` got no answer: it may or may not have run."""
        maybe = [(call + 1, [*log, number]) for call, log in self.now]
        for call, log in maybe:
            self.remember(call, log)
        self.now = self.now + maybe
        self.events.append(f"call {number}: no answer")

    def check(self, number: int, result: dict[str, Any]) -> str | None:
        """Hold an answered call's result against the model: what is wrong with it, or None."""
        log = ast.literal_eval(result.get("result") or "None")
        restored = result.get("restored_from_call")
        flags = f"restored={result.get('session_restored')} from={restored} "
        flags += f"lost={result.get('session_lost')} notes={result.get('notes')}"
        self.events.append(f"call {number}: {log} {flags} {result.get('error_type') or ''}")
        if not result.get("success") and result.get("error_type") in SANDBOX_DIED:
            # Its sandbox died during the call (killed by a fault): what it holds now must be said.
            if result.get("session_lost"):
                self.now = [(0, [])]
            elif result.get("session_restored") and isinstance(restored, int) and restored in self.had:
                self.now = [(restored, log) for log in self.had[restored]]
            else:
                return f"call {number}: its sandbox died, and nothing true says what the session holds now"
            return None
        if not result.get("success") or not isinstance(log, list) or not log or log[-1] != number:
            return f"call {number} did not run as written: {result}"
        before = log[:-1]
        if result.get("session_lost"):
            if before:
                return f"session_lost, yet it holds {before}"
            call = 1
        elif result.get("session_restored"):
            if not isinstance(restored, int) or before not in self.had.get(restored, []):
                return f"restored to {before} 'after call {restored}', a state it never had then"
            call = restored + 1
        else:
            matching = [call for call, log in self.now if log == before]
            if not matching:
                possible = [log for _, log in self.now]
                return f"its state changed without a word: it held {before}, the client saw {possible}"
            call = matching[0] + 1
        self.now = [(call, log)]
        self.remember(call, log)
        return None


def topology(seed: int) -> str:
    return TOPOLOGIES[seed % 3]


def store(seed: int) -> str:
    return "folder" if seed % 2 else "redis"


def run_id(backend: str, seed: int) -> str:
    """A run's test id, naming what the seed chooses."""
    return f"{backend}-seed-{seed}-{topology(seed)}-{store(seed)}"


@dataclass(eq=False)  # one started process: a restart is another Instance
class Instance:
    port: int
    process: anyio.abc.Process


@dataclass
class Run:
    backend: str
    seed: int
    #: Where the instances keep sessions: MCP_SANDBOX_STATE_DIR or MCP_SANDBOX_STATE_URL.
    state: dict[str, str]
    logs: Path
    sessions: dict[str, SessionModel]
    wrong: list[str] = field(default_factory=list)
    said: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ["calls", "unanswered", "restored", "lost", "faults", "moved", "refused"], 0
        )
    )
    #: Seconds each answered call took (its connection included), moved ones apart.
    moved_s: list[float] = field(default_factory=list)
    stayed_s: list[float] = field(default_factory=list)
    #: The instances now serving (a restarted one is a new Instance).
    serving: list[Instance] = field(default_factory=list)
    #: The redis-server the instances share, when the store is Redis.
    redis: RestartableRedis | None = None
    number: int = 0
    started: int = 0

    def env(self) -> dict[str, str]:
        return {
            "MCP_SANDBOX_BACKEND": self.backend,
            **self.state,
            "MCP_SANDBOX_STATELESS_HTTP": "true",
            "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S),
            "MCP_SANDBOX_MAX_LIVE_SANDBOXES": str(MAX_LIVE),
            "MCP_SANDBOX_POOL_SIZE": "1",
            "MCP_SANDBOX_LOG_LEVEL": "INFO",
        }

    async def start(self) -> Instance:
        self.started += 1
        port = free_port()
        log = open(self.logs / f"server-{self.started}.log", "wb")  # noqa: ASYNC230 - an instant, local open
        command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
        process = await anyio.open_process(
            command, env=server_env(**self.env()), stdout=subprocess.DEVNULL, stderr=log
        )
        log.close()
        await wait_for_port(port, process)
        return Instance(port, process)

    async def call(self, instance: Instance, name: str) -> None:
        """One call in session `name` to `instance`, on a connection of its own (a server killed
        during a call breaks the connection it came on)."""
        session = self.sessions[name]
        self.number += 1
        number = self.number
        code = f"log = globals().get('log', [])\nlog.append({number})\nlog"
        self.said["calls"] += 1
        # Moved: the instance that last served the session is still up, and this call goes elsewhere.
        moved = session.served_by in self.serving and session.served_by is not instance
        started = time.monotonic()
        try:
            with anyio.fail_after(60):
                async with Client(f"http://127.0.0.1:{instance.port}/mcp") as client:
                    response = await client.call_tool("execute_python", {"code": code, "session_id": name})
        except TimeoutError:
            self.wrong.append(f"seed {self.seed}, {name}: call {number} got no answer in 60 s")
            return
        except Exception as error:  # noqa: BLE001 - a server killed mid-call answers nothing
            self.said["unanswered"] += 1
            session.unanswered(number)
            session.events[-1] += f" ({type(error).__name__})"
            return
        took = time.monotonic() - started
        result = response.structured_content
        if response.is_error or result is None:
            text = " ".join(getattr(part, "text", "") for part in response.content)
            self.said["refused"] += "another instance" in text
            session.events.append(f"call {number} on :{instance.port}: no result ({took:.1f} s): {text}")
            self.wrong.append(
                f"seed {self.seed}, {name}: call {number} has no result: {text}\n  its log: {session.events}"
            )
            return
        session.served_by = instance
        self.said["moved"] += moved
        (self.moved_s if moved else self.stayed_s).append(took)
        self.said["restored"] += bool(result.get("session_restored"))
        self.said["lost"] += bool(result.get("session_lost"))
        if (problem := session.check(number, result)) is not None:
            self.wrong.append(f"seed {self.seed}, {name}: {problem}\n  its log: {session.events}")


def kill_sandboxes(server: int) -> int:
    """SIGKILL every sandbox process under the server (as the OOM killer might): how many."""
    killed = 0
    for pid in process_tree(server):
        if pid != server:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
    return killed


async def drive(run: Run, how: str) -> None:
    rng = random.Random(run.seed)
    names = list(run.sessions)
    serving = run.serving
    serving.extend([await run.start() for _ in range(1 if how == "one" else 2)])
    at = 0
    deadline = time.monotonic() + TIME_LIMIT
    try:
        for _ in range(ROUNDS):
            if time.monotonic() > deadline:
                break
            fault, moment = rng.choice(REDIS_FAULTS if run.redis else FAULTS), rng.choice(MOMENTS)
            for _ in range(CALLS_PER_ROUND):
                # At random, each call may reach the other instance, which asks the holder for the session.
                instance = rng.choice(serving) if how == "random" else serving[at]
                await run.call(instance, rng.choice(names))
            if how == "random":
                at = rng.randrange(len(serving))
            if moment == "hibernation":
                # The fault lands during a call (which hibernates another session to make room
                # when its own is not live).
                async with anyio.create_task_group() as group:
                    group.start_soon(run.call, serving[at], names[rng.randrange(len(names))])
                    await anyio.sleep(rng.uniform(0.0, 0.08))
                    await hit(run, at, fault)
            else:
                delay = rng.uniform(2.0, 2.3) if moment == "checkpoint" else float(moment)
                await anyio.sleep(delay)
                await hit(run, at, fault)
            if fault != "sandboxes" and how == "turns":
                # The load moves to the other instance, which started after it last served.
                at = 1 - at
    finally:
        for instance in serving:
            await stop_process(instance.process, grace=20)


async def hit(run: Run, at: int, fault: str) -> None:
    run.said["faults"] += 1
    if fault == "redis":
        assert run.redis is not None
        await run.redis.stop()
        await run.redis.start()
        return
    instance = run.serving[at]
    if fault == "sandboxes":
        kill_sandboxes(instance.process.pid)
        return
    how = signal.SIGKILL if fault == "sigkill" else signal.SIGTERM
    await stop_process(instance.process, how, grace=20)
    run.serving[at] = await run.start()


@asynccontextmanager
async def state_store(
    kind: str, tmp_path: Path
) -> AsyncIterator[tuple[dict[str, str], RestartableRedis | None]]:
    """The instances' environment naming the store (a folder, or a real redis-server of the
    test's own), and that redis-server."""
    if kind == "folder":
        yield {"MCP_SANDBOX_STATE_DIR": str(tmp_path / "state")}, None
        return
    async with restartable_redis(tmp_path / "redis") as server:
        yield {"MCP_SANDBOX_STATE_URL": server.url}, server


def seconds(took: list[float]) -> str:
    return f"median {statistics.median(took):.3f} s, max {max(took):.3f} s" if took else "none"


async def oracle(backend: str, seed: int, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    names = [f"s{i}" for i in range(SESSIONS)]
    what, started = run_id(backend, seed), time.monotonic()
    async with state_store(store(seed), tmp_path) as (state, redis):
        run = Run(backend, seed, state, logs, {name: SessionModel(name) for name in names}, redis=redis)
        await drive(run, topology(seed))
    print(
        f"{what}: {run.said} in {time.monotonic() - started:.0f} s; moved calls {seconds(run.moved_s)}, "
        f"others {seconds(run.stayed_s)}"
    )
    assert not run.said["refused"], (
        f"{what}: {run.said['refused']} calls refused as held elsewhere: {run.wrong[:3]}"
    )
    assert not run.wrong, f"{what}: {run.wrong[:3]}\n(server logs: {logs})"
    assert run.said["calls"] >= ROUNDS * CALLS_PER_ROUND // 2, run.said
    assert run.said["restored"] + run.said["lost"] > 0, (
        "no fault was ever reported: the faults tested nothing"
    )
    if topology(seed) == "random":
        assert run.said["moved"] >= CALLS_PER_ROUND, (
            f"{what}: too few calls moved to test handover: {run.said}"
        )


ALL = [(backend, seed) for backend in ("pyodide", "subprocess") for seed in SEEDS]


@pytest.mark.parametrize(("backend", "seed"), ALL, ids=[run_id(*run) for run in ALL])
async def test_the_oracle(backend: str, seed: int, tmp_path: Path) -> None:
    await oracle(backend, seed, tmp_path)


@pytest.mark.soak
@pytest.mark.parametrize(("backend", "seed"), QUICK, ids=[run_id(*run) for run in QUICK])
async def test_the_oracle_quickly(backend: str, seed: int, tmp_path: Path) -> None:
    await oracle(backend, seed, tmp_path)
