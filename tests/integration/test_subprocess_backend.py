"""What only the subprocess backend does: limits, an empty environment, its own files."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from mcp_sandbox.backends.subprocess import WORKER_ENV
from mcp_sandbox.backends.subprocess.isolation import UNSHARE_ARGS
from tests.helpers import call, call_watched, server_params

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def client(anyio_backend: str) -> AsyncIterator[Client]:
    async with Client(
        server_params(MCP_SANDBOX_BACKEND="subprocess", MCP_SANDBOX_MEMORY_MB="512")
    ) as connected:
        yield connected


async def test_memory_limit_gives_memory_error_and_the_session_survives(client: Client) -> None:
    await call(client, "kept = 'yes'", session_id="hungry")
    result = await call(client, "bytearray(2_000_000_000)", session_id="hungry")
    assert result["error_type"] in {"MemoryError", "MemoryLimit"}
    assert (await call(client, "kept", session_id="hungry"))["result"] == "'yes'"


async def test_rlimits_are_set(client: Client) -> None:
    code = (
        "import resource\n"
        "[resource.getrlimit(getattr(resource, name))[0] for name in "
        "('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE')]"
    )
    limits = eval((await call(client, code))["result"])
    assert limits == [512 * 1024 * 1024, 900, 256, 64 * 1024 * 1024]


async def test_file_size_limit_is_enforced(client: Client) -> None:
    result = await call(client, "open('big.bin', 'wb').write(b'0' * (65 * 1024 * 1024))")
    assert result["success"] is False
    assert result["error_type"] in {"OSError", "SandboxCrash"}


async def test_environment_is_empty_of_host_variables(client: Client) -> None:
    env = eval((await call(client, "import os\ndict(os.environ)"))["result"])
    assert set(env) <= {"HOME", "TMPDIR", *WORKER_ENV}
    assert "hunter2-host-secret" not in str(env)


async def test_private_working_directory_is_removed_with_the_session(client: Client) -> None:
    # Inside bubblewrap the work dir is /sandbox for every worker: find it on the host by a marker.
    marker = f"note-{uuid.uuid4().hex}.txt"
    await call(client, f"open({marker!r}, 'w').write('x')", session_id="tmp")
    (note,) = Path(tempfile.gettempdir()).glob(f"mcp-sandbox-*/{marker}")
    other = await call(client, f"import os\nos.path.exists({marker!r})", session_id="tmp-other")
    assert other["result"] == "False", "another session sees the first one's files"
    await client.call_tool("reset_session", {"session_id": "tmp"})
    assert not note.parent.exists()


async def test_auto_falls_back_to_subprocess_when_deno_is_missing() -> None:
    params = server_params(MCP_SANDBOX_BACKEND="auto", MCP_SANDBOX_DENO_PATH="/nonexistent/deno")
    async with Client(params) as client:
        assert (await call(client, "import sys\nsys.implementation.name"))["backend"] == "subprocess"


def user_namespaces_work() -> bool:
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    return subprocess.run([unshare, *UNSHARE_ARGS, "true"], capture_output=True, timeout=10).returncode == 0


async def test_workers_have_no_network_where_namespaces_allow(client: Client) -> None:
    tools = {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}
    said = "no network" in tools["execute_python"] or "no IP network" in tools["execute_python"]
    if not said and not user_namespaces_work():
        pytest.skip("no isolation tier and no unshare here, so workers share the host's network")
    result, connections = await call_watched(
        client, lambda port: f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)"
    )
    # seccomp refuses the socket (PermissionError); a bare network namespace refuses the connection.
    refusals = {"OSError", "ConnectionRefusedError", "PermissionError"}
    assert result["success"] is False and result["error_type"] in refusals, result
    assert connections == []
    assert said, tools["execute_python"]


MALFORMED_CRASH = """
import gc, json, time
link = next(o for o in gc.get_objects() if type(o).__name__ == "HostLink")
for run in range(1, 50):  # one of them is this run's id; each lacks the required `message`
    link.send(json.dumps({"type": "crashed", "id": run}))
time.sleep(20)
"""


async def test_a_malformed_message_for_the_run_ends_it_at_once(client: Client) -> None:
    """The host refuses a message the protocol does not describe, and one for the run in
    progress ends it then, instead of leaving the call to wait for its timeout."""
    result = await call(client, MALFORMED_CRASH, timeout=15)
    assert result["error_type"] == "SandboxCrash" and result["session_lost"], result
    assert "malformed crashed message" in result["error"]
    assert result["duration_ms"] < 5_000
    assert (await call(client, "'next'"))["result"] == "'next'"
