"""What the bridge knows of calls before they are made: tools.describe's answer, and the check of
a program's tool calls against the catalog before it runs."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from mcp_sandbox.backends.base import ToolCalls
from mcp_sandbox.bridge.catalog import ToolSpec, tool_spec
from mcp_sandbox.bridge.config import BridgeConfig, StdioUpstream
from mcp_sandbox.bridge.upstreams import ToolBridge
from tests.upstreams.many_server import build

pytestmark = pytest.mark.anyio


def _listed(count: int) -> list[ToolSpec]:
    """many_server's tools as the bridge lists them (the SDK's own schemas)."""
    listed = anyio.run(build(count).list_tools)
    return [
        tool_spec(
            "many", "many", tool.name, tool.name, tool.description, tool.input_schema, tool.output_schema
        )
        for tool in listed
    ]


MANY = _listed(100)


def many_specs(count: int) -> list[ToolSpec]:
    return MANY[:count]


def bridge_of(specs: list[ToolSpec]) -> ToolBridge:
    """A bridge whose upstreams have listed `specs` (nothing is started)."""
    servers = {spec.server: StdioUpstream(command="true") for spec in specs}
    bridge = ToolBridge(BridgeConfig(servers=servers), call_timeout=5)
    for connection in bridge.connections.values():
        connection.specs = [spec for spec in specs if spec.server == connection.name]
    bridge._changed()  # what a connection does once it has listed its tools
    return bridge


def stub_functions(text: str) -> list[str]:
    return [line.split("(")[0].split()[-1] for line in text.splitlines() if line.lstrip().startswith("def ")]


def test_describe_takes_a_server_a_tool_or_words() -> None:
    specs = [*many_specs(20), tool_spec("web search", "web_search", "get-page", "get_page", "Fetch.", {})]
    bridge = bridge_of(specs)
    assert len(stub_functions(bridge.describe("many", 5))) == 20  # a server: all its tools
    for name in ("jira_create_item", "many.jira_create_item", "tools.many.jira_create_item"):
        assert stub_functions(bridge.describe(name, 5)) == ["jira_create_item"], name
    assert stub_functions(bridge.describe("web search", 5)) == ["get_page"]  # upstream names too
    assert stub_functions(bridge.describe("web_search.get-page", 5)) == ["get_page"]
    worded = bridge.describe("create a jira item", 3)
    assert stub_functions(worded)[0] == "jira_create_item" and worded.endswith("# 3 of 21 tools")
    assert bridge.describe("zebra crossing", 3).startswith("# no tool matches")


def test_a_server_cannot_take_the_names_the_guest_uses() -> None:
    servers = {name: StdioUpstream(command="true") for name in ("describe", "ToolError", "jira")}
    bridge = ToolBridge(BridgeConfig(servers=servers), call_timeout=5)
    assert list(bridge.connections) == ["describe_2", "ToolError_2", "jira"]


async def test_describes_count_as_calls_and_are_answered_like_them() -> None:
    bridge = bridge_of(many_specs(10))
    replies: dict[int, Any] = {}

    async def deliver(call: int, reply: str) -> None:
        replies[call] = json.loads(reply)

    async with anyio.create_task_group() as task_group:
        calls = ToolCalls(bridge, task_group, max_calls=2)
        calls.start_describe(1, "jira_get_item", 5, deliver)
        calls.start_describe(2, "", 1, deliver)
        calls.start_describe(3, "jira", 5, deliver)
    assert replies[1]["ok"] and "def jira_get_item(" in replies[1]["value"]
    assert replies[2]["ok"] and replies[2]["value"].endswith("# 1 of 10 tools")
    assert replies[3] == {
        "ok": False,
        "error": "this execution made more than 2 tool calls (MCP_SANDBOX_BRIDGE_MAX_CALLS)",
    }
