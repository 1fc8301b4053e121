"""The tool bridge, end to end: real upstream MCP servers (stdio and streamable HTTP, started
here), the real server process, a real MCP client, on every backend."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.helpers import call, free_port, needs_isolation, server_params, stop_process, wait_for_port
from tests.upstreams.calc_server import app as calc_app

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
CALL_TIMEOUT = 3  # MCP_SANDBOX_BRIDGE_CALL_TIMEOUT of the server under test
GRACE = 8  # MCP_SANDBOX_INTERRUPT_GRACE: long, so a slow machine's interrupt is not taken for a kill
MAX_CALLS = 250  # MCP_SANDBOX_BRIDGE_MAX_CALLS of the server under test


def stdio_upstream(marker: str) -> dict[str, object]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.upstreams.calc_server"],
        "cwd": str(REPO),
        "env": {"CALC_MARKER": marker},
    }


async def start_upstream(mode: str) -> tuple[anyio.abc.Process, int]:
    port = free_port()
    process = await anyio.open_process(
        [sys.executable, "-m", "tests.upstreams.calc_server", mode, str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await wait_for_port(port, process, limit=30)
    return process, port


@pytest.fixture(scope="module")
async def http_upstreams() -> AsyncIterator[tuple[str, str]]:
    """A streamable HTTP upstream and an SSE one, on 127.0.0.1."""
    started: list[anyio.abc.Process] = []
    try:
        http, http_port = await start_upstream("http")
        started.append(http)
        sse, sse_port = await start_upstream("sse")
        started.append(sse)
        yield f"http://127.0.0.1:{http_port}/mcp", f"http://127.0.0.1:{sse_port}/sse"
    finally:
        for process in started:
            await stop_process(process, signal.SIGKILL)


async def _wait_http(port: int, process: subprocess.Popen[bytes]) -> None:
    with anyio.fail_after(30):
        while True:
            if process.poll() is not None:
                raise RuntimeError("the HTTP upstream exited")
            try:
                await (await anyio.connect_tcp("127.0.0.1", port)).aclose()
                return
            except OSError:
                await anyio.sleep(0.1)


@pytest.fixture(scope="module")
def bridge_config(tmp_path_factory: pytest.TempPathFactory, http_upstreams: tuple[str, str]) -> Path:
    http_url, sse_url = http_upstreams
    config = {
        "mcpServers": {
            "calc": stdio_upstream("stdio-calc"),
            "web-calc": {"url": http_url},
            "sse calc": {"url": sse_url},
            "fragile": stdio_upstream("fragile"),
        }
    }
    path = tmp_path_factory.mktemp("bridge") / "upstreams.json"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str, bridge_config: Path) -> AsyncIterator[Client]:
    params = server_params(
        MCP_SANDBOX_BACKEND=backend,
        MCP_SANDBOX_BRIDGE_CONFIG=str(bridge_config),
        MCP_SANDBOX_BRIDGE_CALL_TIMEOUT=str(CALL_TIMEOUT),
        MCP_SANDBOX_BRIDGE_MAX_CALLS=str(MAX_CALLS),
        MCP_SANDBOX_INTERRUPT_GRACE=str(GRACE),
    )
    async with Client(params) as connected:
        yield connected


async def test_two_hundred_calls_in_one_program(client: Client) -> None:
    result = await call(client, "print(sum(tools.calc.add(a=i, b=1)['sum'] for i in range(200)))")
    assert result["success"] is True, result
    assert result["stdout"] == "20100\n"


async def test_http_and_sse_upstreams(client: Client) -> None:
    result = await call(client, "tools.web_calc.add(a=2, b=3), tools.sse_calc.add(a=4, b=5)")
    assert result["result"] == "({'sum': 5}, {'sum': 9})", result


async def test_return_types_and_names(client: Client) -> None:
    code = (
        "(tools.calc.shout(text='hi', times=2), tools.calc.numbers(count=3), "
        "tools.calc.get_weather(city='Oslo'), tools.calc.class_(kind='x'))"
    )
    result = await call(client, code)
    assert result["result"] == "('HI HI', [0, 1, 2], {'city': 'Oslo', 'sky': 'clear'}, 'class x')", result


async def test_images_and_resources_come_back_as_small_objects(client: Client) -> None:
    code = (
        "caption, image = tools.calc.chart(title='sales')\n"
        "page = tools.calc.manual(page='intro')\n"
        "(caption, image.kind, image.mime_type, image.data[:8], len(image.data),"
        " image.data[8:] == bytes(range(256)), isinstance(image, tools.ToolContent),"
        " page.kind, page.uri, page.mime_type, page.data, repr(image))"
    )
    result = await call(client, code)
    assert result["success"] is True, result
    assert eval(result["result"]) == (
        "chart: sales",
        "image",
        "image/png",
        b"\x89PNG\r\n\x1a\n",
        264,
        True,
        True,
        "resource",
        "docs://manual/intro",
        "text/markdown",
        "# intro\n",
        "<tools.ToolContent image: image/png, 264 bytes>",
    )


async def test_upstream_error_raises_tool_error_with_its_message(client: Client) -> None:
    result = await call(client, "tools.calc.fail(message='the upstream says no')")
    assert result["error_type"] == "ToolError"
    assert "the upstream says no" in result["error"]
    assert "mcp_sandbox" not in result["error"]
    caught = await call(
        client, "try:\n    tools.calc.fail(message='x')\nexcept ToolError as e:\n    r = 'caught'\nr"
    )
    assert caught["result"] == "'caught'"


async def test_signatures_and_docstrings(client: Client) -> None:
    code = "import inspect\n(str(inspect.signature(tools.calc.add)), tools.calc.add.__doc__)"
    result = await call(client, code)
    signature, doc = eval(result["result"])
    assert signature == "(a: int, b: int)"
    assert "Add two integers." in doc and "a (int): The first addend." in doc
    shout = await call(client, "import inspect\nstr(inspect.signature(tools.calc.shout))")
    assert shout["result"] == "'(text: str, times: int | None = None)'"
    wrong = await call(client, "tools.calc.add(1)")
    assert wrong["error_type"] == "TypeError" and "missing a required argument: 'b'" in wrong["error"]
    unknown = await call(client, "tools.calc.addd")
    assert unknown["error_type"] == "AttributeError" and "add" in unknown["error"]


async def test_search_tools_and_the_description(client: Client) -> None:
    found = await client.call_tool("search_tools", {"query": "weather city"})
    assert found.structured_content is not None
    first = found.structured_content["tools"][0]
    assert first["signature"].startswith("tools.") and "get_weather(city: str)" in first["signature"]
    assert first["tool"] == "get-weather"
    per_server = len(await calc_app.list_tools())
    assert found.structured_content["total"] == 4 * per_server
    described = {tool.name: tool.description for tool in (await client.list_tools()).tools}
    # How many tools on which servers, never the tools themselves: it costs every agent tokens.
    assert f"{4 * per_server} tools on calc" in (described["execute_python"] or "")
    assert "get_weather" not in (described["execute_python"] or "")
    # Stubs type a result from the tool's output schema, unwrapping {"result": ...}.
    stub = await client.call_tool("search_tools", {"query": "add two integers", "limit": 1, "detail": "stub"})
    text = stub.content[0].text  # type: ignore[union-attr]
    assert "class AddResult(TypedDict):\n    sum: int\n" in text, text
    assert "def add(**arguments: Unpack[AddArgs]) -> AddResult:" in text, text
    numbers = await client.call_tool(
        "search_tools", {"query": "integers below count", "limit": 1, "detail": "stub"}
    )
    assert "def numbers(**arguments: Unpack[NumbersArgs]) -> list[int]:" in numbers.content[0].text  # type: ignore[union-attr]


async def test_async_calls_run_in_parallel(client: Client) -> None:
    code = (
        "import asyncio\n"
        "replies = await asyncio.gather(*[tools.calc.slow_async(seconds=0.5) for _ in range(6)])\n"
        "replies"
    )
    result = await call(client, code)
    assert result["result"] == repr(["slept"] * 6), result
    assert result["duration_ms"] < 2_500, "six 0.5 s calls in parallel, not one after another"


async def test_a_hanging_upstream_call_times_out(client: Client) -> None:
    result = await call(client, "tools.calc.slow(seconds=30)", timeout=20)
    assert result["error_type"] == "ToolError"
    assert f"timed out after {CALL_TIMEOUT} s" in result["error"]
    assert result["duration_ms"] < (CALL_TIMEOUT + 3) * 1000
    assert (await call(client, "tools.calc.add(a=1, b=1)"))["result"] == "{'sum': 2}"


async def test_execution_timeout_cancels_a_pending_call(client: Client) -> None:
    await call(client, "kept = 'yes'", session_id="bridged")
    result = await call(client, "tools.calc.slow(seconds=2.5)", session_id="bridged", timeout=1)
    assert result["error_type"] == "Timeout"
    assert result["duration_ms"] < 4_000
    after = await call(client, "kept, tools.calc.add(a=2, b=2)", session_id="bridged")
    assert after["result"] == "('yes', {'sum': 4})", (after["error_type"], after["error"])


async def test_a_call_made_after_the_deadline_is_not_made(client: Client, backend: str) -> None:
    needs_isolation(
        backend, "sum() holds the GIL and so stops the server's clock: the deadline is seen after the call"
    )
    # The interrupt lands while sum() runs in C, so the program reaches the tool call with it
    # pending: the call must be refused, never reach the upstream, and not cost the session.
    # sum() is sized on this machine, now, to take about 3 s at its quickest: the 0.5 s deadline
    # lands inside it, and it ends within the grace (8 s) unless the machine slows nearly threefold.
    # The upstream's own count says whether the call was made.
    calibrate = (
        "import time\ndef took():\n    t = time.perf_counter()\n    sum(range(10**6))\n"
        "    return time.perf_counter() - t\nper_million = min(took() for _ in range(3))"
    )
    await call(client, calibrate, session_id="late-call")
    made = (await call(client, "tools.calc.slow_calls()", session_id="late-call"))["result"]
    code = "sum(range(int(3 / per_million) * 10**6))\ntools.calc.slow(seconds=5)"
    result = await call(client, code, session_id="late-call", timeout=0.5)
    assert result["error_type"] == "Timeout", result
    assert not result.get("session_lost"), result
    after = await call(client, "per_million, tools.calc.slow_calls()", session_id="late-call")
    assert (after["result"] or "").endswith(f", {made})"), (
        "the tool call after the deadline was made",
        after["result"],
    )


async def test_call_limit_per_execution(client: Client) -> None:
    code = (
        "done = 0\n"
        "try:\n"
        f"    for i in range({MAX_CALLS + 10}):\n"
        "        tools.calc.add(a=i, b=0)\n"
        "        done += 1\n"
        "except ToolError as error:\n"
        "    message = str(error)\n"
        "done, message"
    )
    result = await call(client, code)
    done, message = eval(result["result"])
    assert done == MAX_CALLS and "MCP_SANDBOX_BRIDGE_MAX_CALLS" in message


async def test_only_configured_tools_are_reachable(client: Client, backend: str) -> None:
    # Reach past the generated functions to the raw transport and ask for anything else.
    code = (
        "transport = next(c.cell_contents for c in tools.calc.add.__closure__\n"
        "                 if hasattr(c.cell_contents, 'call_sync'))\n"
        "[transport.call_sync(server, tool, '{}') for server, tool in\n"
        "    [('calc', 'missing'), ('nowhere', 'add'), ('calc', '__class__'), ('../calc', 'add')]]"
    )
    result = await call(client, code)
    assert result["success"] is True, result
    replies = [json.loads(reply) for reply in eval(result["result"])]
    assert all(reply["ok"] is False and "no upstream tool" in reply["error"] for reply in replies), replies


async def test_an_upstream_that_crashes_mid_call_is_reconnected(client: Client) -> None:
    before = await call(client, "tools.fragile.whoami()['pid']")
    crashed = await call(client, "tools.fragile.crash()")
    assert crashed["error_type"] == "ToolError", crashed
    recovered = None
    with anyio.fail_after(30):
        while recovered is None:
            attempt = await call(client, "tools.fragile.whoami()['pid']")
            if attempt["success"]:
                recovered = attempt["result"]
            else:
                await anyio.sleep(0.5)
    assert recovered != before["result"], "a new upstream process answers"


@pytest.fixture
async def doomed_upstream() -> AsyncIterator[tuple[subprocess.Popen[bytes], str]]:
    """A streamable HTTP upstream the test stops."""
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 - Popen returns at once; _wait_http waits without blocking
        [sys.executable, "-m", "tests.upstreams.calc_server", "http", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await _wait_http(port, process)
        yield process, f"http://127.0.0.1:{port}/mcp"
    finally:
        process.kill()
        process.wait(10)


async def test_an_upstream_that_goes_down_is_named_with_when_it_was_last_reachable(
    backend: str, tmp_path: Path, doomed_upstream: tuple[subprocess.Popen[bytes], str]
) -> None:
    process, url = doomed_upstream
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"mcpServers": {"doomed": {"url": url}}}))
    params = server_params(
        MCP_SANDBOX_BACKEND=backend,
        MCP_SANDBOX_BRIDGE_CONFIG=str(config),
        MCP_SANDBOX_BRIDGE_CALL_TIMEOUT=str(CALL_TIMEOUT),
        MCP_SANDBOX_POOL_SIZE="1",
    )
    async with Client(params) as client:
        assert (await call(client, "tools.doomed.add(a=1, b=2)"))["result"] == "{'sum': 3}"
        process.kill()
        process.wait(10)
        failed = await call(client, "tools.doomed.add(a=1, b=2)")
        if "disconnected" in (failed["error"] or ""):  # the call that finds it gone; the next one waits
            failed = await call(client, "tools.doomed.add(a=1, b=2)")
    assert failed["error_type"] == "ToolError", failed
    error = failed["error"]
    assert "upstream 'doomed' is down" in error, error
    assert "last reachable at" in error and "s ago" in error, error
    assert f"calls may take {CALL_TIMEOUT} s" in error and "MCP_SANDBOX_BRIDGE_CALL_TIMEOUT" in error, error


async def test_a_recycled_sandbox_delivers_async_tool_results_again(backend: str, tmp_path: Path) -> None:
    """Pyodide caches the proxy of `channel.deliver` in JavaScript, which a recycle does not copy
    back: read first after the clean point, it outlived its object, and a recycled sandbox's next
    `_async` call died ('function signature mismatch'). Each round lands in the recycled sandbox."""
    if backend != "pyodide":
        pytest.skip("pyodide only: only Pyodide sandboxes are recycled")
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"mcpServers": {"calc": stdio_upstream("recycled")}}))
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_POOL_SIZE="1", MCP_SANDBOX_BRIDGE_CONFIG=str(config)
    )
    which = "import js\nprint(js.performance.timeOrigin)\n"
    served: dict[str, int] = {}
    async with Client(params) as client:
        for _ in range(4):
            gathered = "import asyncio\n(await asyncio.gather(tools.calc.add_async(a=1, b=2)))[0]"
            called = await call(client, which + gathered)
            assert called["success"] is True and called["result"] == "{'sum': 3}", called
            served[called["stdout"]] = served.get(called["stdout"], 0) + 1
            # Objects made after the clean point take the freed memory the stale proxy points to.
            churned = await call(client, which + "keep = [str(i) * 3 for i in range(20000)]\nlen(keep)")
            assert churned["success"] is True, churned
    assert max(served.values()) >= 2, f"no sandbox was recycled after a tool call: {served}"
