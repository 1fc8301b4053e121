"""Faults that cost neither the session nor the process: waits stopped when asked, asyncio.run,
no stdin, a memory cap, a kill flag, and a crashed worker replaced in its process. A real server
process and a real MCP client, on pyodide (tests/integration/test_checkpoints.py has the kills and
memory errors on subprocess too)."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.helpers import DEFAULT_JIT, call, process_tree, server_params
from tests.integration.test_checkpoints import checkpointed
from tests.security.harness import ServerLog, logged_server

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
GRACE = 1.0  # MCP_SANDBOX_INTERRUPT_GRACE of the server under test (TEST_ENV)
MEMORY_MB = 512
#: How long a stopped call may take past its timeout: the interrupt is notified, never polled, so
#: anything near the grace period means the program was not interrupted but killed.
INTERRUPTED_WITHIN = GRACE
#: A program that catches what stops it and goes on.
SWALLOWS = "import asyncio\nwhile True:\n    try:\n        {wait}\n    except {error}:\n        pass"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("state")


@pytest.fixture(scope="module")
async def server(
    anyio_backend: str, tmp_path_factory: pytest.TempPathFactory, state_dir: Path
) -> AsyncIterator[tuple[Client, ServerLog]]:
    """A pyodide server bridging tests/upstreams/calc_server.py as `calc`."""
    config = tmp_path_factory.mktemp("bridge") / "upstreams.json"
    upstream = {"command": sys.executable, "args": ["-m", "tests.upstreams.calc_server"], "cwd": str(REPO)}
    config.write_text(json.dumps({"mcpServers": {"calc": upstream}}))
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide",
        MCP_SANDBOX_MEMORY_MB=str(MEMORY_MB),
        MCP_SANDBOX_BRIDGE_CONFIG=str(config),
        MCP_SANDBOX_STATE_DIR=str(state_dir),
        MCP_SANDBOX_MAX_SESSIONS="64",
        # A process per sandbox: these faults are told apart by the process they cost
        # (test_cohosting.py has them in a shared one).
        MCP_SANDBOX_SANDBOXES_PER_PROCESS="1",
        **DEFAULT_JIT,  # interrupts must land right with a warm-up round running between calls
        # What the pool did with each sandbox given back is a debug line (ServerLog).
        MCP_SANDBOX_LOG_LEVEL="DEBUG",
    )
    async with logged_server(params) as connected:
        yield connected


@pytest.fixture
def client(server: tuple[Client, ServerLog]) -> Client:
    return server[0]


def sandbox_processes() -> set[int]:
    """The Deno runners under the servers this test process started: one per sandbox (with
    MCP_SANDBOX_SANDBOXES_PER_PROCESS=1)."""
    return {pid for pid, command in process_tree(os.getpid()).items() if b"runner.ts" in command}


async def settled_processes(client: Client) -> set[int]:
    """The sandbox processes once a few calls have gone through the pool: each is lent its ready
    sandbox, so a refill that was still starting is done by then."""
    for _ in range(3):
        await call(client, "1")
    return sandbox_processes()


def cpu_seconds(pids: set[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


async def with_x(client: Client, session: str) -> None:
    assert (await call(client, "x = 41", session_id=session))["success"]


async def still_has_x(client: Client, session: str) -> None:
    after = await call(client, "x", session_id=session)
    assert after["result"] == "41", after
    assert not after["session_restored"] and not after["session_lost"], after


@pytest.mark.parametrize(
    "code",
    [
        "from time import sleep\nsleep(5)",
        "import asyncio\nawait asyncio.gather(asyncio.sleep(5), asyncio.sleep(6))",
        "import asyncio\nasync def main():\n    await asyncio.sleep(5)\nasyncio.run(main())",
        "import queue\nqueue.Queue().get(timeout=5)",
    ],
    # tests/unit/test_guest_waits.py shows each of the guest's waits sleeping in the worker's `wait`.
    ids=["sleep", "gather", "asyncio.run", "queue"],
)
async def test_a_wait_past_its_timeout_is_interrupted_and_keeps_the_session(
    client: Client, code: str
) -> None:
    session = f"wait-{abs(hash(code))}"
    await with_x(client, session)
    began = time.monotonic()
    stopped = await call(client, code, session_id=session, timeout=0.5)
    took = time.monotonic() - began
    assert stopped["error_type"] == "Timeout", (stopped["error"], stopped.get("notes"), stopped["stderr"])
    assert "was interrupted; the session's variables are kept" in stopped["error"], stopped
    assert not stopped["session_restored"] and not stopped["session_lost"], stopped
    assert took < 0.5 + INTERRUPTED_WITHIN, f"stopped after {took:.2f} s: killed, not interrupted"
    await still_has_x(client, session)


SLEEP = "import time\ntime.sleep(4)\n'woke'"
WINDOW = 1.5  # seconds of the sleep measured


async def test_sleeping_uses_no_cpu() -> None:
    # One sandbox, measured alone: no JIT warm-up and no checkpoint in idle time (one could start
    # as a call returns, before its CPU is read), and the pool's next one not counted.
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide",
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_PYODIDE_WARM_UP_ROUNDS="0",
        MCP_SANDBOX_CHECKPOINTS="false",
        MCP_SANDBOX_SANDBOXES_PER_PROCESS="1",
    )
    others = sandbox_processes()
    async with Client(params) as client:
        with anyio.fail_after(60):
            while not (first := sandbox_processes() - others):
                await anyio.sleep(0.05)
            await call(client, "1", session_id="sleeper")  # the session takes the pool's first sandbox
        samples: list[tuple[float, float]] = []  # (wall, CPU) of the sandbox while the call runs
        async with anyio.create_task_group() as tg:

            async def sleep() -> None:
                slept.update(await call(client, SLEEP, session_id="sleeper"))
                tg.cancel_scope.cancel()

            slept: dict[str, Any] = {}
            tg.start_soon(sleep)
            with anyio.fail_after(60):
                while True:
                    samples.append((time.monotonic(), cpu_seconds(first)))
                    await anyio.sleep(0.05)
    assert slept["result"] == "'woke'", slept
    # The call's own work, stretched on a loaded machine, is outside some WINDOW of the sleep:
    # the least CPU any such window took is the sleep's. Spinning would cost the window itself.
    least = min(
        cpu_after - cpu_before
        for wall_before, cpu_before in samples
        for wall_after, cpu_after in samples
        if wall_after - wall_before >= WINDOW
    )
    assert least < 0.1 * WINDOW, f"{WINDOW} s of a sleep used {least:.2f} s of CPU"


async def test_select_with_a_timeout_sleeps_for_it(client: Client) -> None:
    began = time.monotonic()
    waited = await call(client, "import select\nselect.select([], [], [], 0.3)", session_id="select")
    assert waited["result"] == "([], [], [])", waited
    assert time.monotonic() - began >= 0.3


async def test_asyncio_run_returns_mains_value(client: Client) -> None:
    code = (
        "import asyncio\n"
        "async def main():\n"
        "    await asyncio.sleep(0.01)\n"
        "    a, b = await asyncio.gather(asyncio.sleep(0.01, result=1), tools.calc.add_async(a=2, b=3))\n"
        "    return a + b['sum']\n"
        "asyncio.run(main())"
    )
    ran = await call(client, code, session_id="runs")
    assert ran["result"] == "6", ran
    loop = "import asyncio\nasyncio.new_event_loop().run_until_complete(asyncio.sleep(0.01, result='done'))"
    assert (await call(client, loop, session_id="runs"))["result"] == "'done'"


@pytest.mark.parametrize(
    "code", ["input()", "import sys\nsys.stdin.read()", "import sys\nsys.stdin.readline()"]
)
async def test_reading_stdin_fails_at_once_and_says_why(client: Client, code: str) -> None:
    session = f"stdin-{abs(hash(code))}"
    await with_x(client, session)
    began = time.monotonic()
    read = await call(client, code, session_id=session, timeout=10)
    assert read["error_type"] == "EOFError", read
    assert "there is no input in the sandbox" in read["error"], read
    assert time.monotonic() - began < 5, "it waited for input"
    await still_has_x(client, session)


async def test_allocating_past_the_memory_limit_is_a_memory_error(client: Client) -> None:
    await with_x(client, "allocates")
    sandboxes = sandbox_processes()
    code = "blocks = []\nfor _ in range(40):\n    blocks.append(bytearray(100 * 2**20))"
    failed = await call(client, code, session_id="allocates", timeout=60)
    assert failed["error_type"] == "MemoryError", failed
    assert not failed["session_restored"] and not failed["session_lost"], failed
    await still_has_x(client, "allocates")
    assert sandboxes <= sandbox_processes(), "a sandbox process ended"


async def restored_after(
    client: Client, state_dir: Path, session: str, code: str, timeout: float
) -> dict[str, Any]:
    await checkpointed(client, "x = 41", session, state_dir)
    sandboxes = sandbox_processes()
    result = await call(client, code, session_id=session, timeout=timeout)
    assert result["session_restored"] is True and result["restored_from_call"] == 1, json.dumps(result)
    assert (await call(client, "x", session_id=session))["result"] == "41"
    assert sandboxes <= sandbox_processes(), "a sandbox process ended, not only its worker"
    return result


@pytest.mark.parametrize(
    "code",
    [
        SWALLOWS.format(wait="while True:\n            pass", error="KeyboardInterrupt"),
        SWALLOWS.format(wait="import time; time.sleep(10)", error="KeyboardInterrupt"),
        SWALLOWS.format(wait="import asyncio; await asyncio.sleep(10)", error="asyncio.CancelledError"),
    ],
    ids=["computing", "sleeping", "awaiting"],
)
async def test_a_program_swallowing_its_interrupt_is_killed_and_its_session_restored(
    client: Client, state_dir: Path, code: str
) -> None:
    killed = await restored_after(client, state_dir, f"swallows-{abs(hash(code))}", code, timeout=0.5)
    assert killed["error_type"] == "Timeout" and "did not stop when interrupted" in killed["error"], killed


@pytest.mark.parametrize(
    "code",
    [
        "import os\nos._exit(3)",
        "import sys\nsys.setrecursionlimit(10**6)\ndef f(n):\n    return f(n + 1)\nf(0)",
    ],
    ids=["os._exit", "deep-recursion"],
)
async def test_a_crash_replaces_the_worker_not_the_process(
    client: Client, state_dir: Path, code: str
) -> None:
    crashed = await restored_after(client, state_dir, f"crash-{abs(hash(code))}", code, timeout=30)
    assert crashed["error_type"] in {"SandboxCrash", "RecursionError"}, crashed


async def test_a_crash_that_ends_its_worker_without_a_session_closes_its_sandbox(client: Client) -> None:
    # Its worker could be replaced, but what crashed may have left a thread running in the
    # process: a renewed sandbox serves only the caller it crashed for, and this one has gone.
    sandboxes = await settled_processes(client)
    crashed = await call(client, "import js\njs.Deno.exit(3)")
    assert crashed["error_type"] == "SandboxCrash", crashed
    for _ in range(4):
        assert (await call(client, "6 * 7"))["result"] == "42"
    assert not sandboxes <= sandbox_processes(), "the crashed sandbox was kept for other callers"


#: Left in the interpreter by a program that is then ended where it stands: none of it may reach
#: the next caller.
LEAVE_BEHIND = """
import builtins, os, sys, types
builtins.planted = "builtins"
sys.modules["planted"] = types.ModuleType("planted")
with open("/tmp/planted", "w") as file:
    file.write("file")
"""
FIND_PLANTED = """
import builtins, os, sys
[hasattr(builtins, "planted"), "planted" in sys.modules, os.path.exists("/tmp/planted")]
"""


#: Swallows its interrupt until the kill flag ends it.
SWALLOWS_SLEEP = SWALLOWS.format(wait="sleep(5)", error="KeyboardInterrupt").replace(
    "import asyncio", "from time import sleep"
)


@pytest.mark.parametrize(
    ("end", "timeout", "said"),
    [("os._exit(3)", 30, "exit(3)"), (SWALLOWS_SLEEP, 0.5, "so it was killed")],
    ids=["os._exit", "kill-flag"],
)
async def test_a_program_ended_where_it_stands_leaves_its_sandbox_clean_for_the_next_caller(
    server: tuple[Client, ServerLog], end: str, timeout: float, said: str
) -> None:
    client, log = server
    # The worker goes back to its clean point in place: the sandbox serves the next caller without
    # a session, with nothing of the program left.
    await settled_processes(client)
    since = len(log.lines)
    for _ in range(2):
        ended = await call(client, LEAVE_BEHIND + end, timeout=timeout)
        assert said in ended["error"], ended["error"]
        assert (await call(client, FIND_PLANTED))["result"] == "[False, False, False]"
    if end.startswith("os._exit"):
        # Each of the four sandboxes given back was recycled: one whose worker was replaced is
        # closed, "renewed after a crash, for its caller only". (A kill whose crash comes later than
        # KILL_WAIT closes its sandbox too: not asserted.)
        for _ in range(4):
            since, given_back = await log.find(
                r"a used pyodide sandbox \d+ was (recycled|replaced|closed).*", since
            )
            assert given_back[1] == "recycled", f"ending the program cost its sandbox: {given_back[0]}"
            since += 1


#: Leaves a task parked in run_sync on a promise that never settles: its WebAssembly stack stays
#: suspended, and one resumed after a recycle would write itself over the next caller's memory.
PARK_A_STACK = """
import asyncio, js, os
from pyodide.ffi import run_sync
async def park():
    run_sync(js.Promise.new(lambda resolve, reject: None))
asyncio.ensure_future(park())
run_sync(asyncio.sleep(0.05))
"""


@pytest.mark.parametrize("end", ["'parked'", "os._exit(0)"], ids=["ends", "exits"])
async def test_a_program_that_leaves_a_stack_suspended_leaves_its_sandbox_to_nobody(
    client: Client, end: str
) -> None:
    # Neither the pool's recycle nor the one after an exit may put this sandbox back: it is closed.
    sandboxes = await settled_processes(client)
    await call(client, PARK_A_STACK + end)
    for _ in range(4):
        assert (await call(client, "6 * 7"))["result"] == "42"
    assert not sandboxes <= sandbox_processes(), "the sandbox with a suspended stack was kept"


async def test_a_c_loop_that_never_checks_signals_costs_its_process(client: Client, state_dir: Path) -> None:
    # No interrupt and no kill flag reaches it: the process is killed, the last resort.
    await checkpointed(client, "x = 41", "c-loop", state_dir)
    code = "import collections, itertools\ncollections.deque(itertools.count(), maxlen=0)"
    killed = await call(client, code, session_id="c-loop", timeout=0.5)
    assert killed["error_type"] == "Timeout", killed
    assert killed["session_restored"] is True and killed["restored_from_call"] == 1, killed
    assert (await call(client, "x", session_id="c-loop"))["result"] == "41"


#: Left behind by a caller that then crashes its worker: none of it may reach the next caller.
PLANT = """
import builtins, js, os, sys, types
builtins.planted = "builtins"
js.globalThis.planted = "javascript"
sys.modules["planted"] = types.ModuleType("planted")
with open("/tmp/planted", "w") as file:
    file.write("file")
os._exit(3)
"""
FIND = """
import builtins, js, os, sys
[
    hasattr(builtins, "planted"),
    str(getattr(js.globalThis, "planted", None)),
    "planted" in sys.modules,
    os.path.exists("/tmp/planted"),
]
"""


async def test_a_replaced_worker_keeps_nothing_of_the_program_that_crashed(
    client: Client, state_dir: Path
) -> None:
    # The session's checkpoint is restored into the new worker of the same process (restored_after).
    crashed = await restored_after(client, state_dir, "planted", PLANT, timeout=30)
    assert crashed["error_type"] == "SandboxCrash", crashed
    found = await call(client, FIND, session_id="planted")
    assert found["result"] == "[False, 'None', False, False]", found


async def test_an_interrupted_await_leaves_an_earlier_calls_task_running(client: Client) -> None:
    # The interrupt cancels what the interrupted run started, never the session's earlier work.
    # The ticker never sleeps, so it runs Python whenever the loop is free: an interrupt may land
    # in it, in the loop between its steps, or, in a new sandbox, before the run has begun. So
    # several sessions, each in a new sandbox.
    start = (
        "import asyncio\nticks = 0\nasync def tick():\n    global ticks\n    while True:\n"
        "        ticks += 1\n        await asyncio.sleep(0)\nbackground = asyncio.ensure_future(tick())"
    )
    for session in (f"background-{n}" for n in range(6)):
        assert (await call(client, start, session_id=session))["success"]
        stopped = await call(
            client, "import asyncio\nawait asyncio.sleep(5)", session_id=session, timeout=0.3
        )
        assert stopped["error_type"] == "Timeout", (stopped["error"], stopped.get("notes"))
        assert not stopped["session_lost"], stopped["error"]
        still = await call(client, "background.done(), ticks > 0", session_id=session)
        assert still["result"] == "(False, True)", still
        await call(client, "background.cancel()", session_id=session)


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit"])
async def test_a_background_task_that_raises_what_stops_a_program_costs_neither_worker_nor_session(
    client: Client, raised: str
) -> None:
    # The event loop hands what escapes a task's step to JavaScript, which would end the worker.
    session = f"raises-{raised}"
    start = (
        "import asyncio\nx = 41\ngo = asyncio.Event()\nasync def stop_later():\n    await go.wait()\n"
        f"    raise {raised}\nlater = asyncio.ensure_future(stop_later())"
    )
    assert (await call(client, start, session_id=session))["success"]
    # As on CPython, what escapes the task stops the program that awaits: here, as its interrupt.
    # The task raises only once this call awaits: never between the two calls.
    waited = await call(client, "go.set()\nawait asyncio.sleep(5)", session_id=session)
    assert waited["error_type"] == "KeyboardInterrupt", (waited["error"], waited.get("notes"))
    assert not waited.get("session_restored") and not waited.get("session_lost"), waited
    after = await call(client, "x + 1", session_id=session)
    assert after["result"] == "42", after


async def test_an_interrupt_that_lands_in_an_earlier_calls_task_stops_the_run_and_the_task_runs_on(
    client: Client,
) -> None:
    # An interrupt lands in whatever Python runs first; here, the earlier task calls the SIGINT
    # handler itself, as Pyodide does when the interrupt buffer is read inside that task.
    session = "interrupt-lands-elsewhere"
    start = (
        "import asyncio, signal\nsurvived = False\ngo = asyncio.Event()\nasync def poke():\n"
        "    global survived\n    await go.wait()\n    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)\n"
        "    survived = True\npoked = asyncio.ensure_future(poke())"
    )
    assert (await call(client, start, session_id=session))["success"]
    # The interrupt lands only once this call awaits: never between the two calls.
    stopped = await call(client, "go.set()\nawait asyncio.sleep(5)", session_id=session)
    assert stopped["error_type"] == "KeyboardInterrupt", (stopped["error"], stopped.get("notes"))
    after = await call(client, "survived", session_id=session)
    assert after["result"] == "True", after
