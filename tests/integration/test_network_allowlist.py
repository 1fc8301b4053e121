"""MCP_SANDBOX_ALLOW_NET: pyodide reaches the hosts listed, and nothing else."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.helpers import call, server_params

pytestmark = pytest.mark.anyio


async def test_only_listed_hosts_are_reachable() -> None:
    seen: dict[int, int] = {}

    async def answer(stream: anyio.abc.SocketStream) -> None:
        port = stream.extra(anyio.abc.SocketAttribute.local_port)
        seen[port] = seen.get(port, 0) + 1
        request = b""
        with anyio.move_on_after(5):
            while b"\r\n\r\n" not in request:
                request += await stream.receive()
        await stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await stream.aclose()

    allowed = await anyio.create_tcp_listener(local_host="127.0.0.1")
    denied = await anyio.create_tcp_listener(local_host="127.0.0.1")
    allowed_port = allowed.extra(anyio.abc.SocketAttribute.local_port)
    denied_port = denied.extra(anyio.abc.SocketAttribute.local_port)
    params = server_params(MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_ALLOW_NET=f"127.0.0.1:{allowed_port}")
    async with allowed, denied, anyio.create_task_group() as group:
        group.start_soon(allowed.serve, answer)
        group.start_soon(denied.serve, answer)
        async with Client(params) as client:
            fetch = "from pyodide.http import pyfetch\nawait (await pyfetch('http://127.0.0.1:{}/')).string()"
            ok = await call(client, fetch.format(allowed_port), session_id="net")
            refused = await call(client, fetch.format(denied_port), session_id="net")
            described = {tool.name: tool.description for tool in (await client.list_tools()).tools}
        group.cancel_scope.cancel()
    assert ok["result"] == "'ok'", ok["error"]
    assert refused["success"] is False and "net access" in refused["error"], refused
    assert seen == {allowed_port: 1}
    assert f"network access only to 127.0.0.1:{allowed_port}" in (described["execute_python"] or "")
