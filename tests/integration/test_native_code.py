"""Native code on every path (pyodide): a session that loaded a real Pyodide C extension is
checkpointed, restored after a kill or a server restart, hibernated, and recycled like any other.
Real MCP client, real server process, real Deno runner, a real side module from PyPI (tests/native.py)."""

from __future__ import annotations

import json
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_sandbox.backends.base import ExecutorHooks
from mcp_sandbox.backends.pyodide import PyodideBackend
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings
from tests.helpers import call, http_server, runner_deno, state_file
from tests.integration.test_checkpoints import CRASH
from tests.native import MODULE, packages_folder_with_the_extension

pytestmark = pytest.mark.anyio

REPO = Path(__file__).parents[2]

LOAD = f"import {MODULE} as d\nx = d.add(40, 1)\nx"
CHECK = "d.add(x, 0) == 41, d.hello()"
HELLO = "'Hello from a Pyodide C extension!'"


def env(tmp: Path, **extra: str) -> dict[str, str]:
    return {
        "MCP_SANDBOX_BACKEND": "pyodide",
        "MCP_SANDBOX_PACKAGES_DIR": str(packages_folder_with_the_extension(tmp / "packages")),
        "MCP_SANDBOX_STATE_DIR": str(tmp / "state"),
        "MCP_SANDBOX_PRELOAD_PACKAGES": "",
        **extra,
    }


@pytest.fixture(scope="module")
async def server(
    anyio_backend: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Client, Path]]:
    """A server whose sandboxes load the extension after their clean point, two live at most."""
    tmp = tmp_path_factory.mktemp("native")
    async with (
        http_server(**env(tmp, MCP_SANDBOX_MAX_LIVE_SANDBOXES="2")) as (port, _),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        yield client, tmp / "state"


def never_refused(*results: dict[str, Any]) -> None:
    for result in results:
        assert not any("not checkpointed" in note for note in result["notes"]), result


async def checkpointed(client: Client, state: Path, session: str, code: str = LOAD) -> dict[str, Any]:
    result = await call(client, code, session_id=session)
    assert result["success"], result
    with anyio.fail_after(30):
        while not state_file(state, session).exists():
            await anyio.sleep(0.1)
    return result


async def test_a_session_with_native_code_comes_back_from_a_hard_kill(server: tuple[Client, Path]) -> None:
    client, state = server
    loaded = await checkpointed(client, state, "killed")
    assert loaded["result"] == "41", loaded
    killed = await call(client, CRASH, session_id="killed")
    assert killed["session_restored"] is True and killed["restored_from_call"] == 1, killed
    after = await call(client, CHECK, session_id="killed")
    assert after["result"] == f"(True, {HELLO})", after
    never_refused(loaded, killed, after)


async def test_ten_sessions_with_native_code_hibernate_through_two_live_sandboxes(
    server: tuple[Client, Path],
) -> None:
    client, _ = server
    loaded = [
        await call(client, f"import {MODULE} as d\nx = d.add(40, {i})", session_id=f"h{i}") for i in range(10)
    ]
    back = [await call(client, f"d.add(x, 0) == {40 + i}", session_id=f"h{i}") for i in reversed(range(10))]
    assert all(result["result"] == "True" for result in back), back
    assert not any(result["session_restored"] or result["session_lost"] for result in back), (
        "hibernation is silent"
    )
    never_refused(*loaded, *back)


async def test_calls_without_a_session_that_import_native_code_are_served_clean(
    server: tuple[Client, Path],
) -> None:
    client, _ = server
    # An attribute set on the extension's module, and state kept in it, reach no later caller.
    marks = f"import {MODULE} as d\nseen = hasattr(d, 'mark') or 'kept' in vars(d)\nd.mark = 1\n"
    marks += "vars(d).setdefault('kept', []).append(1)\nseen"
    results = [await call(client, marks) for _ in range(12)]
    assert all(result["success"] and result["result"] == "False" for result in results), [
        result for result in results if result["result"] != "False"
    ][:2]


async def test_a_session_with_native_code_survives_a_server_killed_and_restarted(tmp_path: Path) -> None:
    settings = env(tmp_path, MCP_SANDBOX_LEASE_SECONDS="2")  # the killed server's lease runs out in 2 s
    async with http_server(**settings) as (port, process):
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            await checkpointed(client, tmp_path / "state", "survivor")
        process.send_signal(signal.SIGKILL)
        await process.wait()
    async with http_server(**settings) as (port, _), Client(f"http://127.0.0.1:{port}/mcp") as client:
        after = await call(client, CHECK, session_id="survivor")
        assert after["result"] == f"(True, {HELLO})", after
        assert after["session_restored"] is True and after["restored_from_call"] == 1, after


async def test_a_preloaded_extension_is_imported_before_the_first_call_and_carried(tmp_path: Path) -> None:
    settings = env(tmp_path, MCP_SANDBOX_PRELOAD_PACKAGES="dummy-pyodide-ext-test")
    async with http_server(**settings) as (port, _), Client(f"http://127.0.0.1:{port}/mcp") as client:
        first = await call(client, f"import sys\n'{MODULE}' in sys.modules", session_id="pre")
        assert first["result"] == "True", "imported before the session's first call"
        await checkpointed(client, tmp_path / "state", "pre")
        killed = await call(client, CRASH, session_id="pre")
        assert killed["session_restored"] is True, killed
        after = await call(client, CHECK, session_id="pre")
        assert after["result"] == f"(True, {HELLO})", after
        fresh = await call(client, f"import {MODULE} as d\nhasattr(d, 'mark')")
        marked = await call(client, f"import {MODULE} as d\nd.mark = 1")
        again = await call(client, f"import {MODULE} as d\nhasattr(d, 'mark')")
        assert fresh["result"] == again["result"] == "False" and marked["success"], (fresh, again)


async def test_a_cpython_functions_slot_taken_by_a_library_is_its_own_again_after_a_recycle() -> None:
    """A C extension that takes a CPython function's address gets that function's table slot,
    made when first asked for; a recycle empties the slots taken since the clean point, and the
    same library loaded again (the next caller's import) must find the function in its new slot,
    not an emptied one (a call through it would trap). Runs the runtime's linker directly, with a
    hand-made side module: the real extension takes no CPython function's address."""
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        task_group.cancel_scope.cancel()
    assert isinstance(backend, PyodideBackend) and backend._snapshot is not None
    pyodide, snapshot = backend._pyodide_dir, backend._snapshot
    script = Path(__file__).with_name("linker_slots.ts")
    done = runner_deno(
        "run", "--cached-only", f"--allow-read={REPO},{pyodide},{snapshot}", str(script), str(snapshot)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said: dict[str, Any] = json.loads(done.stdout)
    assert said["first"]["holds"] and said["first"]["slot"] >= said["cleanTable"], said  # made when asked for
    assert said["reset"] is None, said
    assert said["again"]["holds"] and said["again"]["slot"] != said["first"]["slot"], said
