"""The red team's servers: one per backend for the whole session, shared by every attack table,
with the host folders of one `World`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from mcp import Client

from tests.helpers import missing_tier, server_params
from tests.security.harness import BACKENDS, SERVER_SETTINGS, World, make_world, server_settings, tier_missing


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    return make_world(tmp_path_factory.mktemp("red-team"))


@pytest.fixture(scope="session")
async def client(anyio_backend: str, backend: str, world: World) -> AsyncIterator[Client]:
    if (missing := tier_missing(backend)) is not None:
        missing_tier(SERVER_SETTINGS[backend]["MCP_SANDBOX_ISOLATION"], missing)
    async with Client(server_params(**server_settings(backend, world))) as connected:
        yield connected
