"""The MCP adapter, with the MCP server in memory: the tools and their schemas, and bad arguments
get a clear MCP error while the server keeps serving."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from tests.helpers import call, in_memory

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def client(anyio_backend: str) -> AsyncIterator[Client]:
    async with in_memory(max_code_chars=2000, max_sessions=2, pool_size=1) as connected:
        yield connected


async def test_tools_are_listed_with_an_output_schema(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) >= {"execute_python", "reset_session"}
    schema = tools["execute_python"].output_schema
    assert schema is not None
    for field in (
        "success",
        "status",
        "exception",
        "stdout",
        "stderr",
        "result",
        "error",
        "duration_ms",
        "backend",
        "session_id",
        "truncated",
        "session_lost",
    ):
        assert field in schema["properties"], field
    assert "error_type" not in schema["properties"], "deprecated: in results, not advertised"
    assert "session_id" in (tools["execute_python"].description or "")


async def test_a_result_still_carries_the_deprecated_error_type(client: Client) -> None:
    failed = await call(client, "1 / 0")
    assert (failed["status"], failed["exception"], failed["error_type"]) == (
        "error",
        "ZeroDivisionError",
        "ZeroDivisionError",
    )


@pytest.mark.parametrize(
    ("arguments", "complaint"),
    [
        ({"code": 5}, "code"),
        ({}, "code"),
        ({"code": "1", "timeout": -1}, "timeout"),
        ({"code": "1", "timeout": "soon"}, "timeout"),
        ({"code": "1", "session_id": "bad id with spaces"}, "session_id"),
        ({"code": "1", "session_id": "x" * 500}, "session_id"),
        ({"code": "#" * 2_001}, "limit is 2,000"),
    ],
)
async def test_bad_arguments_get_a_clear_error(
    client: Client, arguments: dict[str, Any], complaint: str
) -> None:
    response = await client.call_tool("execute_python", arguments)
    assert response.is_error is True
    assert complaint in response.content[0].text  # type: ignore[union-attr]
    assert (await call(client, "'still serving'", session_id="survivor"))["result"] == "'still serving'"


async def test_session_limit_is_a_clear_error(client: Client) -> None:
    # "survivor" from the tests above holds one of the two slots.
    await call(client, "1", session_id="survivor")
    assert (await call(client, "1", session_id="first"))["success"]
    response = await client.call_tool("execute_python", {"code": "1", "session_id": "second"})
    assert response.is_error is True
    assert "reset_session" in response.content[0].text  # type: ignore[union-attr]
    await client.call_tool("reset_session", {"session_id": "first"})
    assert (await call(client, "2", session_id="second"))["result"] == "2"


async def test_an_unknown_tool_is_invalid_params(client: Client) -> None:
    with pytest.raises(MCPError) as raised:
        await client.call_tool("no_such_tool", {})
    assert (
        raised.value.error.code == INVALID_PARAMS
        and "Unknown tool: no_such_tool" in raised.value.error.message
    )


async def test_an_unknown_prompt_is_invalid_params_and_logs_no_traceback(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG), pytest.raises(MCPError) as raised:
        await client.get_prompt("no_such_prompt")
    assert raised.value.error.code == INVALID_PARAMS and "Unknown prompt" in raised.value.error.message
    assert not [record for record in caplog.records if record.exc_info], "a caller cannot fill the log"


@pytest.mark.parametrize(
    "listing", ["list_tools", "list_resources", "list_resource_templates", "list_prompts"]
)
async def test_a_cursor_this_server_never_handed_out_is_invalid_params(client: Client, listing: str) -> None:
    with pytest.raises(MCPError) as raised:
        await getattr(client, listing)(cursor="made-up")
    assert raised.value.error.code == INVALID_PARAMS and "Invalid cursor" in raised.value.error.message
