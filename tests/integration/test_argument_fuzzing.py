"""Property: any JSON value in any argument of any tool gets a result or a clean MCP error (a tool
that is not there: the protocol error -32602), and the server keeps serving. Runs against the real
server process over stdio."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client, MCPError
from mcp.types import INVALID_PARAMS

from tests.helpers import server_params

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=200),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=20), children, max_size=5)
    ),
    max_leaves=12,
)
argument_names = st.sampled_from(["code", "timeout", "session_id", "query", "limit"]) | st.text(max_size=15)
TOOLS = ["execute_python", "reset_session"]
tool_names = st.sampled_from([*TOOLS, "search_tools"]) | st.text(max_size=20)


@pytest.fixture(scope="module")
def connected() -> Iterator[tuple[anyio.from_thread.BlockingPortal, Client]]:
    # Short maximum timeout: a fuzzed program that happens to loop must not stall the run.
    params = server_params(
        MCP_SANDBOX_BACKEND="subprocess", MCP_SANDBOX_MAX_TIMEOUT="3", MCP_SANDBOX_POOL_SIZE="3"
    )
    with anyio.from_thread.start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(Client(params)) as client:
            yield portal, client


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=tool_names, arguments=st.dictionaries(argument_names, json_values, max_size=4))
def test_any_arguments_get_a_result_or_a_clean_error(
    connected: tuple[anyio.from_thread.BlockingPortal, Client], tool: str, arguments: dict[str, Any]
) -> None:
    portal, client = connected
    try:
        response = portal.call(client.call_tool, tool, arguments)
    except MCPError as error:
        # Only a tool that is not there is a protocol error (-32602, as the spec says).
        assert tool not in TOOLS and error.error.code == INVALID_PARAMS, error
        return
    if response.is_error:
        assert response.content and response.content[0].type == "text" and response.content[0].text
    else:
        assert response.structured_content is not None


def test_the_server_still_serves_after_the_fuzzing(
    connected: tuple[anyio.from_thread.BlockingPortal, Client],
) -> None:
    portal, client = connected
    response = portal.call(client.call_tool, "execute_python", {"code": "'alive'"})
    assert response.structured_content is not None and response.structured_content["result"] == "'alive'"
