"""The conformance suite's server: one real server process per backend, reached through the real MCP
client, with the real Deno runner."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from mcp import Client

from tests.helpers import DEFAULT_JIT, server_params


@pytest.fixture(scope="module", params=["pyodide", "subprocess", "inprocess"])
def backend(request: pytest.FixtureRequest) -> str:
    """The conformance suite runs once per backend."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str) -> AsyncIterator[Client]:
    async with Client(server_params(MCP_SANDBOX_BACKEND=backend, **DEFAULT_JIT)) as connected:
        yield connected
