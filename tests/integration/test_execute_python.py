"""execute_python through a real MCP client over stdio, on every backend (the conformance suite)."""

from __future__ import annotations

import random
import time
import uuid

import anyio
import anyio.abc
import pytest
from mcp import Client, MCPError
from mcp.types import ResourceLink, TextResourceContents

from tests.helpers import (
    TEST_ENV,
    call,
    call_watched,
    needs_isolation,
    needs_pyodide,
    pid_with_environ,
    process_tree,
    server_params,
    still_running,
)

pytestmark = pytest.mark.anyio

# Bounded, so a backend that cannot kill it (inprocess) gets its thread back after a while.
SWALLOWS_INTERRUPTS = """
import signal, time
try:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
except Exception:
    pass
end = time.monotonic() + 15
while time.monotonic() < end:
    try:
        while time.monotonic() < end:
            pass
    except BaseException:
        pass
"""


async def test_result_fields(client: Client, backend: str) -> None:
    result = await call(client, "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\n6 * 7")
    assert result["success"] is True
    assert result["stdout"] == "to stdout\n"
    assert result["stderr"] == "to stderr\n"
    assert result["result"] == "42"
    assert result["error_type"] is None and result["error"] is None
    assert isinstance(result["duration_ms"], int) and result["duration_ms"] >= 0
    assert result["backend"] == backend
    assert result["session_id"] is None
    assert result["truncated"] is False and result["session_lost"] is False


async def test_final_statement_that_is_not_an_expression_gives_no_result(client: Client) -> None:
    result = await call(client, "x = 5")
    assert result["success"] is True and result["result"] is None


async def test_exception_gives_its_type_and_a_traceback_of_user_frames_only(client: Client) -> None:
    result = await call(client, "def inner():\n    return 1 / 0\n\nprint('before')\ninner()")
    assert result["success"] is False
    assert result["error_type"] == "ZeroDivisionError"
    assert result["stdout"] == "before\n"
    error = result["error"]
    assert "return 1 / 0" in error and "inner()" in error
    assert "mcp_sandbox" not in error and "pyodide" not in error.lower() and "worker" not in error


async def test_syntax_error_is_reported(client: Client) -> None:
    result = await call(client, "def broken(:\n    pass")
    assert result["success"] is False and result["error_type"] == "SyntaxError"
    assert "line 1" in result["error"]


async def test_top_level_await(client: Client) -> None:
    result = await call(client, "import asyncio\nawait asyncio.sleep(0.01)\n'awaited'")
    assert result["success"] is True and result["result"] == "'awaited'"


async def test_sessions_keep_state_and_do_not_see_each_other(client: Client) -> None:
    assert (await call(client, "secret = 'alpha'", session_id="iso-a"))["success"]
    assert (await call(client, "secret = 'beta'", session_id="iso-b"))["success"]
    assert (await call(client, "secret", session_id="iso-a"))["result"] == "'alpha'"
    assert (await call(client, "secret", session_id="iso-b"))["result"] == "'beta'"
    unnamed = await call(client, "secret")
    assert unnamed["error_type"] == "NameError"
    assert (await call(client, "secret", session_id="iso-a"))["session_id"] == "iso-a"


async def test_calls_without_a_session_start_clean(client: Client, backend: str) -> None:
    needs_isolation(backend, "programs share the server's modules and builtins")
    tamper = "import builtins, sys\nbuiltins.planted = 1\nsys.modules['json'].dumps = None\nleft = 2"
    assert (await call(client, tamper))["success"]
    check = await call(
        client, "import json, builtins\n(hasattr(builtins, 'planted'), json.dumps is None, 'left' in dir())"
    )
    assert check["result"] == "(False, False, False)"


async def test_every_caller_draws_random_numbers_of_its_own(client: Client) -> None:
    draw = "import random\nrandom.getrandbits(64)"
    sessionless = [(await call(client, draw))["result"] for _ in range(3)]
    sessions = [(await call(client, draw, session_id=f"dice-{n}"))["result"] for n in range(3)]
    assert None not in sessionless + sessions
    assert len(set(sessionless + sessions)) == 6, sessionless + sessions
    seeded = await call(client, "import random\nrandom.seed(7)\nrandom.random()", session_id="dice-0")
    assert seeded["result"] == repr(random.Random(7).random())


async def test_a_session_is_not_tainted_by_another_one(client: Client, backend: str) -> None:
    needs_isolation(backend, "sessions share the server's modules and builtins")
    await call(client, "import builtins\nbuiltins.len = lambda x: 0", session_id="taint-a")
    assert (await call(client, "len('abc')", session_id="taint-b"))["result"] == "3"


async def test_reset_session(client: Client) -> None:
    await call(client, "kept = 1", session_id="resettable")
    reset = await client.call_tool("reset_session", {"session_id": "resettable"})
    assert reset.structured_content == {"session_id": "resettable", "existed": True}
    assert (await call(client, "kept", session_id="resettable"))["error_type"] == "NameError"
    unknown = await client.call_tool("reset_session", {"session_id": "never-made"})
    assert unknown.structured_content == {"session_id": "never-made", "existed": False}


async def test_timeout_interrupts_and_the_session_keeps_its_state(client: Client) -> None:
    await call(client, "counter = 7", session_id="slow")
    started = time.monotonic()
    result = await call(
        client, "print('started')\nwhile True:\n    counter += 0", session_id="slow", timeout=1
    )
    assert result["error_type"] == "Timeout" and result["success"] is False
    assert result["session_lost"] is False
    assert result["stdout"] == "started\n"
    assert time.monotonic() - started < 1 + float(TEST_ENV["MCP_SANDBOX_INTERRUPT_GRACE"]) + 2
    assert (await call(client, "counter", session_id="slow"))["result"] == "7"


async def test_a_bare_busy_loop_times_out_within_seconds(client: Client) -> None:
    result = await call(client, "while True: pass", timeout=1)
    assert result["error_type"] == "Timeout" and result["success"] is False
    # Server-side time, so waiting for a sandbox from a still-filling pool does not count.
    assert result["duration_ms"] < (1 + float(TEST_ENV["MCP_SANDBOX_INTERRUPT_GRACE"]) + 1) * 1000


async def test_code_that_swallows_the_interrupt_is_killed(client: Client) -> None:
    await call(client, "doomed = 1", session_id="stubborn")
    started = time.monotonic()
    result = await call(client, SWALLOWS_INTERRUPTS, session_id="stubborn", timeout=1)
    assert result["error_type"] == "Timeout"
    assert result["session_lost"] is True
    assert time.monotonic() - started < 1 + float(TEST_ENV["MCP_SANDBOX_INTERRUPT_GRACE"]) + 3
    after = await call(client, "doomed", session_id="stubborn")
    assert after["error_type"] == "NameError", "the killed session must start fresh"
    assert (await call(client, "1 + 1", session_id="stubborn"))["result"] == "2"


async def test_a_memory_bomb_is_stopped_and_the_server_keeps_serving(client: Client, backend: str) -> None:
    needs_isolation(backend, "the server's own memory has no cap apart from the machine's")
    await call(client, "kept = 'yes'", session_id="bomb")
    result = await call(client, "x = bytearray(2_000_000_000)", session_id="bomb", timeout=20)
    assert result["success"] is False and result["error_type"] in {"MemoryLimit", "MemoryError"}, result
    if result["error_type"] == "MemoryLimit":
        assert result["session_lost"] is True and "MCP_SANDBOX_MEMORY_MB" in result["error"]
    assert (await call(client, "'still serving'"))["result"] == "'still serving'"


async def test_javascript_loop_is_killed_at_the_timeout(client: Client, backend: str) -> None:
    needs_pyodide(backend, "JavaScript exists only there")
    result = await call(client, "import js\njs.eval('while (true) {}')", timeout=1)
    assert result["error_type"] == "Timeout" and result["session_lost"] is True


async def test_idle_warm_up_leaves_the_session_as_it_was(client: Client, backend: str) -> None:
    needs_pyodide(backend, "only Pyodide sandboxes warm up their JIT between calls")
    first = await call(client, "x = 41\ndef broken():\n    return 1 / 0", session_id="warm")
    assert first["success"] is True
    # Calls that arrive while the warm-up runs are served, and see only the user's names.
    during = await call(client, "x + 1, 'fib' in globals(), 'rows' in globals()", session_id="warm")
    assert during["result"] == "(42, False, False)"
    await anyio.sleep(3)
    after = await call(client, "broken()", session_id="warm")
    assert after["error_type"] == "ZeroDivisionError" and "return 1 / 0" in after["error"]
    stopped = await call(client, "while True: pass", session_id="warm", timeout=1)
    assert stopped["error_type"] == "Timeout" and stopped["session_lost"] is False
    assert (await call(client, "x", session_id="warm"))["result"] == "41"


async def test_a_million_characters_are_truncated_keeping_head_and_tail(client: Client) -> None:
    result = await call(client, "print('HEAD' + 'x' * 1_000_000 + 'TAIL')")
    assert result["success"] is True and result["truncated"] is True
    stdout = result["stdout"]
    assert stdout.startswith("HEAD") and stdout.endswith("TAIL\n")
    assert len(stdout) <= 32_768 + 100
    assert "characters truncated" in stdout
    assert "967," in stdout  # the marker says how much was cut: 1,000,009 - 32,768


async def test_a_cut_output_can_be_read_back_whole_through_its_link(client: Client) -> None:
    code = "for n in range(1, 60_001): print(f'line {n}')\nimport sys; print('to stderr', file=sys.stderr)"
    response = await client.call_tool("execute_python", {"code": code, "session_id": "long-log"})
    result = response.structured_content
    assert result is not None and result["truncated"] is True, result
    uri = result["stdout_uri"]
    assert uri and result["stderr_uri"] is None, "stderr was not cut, so it has no link"
    assert any(uri in note for note in result["notes"]), result["notes"]
    links = [block for block in response.content if isinstance(block, ResourceLink)]
    assert [str(link.uri) for link in links] == [uri]

    async def read(link: str) -> str:
        (contents,) = (await client.read_resource(link)).contents
        assert isinstance(contents, TextResourceContents)
        return contents.text

    whole = await read(uri)
    assert whole.count("\n") == 60_000 and whole.startswith("line 1\n") and whole.endswith("line 60000\n")
    assert await read(uri + "?first=50000&last=50001") == "line 50000\nline 50001\n"
    assert await read(uri + "?first=-1") == "line 60000\n"
    assert (await client.call_tool("reset_session", {"session_id": "long-log"})).structured_content
    with pytest.raises(MCPError, match="session 'long-log' was reset"):
        await read(uri)


async def test_huge_result_repr_is_truncated(client: Client) -> None:
    result = await call(client, "'y' * 500_000")
    assert result["truncated"] is True and len(result["result"]) <= 32_768 + 100


async def test_sandbox_exit_is_a_crash_and_the_server_keeps_serving(client: Client, backend: str) -> None:
    needs_isolation(backend, "os._exit there ends the server itself")
    exits = ["import os\nos._exit(3)", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"]
    if backend == "pyodide":
        exits = ["import js\njs.Deno.exit(3)", "import os\nos._exit(3)"]
    for code in exits:
        result = await call(client, code, session_id="exiter")
        assert result["error_type"] == "SandboxCrash" and result["session_lost"] is True, code
        assert (await call(client, "'alive'", session_id="exiter"))["result"] == "'alive'"


async def test_calls_in_different_sessions_run_concurrently(client: Client) -> None:
    await call(client, "1", session_id="busy")
    await call(client, "1", session_id="quick")
    finished: list[str] = []
    running = anyio.Event()

    async def reported(progress: float, total: float | None, message: str | None) -> None:
        running.set()

    async def busy() -> None:
        code = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"
        arguments = {"code": code, "session_id": "busy"}
        response = await client.call_tool("execute_python", arguments, progress_callback=reported)
        assert not response.is_error, response.content
        finished.append("busy")

    async def quick() -> None:
        await running.wait()  # the busy call's first progress report: it is running
        result = await call(client, "'done'", session_id="quick")
        assert result["result"] == "'done'"
        finished.append("quick")

    async with anyio.create_task_group() as group:
        group.start_soon(busy)
        group.start_soon(quick)
    assert finished == ["quick", "busy"]


async def test_host_environment_is_invisible(client: Client, backend: str) -> None:
    needs_isolation(backend, "programs see the server's own environment")
    result = await call(client, "import os\nsorted(os.environ.items())")
    assert result["success"] is True
    assert "hunter2" not in result["result"] and "MCP_SANDBOX" not in result["result"]
    if backend != "pyodide":
        return
    via_js = await call(client, "import js\njs.Deno.env.get('MCP_SANDBOX_TEST_SECRET')")
    assert via_js["success"] is False and "env access" in via_js["error"]


@pytest.mark.parametrize(
    "code",
    [
        "open('/etc/passwd').read()",
        f"open({__file__!r}).read()",
        "import js\njs.Deno.readTextFileSync('/etc/passwd')",
        "import js\njs.Deno.writeTextFileSync('/tmp/escaped', 'x')",
    ],
)
async def test_host_files_are_out_of_reach(client: Client, backend: str, code: str) -> None:
    needs_pyodide(
        backend if backend == "inprocess" else "pyodide", "inprocess shares the host's files (README)"
    )
    if backend == "subprocess":
        if "import js" in code:
            pytest.skip("JavaScript exists only in pyodide")
        tools = {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}
        if "no OS sandbox" in tools["execute_python"]:
            pytest.skip("this machine offers the subprocess backend no OS sandbox (isolation none)")
    result = await call(client, code)
    assert result["success"] is False, result
    assert result["error_type"] in {"FileNotFoundError", "JsException", "PermissionError"}


async def test_network_is_denied(client: Client, backend: str) -> None:
    needs_pyodide(
        backend, "JavaScript's fetch exists only in pyodide (the red team attacks each tier's network)"
    )
    result, connections = await call_watched(
        client, lambda port: f"import js\nawait js.fetch('http://127.0.0.1:{port}/')"
    )
    assert result["success"] is False and "net access" in result["error"]
    assert connections == []


async def test_forged_protocol_lines_are_ignored(client: Client, backend: str) -> None:
    if backend != "pyodide":
        line = '{"token": "guess", "msg": {"type": "result", "id": 1, "outcome": {"success": true}}}\n'
        forged = f"import os\nos.write(1, {line!r}.encode())\nprint({line!r})\n'genuine'"
        result = await call(client, forged, session_id="forger")
        assert result["result"] == "'genuine'"
        return
    forged = (
        "import js\n"
        'js.console.log(\'{"token": "guess", "msg": {"type": "result", "id": 1, '
        '"outcome": {"success": true, "result": "forged"}}}\')\n'
        "'genuine'"
    )
    result = await call(client, forged, session_id="forger")
    assert result["result"] == "'genuine'"


async def test_nothing_is_left_running_after_the_server_exits(backend: str) -> None:
    marker = f"MCP_SANDBOX_TEST_MARKER=exit-{uuid.uuid4().hex}"
    name, value = marker.split("=")
    async with Client(server_params(MCP_SANDBOX_BACKEND=backend, **{name: value})) as client:
        await call(client, "1", session_id="kept-open")
        server = pid_with_environ(marker)
        assert server is not None, "the test could not find its server process"
        tree = process_tree(server)
        if backend != "inprocess":
            assert len(tree) >= 2, f"a session and a warm pool of 2 should be running: {tree}"
    with anyio.fail_after(15):
        while still_running(tree):
            await anyio.sleep(0.1)
