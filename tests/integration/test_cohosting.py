"""Several Pyodide sandboxes in one Deno process, through a real MCP client against the real server:
each keeps its own state, a crash, a kill or a JavaScript loop in one leaves the others answering,
a process-wide death brings every session back from its checkpoint saying so, and a process that
may still run code it could not stop takes no new sandbox, moves its idle sessions out and ends."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client

from tests.helpers import as_caller, call, http_server, process_tree, state_file, still_running

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
SWALLOWS_INTERRUPTS = """
while True:
    try:
        while True:
            pass
    except KeyboardInterrupt:
        pass
"""


def runners(server: int) -> list[int]:
    """The Deno runner processes under the server process `server`."""
    return [pid for pid, command in process_tree(server).items() if b"runner.ts" in command]


def checkpointing_env(state: Path) -> dict[str, str]:
    """Four sandboxes to a process, none started ahead, checkpoints in `state`."""
    return {
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "4",
        "MCP_SANDBOX_POOL_SIZE": "0",
        "MCP_SANDBOX_STATE_DIR": str(state),
    }


async def checkpointed(client: Client, state: Path, names: list[str]) -> None:
    """Sessions `names`, each with `x` = 40 + its place in the list, once each has a checkpoint."""
    for i, name in enumerate(names):
        await call(client, f"x = {i} + 40", session_id=name)
    with anyio.fail_after(30):
        while not all(state_file(state, name).exists() for name in names):
            await anyio.sleep(0.1)


async def test_sessions_of_one_principal_share_a_process_each_with_its_own_state() -> None:
    env = {"MCP_SANDBOX_SANDBOXES_PER_PROCESS": "4", "MCP_SANDBOX_POOL_SIZE": "1"}
    async with http_server(**env) as (port, process), Client(f"http://127.0.0.1:{port}/mcp") as client:
        for i in range(4):
            assert (await call(client, f"x = {i} * 11", session_id=f"s{i}"))["success"]
        for i in range(4):
            got = await call(client, "x, 's0' in globals()", session_id=f"s{i}")
            assert got["result"] == f"({i * 11}, False)", got
        # Four sessions and the pool's one: five sandboxes, four to a process (the refill may be starting).
        with anyio.fail_after(30):
            while len(runners(process.pid)) < 2:
                await anyio.sleep(0.05)
        assert len(runners(process.pid)) == 2, process_tree(process.pid)


async def test_a_crash_a_kill_and_a_javascript_loop_leave_the_others_answering() -> None:
    # No checkpoints: what each stop costs its own session is plain (its variables).
    env = {
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "4",
        "MCP_SANDBOX_POOL_SIZE": "0",
        "MCP_SANDBOX_CHECKPOINTS": "false",
    }
    async with http_server(**env) as (port, process), Client(f"http://127.0.0.1:{port}/mcp") as client:
        names = ["crash", "kill", "loop", "calm"]
        for i, name in enumerate(names):
            await call(client, f"x = {i}", session_id=name)
        assert len(runners(process.pid)) == 1, "four sandboxes in one process"
        (host,) = runners(process.pid)

        crashed = await call(client, "import os\nos._exit(3)", session_id="crash")
        assert crashed["session_lost"] is True and crashed["status"] == "crash", crashed
        killed = await call(client, SWALLOWS_INTERRUPTS, session_id="kill", timeout=1)
        assert killed["status"] == "timeout" and killed["session_lost"] is True, killed
        looped = await call(client, "import js\njs.eval('while (true) {}')", session_id="loop", timeout=1)
        assert looped["status"] == "timeout" and looped["session_lost"] is True, looped

        calm = await call(client, "x", session_id="calm")
        assert calm["result"] == "3" and not calm["session_lost"] and not calm["session_restored"], calm
        for name in ("crash", "kill"):  # renewed in place, clean, in the same process
            again = await call(client, "'x' in globals()", session_id=name)
            assert again["result"] == "False" and again["session_lost"] is False, again
        assert host in runners(process.pid)

        # The loop may run on in `host` (deno#35657), which takes no new sandbox (the loop's
        # session got its next one elsewhere): a new session starts in another process, and `host`
        # ends once its sessions are done, while the new one goes on.
        assert (await call(client, "y = 1\ny", session_id="new"))["result"] == "1"
        for name in ("crash", "kill", "loop", "calm"):
            await client.call_tool("reset_session", {"session_id": name})
        with anyio.fail_after(30):
            while host in runners(process.pid):
                await anyio.sleep(0.1)
        assert (await call(client, "y", session_id="new"))["result"] == "1"


async def test_a_process_that_may_run_on_moves_its_idle_sessions_out_and_ends(tmp_path: Path) -> None:
    """A JavaScript loop nothing stops (deno#35657) keeps a core busy until its process ends: the
    process's idle sessions are hibernated, unasked, so it ends without waiting for them, and each
    comes back whole at its next call, in another process."""
    state = tmp_path / "state"
    env = checkpointing_env(state)
    async with http_server(**env) as (port, process), Client(f"http://127.0.0.1:{port}/mcp") as client:
        names = ["loop", "a", "b"]
        await checkpointed(client, state, names)
        (host,) = runners(process.pid)
        looped = await call(client, "import js\njs.eval('while (true) {}')", session_id="loop", timeout=5)
        # Its sandbox was given up, and the session came back from its checkpoint elsewhere.
        assert looped["status"] == "timeout" and looped["session_restored"] is True, looped
        with anyio.fail_after(60):
            while host in runners(process.pid):
                await anyio.sleep(0.1)
        for i, name in enumerate(names[1:], start=1):
            got = await call(client, "x", session_id=name)
            assert got["result"] == str(i + 40), got
            assert not got["session_lost"] and not got["session_restored"], "hibernated and back whole"
        assert host not in runners(process.pid)


async def test_a_process_that_dies_brings_each_of_its_sessions_back_saying_so(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = checkpointing_env(state)
    async with http_server(**env) as (port, process), Client(f"http://127.0.0.1:{port}/mcp") as client:
        names = [f"s{i}" for i in range(3)]
        await checkpointed(client, state, names)
        (host,) = runners(process.pid)
        # A process-wide abort (a V8 heap out of memory) ends every sandbox in it at once.
        os.kill(host, signal.SIGKILL)
        with anyio.fail_after(30):
            while still_running({host: b""}):
                await anyio.sleep(0.05)
        for i, name in enumerate(names):
            said = await call(client, "x + 1", session_id=name)
            if not said["success"]:  # the death was seen only as the call was sent: said, then run
                assert said["status"] == "crash", said
                ran = await call(client, "x + 1", session_id=name)
                said = {**said, "result": ran["result"]}
            assert said["session_restored"] is True, said
            assert said["result"] == str(i + 41), said


async def test_two_principals_never_share_a_process(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB}), encoding="utf-8")
    tokens.chmod(0o600)
    env = {
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "4",
        "MCP_SANDBOX_POOL_SIZE": "1",
        "MCP_SANDBOX_AUTH_TOKENS_FILE": str(tokens),
    }
    async with (
        http_server(**env) as (port, process),
        as_caller(port, ALICE) as alice,
        as_caller(port, BOB) as bob,
    ):
        sessions = {("alice", f"a{i}"): alice for i in range(3)} | {("bob", f"b{i}"): bob for i in range(3)}
        for (_, name), client in sessions.items():  # alternating would fit them into two processes
            await call(client, "x = 1", session_id=name)
        # Each sandbox names the Deno process it runs in; each of those is one of the server's.
        held: dict[int, set[str]] = {}
        for (principal, name), client in sessions.items():
            said = await call(client, "import js\nint(js.Deno.pid)", session_id=name)
            assert said["success"] and not said["session_lost"], said
            held.setdefault(int(said["result"]), set()).add(principal)
        assert set(held) <= set(runners(process.pid)), (held, process_tree(process.pid))
        assert all(len(principals) == 1 for principals in held.values()), f"a process held both: {held}"
        assert len(held) < len(sessions), f"no process hosted two sandboxes: {held}"


#: Prints which sandbox runs it (its Deno process and the worker's time origin).
WHICH = "import js\nprint(js.Deno.pid, js.performance.timeOrigin)\n"


async def ready_sandboxes(port: int) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return next(
        int(float(line.split()[1]))
        for line in text.splitlines()
        if line.startswith("mcp_sandbox_ready_sandboxes ")
    )


async def test_a_recycled_sandbox_goes_back_only_to_the_principal_that_used_it(tmp_path: Path) -> None:
    """Alice leaves state where a recycle does not look (an object behind one of Deno's lazy
    getters, docs/clean-sandbox.md); her sandbox, recycled and first in line, is not Bob's next
    call's: his runs elsewhere and finds nothing."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"alice": ALICE, "bob": BOB}), encoding="utf-8")
    tokens.chmod(0o600)
    env = {"MCP_SANDBOX_POOL_SIZE": "2", "MCP_SANDBOX_AUTH_TOKENS_FILE": str(tokens)}
    async with (
        http_server(**env) as (port, _),
        as_caller(port, ALICE) as alice,
        as_caller(port, BOB) as bob,
    ):
        planted = await call(alice, WHICH + "js.eval(\"navigator.rtLeak = 'ALICE'\")")
        assert planted["success"], planted
        with anyio.fail_after(30):  # her sandbox, recycled, back in the pool first in line
            while await ready_sandboxes(port) < 2:
                await anyio.sleep(0.02)
        probe = await call(bob, WHICH + "str(js.eval('String(navigator.rtLeak)'))")
        assert probe["success"], probe
        assert probe["stdout"] != planted["stdout"], "Bob's call ran in Alice's used sandbox"
        assert probe["result"] == "'undefined'", probe
