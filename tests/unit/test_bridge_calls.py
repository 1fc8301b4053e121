"""What the bridge knows of calls before they are made: tools.describe's answer, and the check of
a program's tool calls against the catalog before it runs."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from mcp_sandbox.backends.base import ToolCalls
from mcp_sandbox.bridge.catalog import ToolSpec, tool_spec
from mcp_sandbox.bridge.check import WrongCall, wrong_calls_message
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


def wrong(code: str, specs: list[ToolSpec] | None = None) -> list[WrongCall]:
    return bridge_of(specs if specs is not None else many_specs(100)).wrong_calls(code)


SIGNATURE = (
    "tools.many.jira_create_item(query: str, limit: int = None, cursor: str = None, fields: list = None, "
    "dry_run: bool = None)"
)


def test_a_misspelt_keyword_is_named_with_the_closest_and_the_signature() -> None:
    (call,) = wrong("print('first')\nresult = tools.many.jira_create_item(qeury='x', limit=3)")
    assert call.line == 2 and call.call == "tools.many.jira_create_item(...)"
    assert call.problem == (
        "'qeury' is not one of its arguments; did you mean 'query'?; 'query' (str) is required"
    )
    assert call.signature == SIGNATURE
    (twin,) = wrong("await tools.many.jira_create_item_async('x', limt=3)")  # positional `query`
    assert twin.problem == "'limt' is not one of its arguments; did you mean 'limit'?"


def test_a_server_or_tool_that_does_not_exist_is_named_with_the_closest() -> None:
    server, tool, twin = wrong(
        "tools.mnay.jira_get_item(query='x')\n"
        "tools.many.jira_craete_item(query='x')\n"
        "import asyncio\n"
        "asyncio.run(asyncio.gather(*[tools.many.jira_craete_item_async(query=q) for q in 'ab']))"
    )
    assert server.problem == "there is no upstream MCP server 'mnay'; did you mean 'many'?"
    assert server.signature is not None and server.signature.startswith("tools.many.jira_get_item(query: str")
    assert tool.problem.startswith(
        "the many server has no tool 'jira_craete_item'; did you mean 'jira_create_item'"
    )
    assert tool.signature == SIGNATURE
    assert (twin.line, twin.problem.split(";")[1]) == (
        4,
        " did you mean 'jira_create_item_async' or 'jira_get_item_async' or 'jira_update_item_async'?",
    )


@pytest.mark.parametrize(
    "code",
    [
        "tools.many.jira_create_item(query='x', limit=3, dry_run=True)",  # right
        "tools.many.jira_create_item('x', 3)",  # positional
        "arguments = {'qeury': 'x'}\ntools.many.jira_create_item(**arguments)",  # not literal
        "getattr(tools.many, 'jira_craete_item')(query='x')",  # a computed name
        "create = tools.many.jira_create_item\ncreate(qeury='x')",  # not the tools.<server>.<tool> form
        "tools = Mock()\ntools.many.jira_create_item(qeury='x')",  # `tools` is not the bridge's
        "def run(tools):\n    tools.mnay.x(a=1)",
        "from unittest import mock as tools\ntools.many.jira_create_item(qeury='x')",
        "for tools in [mock]:\n    tools.many.x(a=1)",
        "tools.many.jira_create_item = print\ntools.many.jira_create_item(qeury='x')",
        "globals()['tools'] = mock\ntools.many.x(a=1)",
        "exec('tools = mock')\ntools.many.x(a=1)",
        "tools.many.jira_create_item(qeury='x'",  # does not parse: the sandbox says so
        "tools.slow.anything(a=1)",  # a server whose tools are not listed yet
        "client.many.jira_create_item(qeury='x')",  # not `tools`
    ],
)
def test_what_cannot_be_known_statically_is_not_refused(code: str) -> None:
    slow = tool_spec("slow", "slow", "placeholder", "placeholder", None, {})
    bridge = bridge_of([*many_specs(100), slow])
    bridge.connections["slow"].specs = []  # connecting: nothing listed yet
    bridge._changed()
    assert bridge.wrong_calls(code) == [], code


def test_a_tool_whose_schema_takes_other_properties_takes_any_keyword() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": True}
    open_tool = tool_spec("crm", "crm", "put", "put", None, schema)
    closed_tool = tool_spec("crm", "crm", "get", "get", None, {**schema, "additionalProperties": False})
    found = wrong(
        "tools.crm.put(name='a', colour='red')\ntools.crm.get(name='a', colour='red')",
        [open_tool, closed_tool],
    )
    assert [(call.line, call.problem) for call in found] == [
        (2, "'colour' is not one of its arguments; it has: name")
    ]


def test_the_refusal_says_nothing_ran_and_names_at_most_ten() -> None:
    code = "\n".join(f"tools.many.jira_get_item(query='x', page{n}=1)" for n in range(12))
    message = wrong_calls_message(wrong(code))
    lines = message.splitlines()
    assert lines[0] == (
        "Nothing ran: checked before running, 12 tool calls name a server, tool or argument "
        "that does not exist."
    )
    assert lines[1].startswith("line 1: tools.many.jira_get_item(...): 'page0' is not one of its arguments")
    assert lines[2].startswith("    signature: tools.many.jira_get_item(query: str")
    assert lines[-1] == "... and 2 more" and len(lines) == 1 + 10 * 2 + 1
