"""The same server over streamable HTTP and SSE, started as a real process on 127.0.0.1."""

from __future__ import annotations

import http.client
import json

import anyio
import anyio.abc
import anyio.to_thread
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.helpers import call, http_server

pytestmark = pytest.mark.anyio


TOKEN = "a-test-token-0123456789"


async def test_streamable_http() -> None:
    async with http_server("http") as (port, _), Client(f"http://127.0.0.1:{port}/mcp") as client:
        result = await call(client, "import sys\nsys.version_info[:2]", session_id="over-http")
        assert result["success"] is True and result["backend"] == "pyodide"
        assert (await call(client, "kept = 1", session_id="over-http"))["success"]
        assert (await call(client, "kept", session_id="over-http"))["result"] == "1"


async def test_sse() -> None:
    async with http_server("sse") as (port, _), Client(sse_client(f"http://127.0.0.1:{port}/sse")) as client:
        result = await call(client, "sum(range(10))")
        assert result["result"] == "45"


def status_of(port: int, path: str, headers: dict[str, str], method: str = "POST") -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}) if method == "POST" else None
    base = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    connection.request(method, path, body=body, headers={**base, **headers})
    status = connection.getresponse().status
    connection.close()
    return status


@pytest.mark.parametrize(("transport", "path"), [("http", "/mcp"), ("sse", "/sse")])
async def test_a_token_is_required_when_set(transport: str, path: str) -> None:
    method = "POST" if transport == "http" else "GET"
    async with http_server(transport, MCP_SANDBOX_AUTH_TOKEN=TOKEN, MCP_SANDBOX_BACKEND="inprocess") as (
        port,
        _,
    ):
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}, {"Authorization": TOKEN}):
            assert await anyio.to_thread.run_sync(status_of, port, path, headers, method) == 401, headers
        url = f"http://127.0.0.1:{port}{path}"
        http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
        transport_client = (
            streamable_http_client(url, http_client=http_client)
            if transport == "http"
            else sse_client(url, headers={"Authorization": f"Bearer {TOKEN}"})
        )
        async with http_client, Client(transport_client) as client:
            assert (await call(client, "6 * 7"))["result"] == "42"


async def test_http_rejects_a_foreign_host_header() -> None:
    """DNS-rebinding protection stays on: a page on another origin cannot drive the server."""

    def post_with_foreign_host(port: int) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        headers = {
            "Host": "evil.example",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        connection.request("POST", "/mcp", body=body, headers=headers)
        status = connection.getresponse().status
        connection.close()
        return status

    async with http_server("http") as (port, _):
        assert await anyio.to_thread.run_sync(post_with_foreign_host, port) in (403, 421)


@pytest.mark.parametrize(
    "body", ['[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', "42", '{"jsonrpc": "2.0", "id": 1}']
)
async def test_a_body_that_is_not_one_message_is_an_invalid_request(body: str) -> None:
    """JSON-RPC's -32600 (Invalid Request), with HTTP 400, for a batch or anything else that is JSON
    but not one message; then the server goes on serving."""

    def post(port: int) -> tuple[int, dict[str, object]]:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        connection.request("POST", "/mcp", body=body, headers=headers)
        response = connection.getresponse()
        answer = (response.status, json.loads(response.read()))
        connection.close()
        return answer

    async with http_server("http") as (port, _):
        status, answer = await anyio.to_thread.run_sync(post, port)
        assert status == 400 and answer["error"]["code"] == -32600, answer  # type: ignore[index]
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            assert (await call(client, "6 * 7"))["result"] == "42"
