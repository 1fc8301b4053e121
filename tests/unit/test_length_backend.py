"""A backend added in the test suite only, by one registry entry, serves execute_python through
the real MCP server: nothing else in mcp_sandbox names it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from mcp_sandbox.backends.registry import BACKENDS, backend_names, register
from mcp_sandbox.settings import Settings
from tests.helpers import call, in_memory
from tests.unit.length_backend import ENTRY


@pytest.fixture
def length_backend() -> Iterator[None]:
    register(ENTRY)
    yield
    del BACKENDS[ENTRY.name]


@pytest.mark.anyio
@pytest.mark.usefixtures("length_backend")
async def test_a_registered_backend_runs_execute_python() -> None:
    code = "print('never run')"
    async with in_memory(backend="length") as client:
        result = await call(client, code)
        tools = await client.list_tools()
    assert result["result"] == str(len(code)), result
    assert result["backend"] == "length"
    description = next(tool for tool in tools.tools if tool.name == "execute_python").description or ""
    assert "every program's result is its length" in description


def test_a_backend_the_table_lacks_is_refused_naming_every_one() -> None:
    assert "length" not in backend_names()
    with pytest.raises(ValidationError, match="'length' is not a backend; use one of auto, pyodide, "):
        Settings(backend="length")


def test_a_name_is_registered_once() -> None:
    with pytest.raises(ValueError, match="exists already"):
        register(BACKENDS["pyodide"])
