"""Two instances behind a real nginx, sharing one state folder (or one real redis-server): nginx routes each
client by its Mcp-Session-Id; when the instance that runs a session is killed, the next call
goes to the other one, which takes the session's lease once it runs out and restores the
session's last checkpoint. Real nginx, real server processes, real MCP client."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import httpx
import pytest
import redis.asyncio
from mcp import Client
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import (
    as_caller,
    call,
    free_port,
    http_server,
    process_tree,
    redis_server,
    state_file,
    state_name,
    stop_process,
    two_instances,
    wait_for_port,
    write_tokens,
)

pytestmark = pytest.mark.anyio

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
LEASE_S = 3
ALICE_TOKEN = "alice-token-0123456789abcdef"
BOB_TOKEN = "bob-token-0123456789abcdef"
#: A checkpoint lands 2 s after a call (lifecycle.Timings.checkpoint_quiet), plus its own time.
SETTLE_S = 30.0

NGINX_CONFIG = """
daemon off;
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/body;
    proxy_temp_path {root}/proxy;
    # A session's calls go to one instance: clients of MCP 2026-07-28 mirror the session id into
    # Mcp-Param-Session-Id; older clients send back the Mcp-Session-Id the server gave them.
    upstream sandboxes {{
        hash "$http_mcp_param_session_id$http_mcp_session_id" consistent;
        server 127.0.0.1:{first} max_fails=1 fail_timeout=60s;
        server 127.0.0.1:{second} max_fails=1 fail_timeout=60s;
    }}
    server {{
        listen 127.0.0.1:{port};
        location /mcp {{
            proxy_pass http://sandboxes;
            proxy_http_version 1.1;
            # The client's Host, which the server checks (DNS rebinding), not the upstream's name.
            proxy_set_header Host $http_host;
            proxy_buffering off;
            proxy_read_timeout 120s;
            # A dead instance refuses the connection: the request goes to the next one.
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""


@pytest.fixture(params=["pyodide", "subprocess"])
def backend(request: pytest.FixtureRequest) -> str:
    """The backends that checkpoint sessions (in-process keeps none)."""
    name: str = request.param
    return name


@asynccontextmanager
async def nginx(root: Path, first: int, second: int) -> AsyncIterator[int]:
    assert NGINX is not None
    port = free_port()
    root.mkdir()
    config = root / "nginx.conf"
    config.write_text(NGINX_CONFIG.format(root=root, first=first, second=second, port=port))
    process = await anyio.open_process([NGINX, "-c", str(config), "-p", str(root)], stderr=subprocess.PIPE)
    try:
        await wait_for_port(port, process, limit=20)
        yield port
    finally:
        await stop_process(process)


def lease_holder(state: Path, session_id: str) -> int | None:
    """The pid of the instance whose lease on the session is on record (owner is host:pid:tag)."""
    try:
        record = json.loads((state / "leases" / f"{state_name(session_id)}.lease").read_text())
    except (OSError, ValueError):
        return None
    return int(record["owner"].split(":")[1])


async def saved(state: Path, session_id: str) -> None:
    with anyio.fail_after(SETTLE_S):
        while not state_file(state, session_id).exists():
            await anyio.sleep(0.2)


class SharedState:
    """Where the instances keep sessions: a shared folder, or one real redis-server. Its `env`
    points an instance at it; `holder` and `saved` read it as the instances left it."""

    def __init__(self, folder: Path, redis_url: str | None) -> None:
        self.folder, self.redis_url = folder, redis_url
        self.env = (
            {"MCP_SANDBOX_STATE_URL": redis_url} if redis_url else {"MCP_SANDBOX_STATE_DIR": str(folder)}
        )

    def _key(self, session_id: str, kind: str) -> str:
        return f"mcp-sandbox:{{{session_id}}}:{kind}"  # the default MCP_SANDBOX_STATE_KEY_PREFIX

    async def holder(self, session_id: str) -> int | None:
        """The pid of the instance whose lease on the session is on record."""
        if self.redis_url is None:
            return lease_holder(self.folder, session_id)
        async with redis.asyncio.Redis.from_url(self.redis_url) as client:
            value = await client.get(self._key(session_id, "lease"))
        return None if value is None else int(json.loads(value)["owner"].split(":")[1])

    async def saved(self, session_id: str) -> None:
        """Once the session's first checkpoint is stored (polled, bounded)."""
        if self.redis_url is None:
            return await saved(self.folder, session_id)
        async with redis.asyncio.Redis.from_url(self.redis_url) as client:
            with anyio.fail_after(SETTLE_S):
                while not await client.hexists(self._key(session_id, "data"), "state"):  # type: ignore[misc]
                    await anyio.sleep(0.2)


@pytest.fixture(params=["folder", "redis"])
async def shared_state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SharedState]:
    if request.param == "folder":
        yield SharedState(tmp_path / "state", None)
        return
    async with redis_server(tmp_path / "redis") as url:
        yield SharedState(tmp_path / "state", url)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light)")
async def test_a_session_survives_the_loss_of_its_instance_behind_nginx(
    tmp_path: Path, backend: str, shared_state: SharedState
) -> None:
    """Both routes, one per backend run: pyodide with today's client (Mcp-Param-Session-Id), and
    subprocess with a client of the initialize handshake (Mcp-Session-Id, stateless HTTP); each
    on a shared folder and on Redis."""
    mode = "auto" if backend == "pyodide" else "legacy"
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        **shared_state.env,
        "MCP_SANDBOX_STATELESS_HTTP": "true",
        "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S),
    }
    async with AsyncExitStack() as stack:
        first, first_process = await stack.enter_async_context(http_server(**env))
        second, second_process = await stack.enter_async_context(http_server(**env))
        instances = {first_process.pid: first_process, second_process.pid: second_process}
        port = await stack.enter_async_context(nginx(tmp_path / "nginx", first, second))
        client = await stack.enter_async_context(Client(f"http://127.0.0.1:{port}/mcp", mode=mode))
        await client.list_tools()  # what tells a client to mirror the session id into a header

        assert (await call(client, "x = 41", session_id="kept"))["success"]
        holder = await shared_state.holder("kept")
        assert holder in instances, "the instance that ran the call holds the session's lease"
        for _ in range(3):  # one client's calls stay on one instance: no lease changes hands
            assert (await call(client, "x", session_id="kept"))["result"] == "41"
            assert await shared_state.holder("kept") == holder
        await shared_state.saved("kept")

        instances[holder].send_signal(signal.SIGKILL)
        await instances[holder].wait()
        with anyio.fail_after(60):
            after = await call(client, "x == 41", session_id="kept")
        assert after["result"] == "True", after
        assert after["session_restored"] is True and after["restored_from_call"] >= 1, after
        survivor = await shared_state.holder("kept")
        assert survivor in instances and survivor != holder, "the other instance took the session over"
        assert (await call(client, "x + 1", session_id="kept"))["result"] == "42"


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx-light)")
async def test_two_principals_sessions_of_one_name_each_survive_the_move_with_its_own_state(
    tmp_path: Path,
) -> None:
    """alice and bob both call their session "analysis": one name, so nginx sends both to one
    instance; that instance is killed, and each principal's session comes back on the other with
    its own value. The subprocess backend only: the scoping is the server's, not the backend's."""
    state = tmp_path / "state"
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, {"alice": ALICE_TOKEN, "bob": BOB_TOKEN})
    env = {
        "MCP_SANDBOX_BACKEND": "subprocess",
        "MCP_SANDBOX_STATE_DIR": str(state),
        "MCP_SANDBOX_STATELESS_HTTP": "true",
        "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S),
        "MCP_SANDBOX_AUTH_TOKENS_FILE": str(tokens),
    }
    async with AsyncExitStack() as stack:
        first, first_process = await stack.enter_async_context(http_server(**env))
        second, second_process = await stack.enter_async_context(http_server(**env))
        instances = {first_process.pid: first_process, second_process.pid: second_process}
        port = await stack.enter_async_context(nginx(tmp_path / "nginx", first, second))
        alice = await stack.enter_async_context(as_caller(port, ALICE_TOKEN))
        bob = await stack.enter_async_context(as_caller(port, BOB_TOKEN))
        for client in (alice, bob):
            await client.list_tools()  # so each mirrors the session id into the header nginx hashes on

        assert (await call(alice, "owner = 'alice'", session_id="analysis"))["success"]
        assert (await call(bob, "owner = 'bob'", session_id="analysis"))["success"]
        holder = lease_holder(state, "alice/analysis")
        assert holder in instances and lease_holder(state, "bob/analysis") == holder, "one name, one instance"
        assert not state_file(state, "analysis").exists(), "no session is stored under the bare name"
        await saved(state, "alice/analysis")
        await saved(state, "bob/analysis")

        instances[holder].send_signal(signal.SIGKILL)
        await instances[holder].wait()
        for client, owner in ((alice, "alice"), (bob, "bob")):
            with anyio.fail_after(60):
                after = await call(client, "owner", session_id="analysis")
            assert after["result"] == repr(owner), after
            assert after["session_restored"] is True and after["restored_from_call"] >= 1, after
        survivor = lease_holder(state, "alice/analysis")
        assert survivor in instances and survivor != holder, "the other instance took the sessions over"
        assert lease_holder(state, "bob/analysis") == survivor
        assert (await call(alice, "owner", session_id="analysis"))["result"] == "'alice'"
        assert (await call(bob, "owner", session_id="analysis"))["result"] == "'bob'"


async def handovers(port: int) -> float:
    """The instance's count of sessions it handed over, from its /metrics."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "mcp_sandbox_handovers"]
    return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))


async def test_a_call_for_a_session_another_instance_holds_is_handed_over(
    tmp_path: Path, shared_state: SharedState
) -> None:
    """A routing change costs a restore, not an error: the instance a call reaches asks the holder
    for the session, which checkpoints it and lets go; a stop hands sessions over at once too."""
    env = {"MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S), **shared_state.env}
    async with two_instances(**env) as ((first, first_process, a), (second, second_process, b)):
        assert (await call(a, "x = 41", session_id="busy"))["success"]
        assert await shared_state.holder("busy") == first_process.pid
        # a renews its lease while the session is live: waiting it out would be refused.
        moved = await call(b, "x", session_id="busy")
        assert moved["result"] == "41", moved
        assert moved["session_restored"] is True and moved["restored_from_call"] == 1, moved
        assert await shared_state.holder("busy") == second_process.pid
        assert await handovers(first) == 1 and await handovers(second) == 0
        assert (await call(b, "x += 1", session_id="busy"))["success"]
        back = await call(a, "x", session_id="busy")
        assert back["result"] == "42" and back["session_restored"] is True, back
        # A stopped instance checkpoints what ran since its last checkpoint and gives its leases up.
        assert (await call(a, "x += 1", session_id="busy"))["success"]
        first_process.terminate()
        await first_process.wait()
        with anyio.fail_after(10):
            moved = await call(b, "x", session_id="busy")
        assert moved["result"] == "43", moved


async def test_a_session_whose_sandbox_died_before_its_checkpoint_is_handed_over_and_says_so(
    tmp_path: Path,
) -> None:
    """The holder cannot checkpoint a dead sandbox: it lets the session go as lost, and the asker
    serves the call saying so, rather than both waiting out the lease and refusing the call."""
    env = {
        "MCP_SANDBOX_BACKEND": "subprocess",
        "MCP_SANDBOX_LEASE_SECONDS": str(LEASE_S),
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
    }
    async with two_instances(**env) as ((first, first_process, a), (_, _, b)):
        assert (await call(a, "x = 41", session_id="dies"))["success"]
        # Killed well inside the 2 s before its checkpoint, as the OOM killer might.
        sandboxes = [pid for pid in process_tree(first_process.pid) if pid != first_process.pid]
        killed = 0
        for pid in sandboxes:
            # A process of the tree may end on its own meanwhile (a sandbox's short-lived helper).
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        assert killed, sandboxes
        moved = await call(b, "x = 1", session_id="dies")
        assert moved["success"] and moved["session_lost"] is True, moved
        assert await handovers(first) == 1
