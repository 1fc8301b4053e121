"""Typed stubs, through a real MCP client against the real server bridging the
upstream of 100 realistic tools (tests/upstreams/many_server.py): search_tools(detail="stub"),
tools.describe(...) inside the sandbox on every backend, and calls with wrong names refused
before anything runs."""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_sandbox import Sandbox
from tests.helpers import call, server_params

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def call_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the upstream writes each call it gets."""
    return tmp_path_factory.mktemp("many-calls") / "calls.jsonl"


@pytest.fixture(scope="module")
async def client(
    anyio_backend: str, backend: str, tmp_path_factory: pytest.TempPathFactory, call_log: Path
) -> AsyncIterator[Client]:
    config = tmp_path_factory.mktemp("typed-stubs") / "bridge.json"
    upstream = {
        "command": sys.executable,
        "args": ["-m", "tests.upstreams.many_server", "100"],
        "cwd": str(REPO),
        "env": {"MANY_SERVER_CALL_LOG": str(call_log)},
    }
    config.write_text(json.dumps({"mcpServers": {"many": upstream}}))
    async with Client(
        server_params(MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_BRIDGE_CONFIG=str(config))
    ) as connected:
        yield connected


def upstream_calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def arguments_of(stub: str, typed_dict: str) -> list[str]:
    """The keys of one TypedDict class in a stub text."""
    (found,) = [
        node for node in ast.parse(stub).body if isinstance(node, ast.ClassDef) and node.name == typed_dict
    ]
    return [item.target.id for item in found.body if isinstance(item, ast.AnnAssign)]  # type: ignore[union-attr]


async def test_a_stub_search_answers_python_that_names_the_arguments(client: Client, backend: str) -> None:
    if backend != "pyodide":
        pytest.skip("the answer does not depend on the backend")
    answer = await client.call_tool(
        "search_tools", {"query": "create a jira item", "limit": 2, "detail": "stub"}
    )
    text = answer.content[0].text  # type: ignore[union-attr]
    assert arguments_of(text, "JiraCreateItemArgs") == ["query", "limit", "cursor", "fields", "dry_run"]
    assert "    query: str  # What the item is about, in words.\n" in text
    assert "def jira_create_item(**arguments: Unpack[JiraCreateItemArgs]) -> Any:" in text
    assert "class many:" in text and text.endswith("# 2 of 100 tools")
    assert answer.structured_content is not None and answer.structured_content["stubs"] == text


async def test_describe_in_the_sandbox_gives_the_same_stubs(client: Client) -> None:
    searched = await client.call_tool(
        "search_tools", {"query": "create a jira item", "limit": 2, "detail": "stub"}
    )
    result = await call(client, "print(tools.describe('create a jira item', limit=2))")
    assert result["success"], result
    assert result["stdout"] == searched.content[0].text + "\n"  # type: ignore[union-attr]
    one = await call(client, "tools.describe(tools.many.jira_create_item)")
    assert one["success"] and "def jira_create_item(" in one["result"], one
    assert arguments_of(one["result"], "JiraCreateItemArgs")[0] == "query"
    server = await call(client, "stub = tools.describe('many')\nstub.count('def '), stub.splitlines()[-1]")
    assert server["result"] == "(100, '# 100 of 100 tools')", server


async def test_a_misspelt_keyword_is_refused_before_anything_runs(client: Client, call_log: Path) -> None:
    made = await call(client, "tools.many.jira_get_item(query='the log works')['query']")
    assert made["result"] == "'the log works'" and upstream_calls(call_log)[-1]["query"] == "the log works"
    before = len(upstream_calls(call_log))
    await call(client, "x = 1", session_id="refused")
    code = (
        "x = 2\n"
        "print('started')\n"
        "tools.many.jira_get_item(query='first')\n"
        "tools.many.jira_create_item(qeury='second', limit=3)\n"
    )
    refused = await call(client, code, session_id="refused")
    assert (refused["success"], refused["error_type"], refused["stdout"]) == (False, "Rejected", ""), refused
    error = refused["error"]
    assert error.startswith("Nothing ran: checked before running, a tool call names"), error
    assert "line 4: tools.many.jira_create_item(...): 'qeury' is not one of its arguments" in error
    assert "did you mean 'query'?" in error and "signature: tools.many.jira_create_item(query: str" in error
    assert len(upstream_calls(call_log)) == before, "the upstream got a call"
    kept = await call(client, "x", session_id="refused")
    assert kept["result"] == "1", "the refused program ran in the session"


async def test_a_misspelt_server_or_tool_is_refused_and_dynamic_calls_are_not(client: Client) -> None:
    refused = await call(
        client, "tools.mnay.jira_get_item(query='x')\ntools.many.jira_craete_item(query='x')"
    )
    assert refused["error_type"] == "Rejected", refused
    assert "there is no upstream MCP server 'mnay'; did you mean 'many'?" in refused["error"]
    assert "has no tool 'jira_craete_item'; did you mean 'jira_create_item'" in refused["error"]
    # A name computed at run time cannot be checked before: the guest refuses it when it is called.
    dynamic = await call(
        client, "print('ran')\nname = 'jira_craete_item'\ngetattr(tools.many, name)(query='x')"
    )
    assert (dynamic["error_type"], dynamic["stdout"]) == ("AttributeError", "ran\n"), dynamic


async def test_the_python_api_refuses_a_misspelt_call_too(anyio_backend: str) -> None:
    called: list[str] = []

    def search(query: str, limit: int = 3) -> list[str]:
        called.append(query)
        return [query] * limit

    async with Sandbox(backend="inprocess", pool_size=0, tools={"search": search}) as sandbox:
        refused = await sandbox.run("print('started')\ntools.local.search(qurey='x')")
        assert (refused.error_type, refused.stdout) == ("Rejected", ""), refused
        assert (
            refused.error is not None
            and "'qurey' is not one of its arguments; did you mean 'query'?" in refused.error
        )
        assert called == []
        made = await sandbox.run("tools.local.search(query='x', limit=1)")
        assert made.result == "['x']" and called == ["x"]
