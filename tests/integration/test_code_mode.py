"""Code mode that costs an agent almost nothing, through a real MCP client against the
real server, bridging a real upstream of 100 realistic tools (tests/upstreams/many_server.py)
that answers JSON as text, as most MCP servers do."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from tests.helpers import call, server_params

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
TOOLS = 100


def listing_tokens(tools: list[Any]) -> float:
    """Characters / 4 of the tools as the wire carries them (compact JSON, no empty fields)."""
    listed = [tool.model_dump(by_alias=True, exclude_none=True, mode="json") for tool in tools]
    return len(json.dumps(listed, separators=(",", ":"), ensure_ascii=False)) / 4


def upstream() -> dict[str, Any]:
    return {
        "command": sys.executable,
        "args": ["-m", "tests.upstreams.many_server", str(TOOLS)],
        "cwd": str(REPO),
    }


@pytest.fixture(scope="module")
async def client(
    anyio_backend: str, backend: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Client]:
    config = tmp_path_factory.mktemp("code-mode") / "bridge.json"
    config.write_text(json.dumps({"mcpServers": {"many": upstream()}}))
    async with Client(
        server_params(MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_BRIDGE_CONFIG=str(config))
    ) as connected:
        yield connected


async def test_the_listing_and_one_search_cost_at_most_five_percent_of_the_tools_themselves(
    client: Client, backend: str
) -> None:
    if backend != "pyodide":
        pytest.skip("measured on the default backend, whose description is the one agents read")
    direct_params = StdioServerParameters(**upstream())
    async with Client(direct_params) as direct:
        direct_tokens = listing_tokens((await direct.list_tools()).tools)
    ours = listing_tokens((await client.list_tools()).tools)
    answer = await client.call_tool("search_tools", {"query": "create a jira item"})
    search_tokens = len("".join(getattr(block, "text", "") for block in answer.content)) / 4
    assert (ours + search_tokens) / direct_tokens <= 0.05, (ours, search_tokens, direct_tokens)
    assert answer.content[0].text.startswith("tools.many.jira_create_item(query: str")  # type: ignore[union-attr]
    described = {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}
    assert (
        "100 tools on many" in described["execute_python"]
        and "jira_create_item" not in described["execute_python"]
    )


async def test_a_tool_that_answers_json_text_gives_data(client: Client) -> None:
    result = await call(client, "tools.many.jira_create_item(query='x', limit=3)['limit'] == 3")
    assert result["result"] == "True", result


async def test_a_misspelt_tool_names_the_closest_not_all(client: Client) -> None:
    # A call is checked before the program runs; a tool reached otherwise, when it is reached.
    for code, error_type in [
        ("tools.many.jira_create_itme(query='x')", "Rejected"),
        ("create = tools.many.jira_create_itme", "AttributeError"),
    ]:
        result = await call(client, code)
        assert result["error_type"] == error_type, result
        assert "jira_create_item" in result["error"], result
        assert "slack_create_item" not in result["error"] and "stripe_export_items" not in result["error"], (
            result
        )


async def test_a_misspelt_or_missing_argument_is_named(client: Client) -> None:
    # A misspelt keyword is refused before the program runs; a missing one when the call is made.
    for code, error_type in [
        ("tools.many.jira_create_item(qeury='x')", "Rejected"),
        ("arguments = {'qeury': 'x'}\ntools.many.jira_create_item(**arguments)", "TypeError"),
    ]:
        misspelt = await call(client, code)
        assert misspelt["error_type"] == error_type, misspelt
        assert (
            "did you mean 'query'" in misspelt["error"] and "'query' (str) is required" in misspelt["error"]
        )
    missing = await call(client, "tools.many.jira_create_item(limit=3)")
    assert "'query' (str) is required" in missing["error"], missing


async def test_a_full_search_gives_the_schemas(client: Client) -> None:
    answer = await client.call_tool(
        "search_tools", {"query": "archive zendesk ticket", "limit": 1, "detail": "full"}
    )
    found = answer.structured_content
    assert found is not None and found["total"] == TOOLS
    (hit,) = found["tools"]
    assert hit["signature"].startswith("tools.many.zendesk_archive_item(")
    assert hit["input_schema"]["required"] == ["query"] and "limit" in hit["input_schema"]["properties"]
