"""The notebook view (an MCP App): execute_python points hosts at its page, and a client that
shows it gets the run's tables as data in `_meta`, on every backend; the model's text is the same
for every client, and a client without Apps gets no `_meta` data."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client
from mcp.client import advertise
from mcp.server.apps import APP_MIME_TYPE, EXTENSION_ID

from mcp_sandbox.app import App
from mcp_sandbox.protocol import MAX_TABLE_ROWS, MAX_TABLES
from mcp_sandbox.server import build_server
from mcp_sandbox.settings import Settings
from mcp_sandbox.view import TABLES_KEY, VIEW_URI, view_html

pytestmark = pytest.mark.anyio

APPS = advertise(EXTENSION_ID, {"mimeTypes": [APP_MIME_TYPE]})

SHOWN = """import pandas as pd
frame = pd.DataFrame({"n": range(250), "name": [f"row {i}" for i in range(250)]})
frame.loc[3, "n"] = None
print("before")
display(frame, "a plain value")
print("after")
frame.n.head(3)
"""


@pytest.fixture(scope="module", params=["subprocess", "inprocess"])
async def clients(request: pytest.FixtureRequest, anyio_backend: str) -> AsyncIterator[tuple[Client, Client]]:
    settings = Settings(backend=request.param, pool_size=1, default_packages="", interrupt_grace=1)
    async with App(settings) as app:
        server = build_server(app)
        async with Client(server, extensions=[APPS]) as viewer, Client(server) as plain:
            yield viewer, plain


async def run(client: Client, code: str) -> Any:
    response = await client.call_tool("execute_python", {"code": code})
    assert not response.is_error, response.content
    return response


def test_the_page_is_built() -> None:
    html = view_html()
    assert html is not None and "<html" in html.lower(), "run: node cell/build.mjs"


async def test_the_tool_points_at_the_page_and_the_page_is_served(clients: tuple[Client, Client]) -> None:
    viewer, _ = clients
    tools = {tool.name: tool for tool in (await viewer.list_tools()).tools}
    assert tools["execute_python"].meta == {"ui": {"resourceUri": VIEW_URI}}
    page = (await viewer.read_resource(VIEW_URI)).contents[0]
    assert page.mime_type == APP_MIME_TYPE and page.text == view_html()  # type: ignore[union-attr]


async def test_tables_reach_the_view_as_data_in_order(clients: tuple[Client, Client]) -> None:
    viewer, _ = clients
    response = await run(viewer, SHOWN)
    shown, value = response.meta[TABLES_KEY]
    assert (shown["kind"], shown["source"], shown["shape"]) == ("DataFrame", "display", [250, 2])
    assert shown["columns"] == ["n", "name"] and len(shown["rows"]) == MAX_TABLE_ROWS
    # Head and tail rows, numbers as numbers and a missing value as null.
    assert shown["positions"][:2] == [0, 1] and shown["positions"][-1] == 249
    assert shown["rows"][0] == [0, "row 0"] and shown["rows"][3] == [None, "row 3"]
    stdout = response.structured_content["stdout"]
    start, end = shown["printed"]
    # display() shows what a notebook's does: a value's repr() (a string's with its quotes).
    assert stdout[:start] == "before\n" and stdout[end:] == "'a plain value'\nafter\n"
    assert "[250 rows x 2 columns]" in stdout[start:end], "display() prints what the model reads"
    assert (value["kind"], value["source"], value["rows"], value["printed"]) == (
        "Series",
        "value",
        [[0.0], [1.0], [2.0]],
        None,
    )


async def test_the_model_reads_the_same_text_and_a_plain_client_gets_no_view_data(
    clients: tuple[Client, Client],
) -> None:
    viewer, plain = clients
    seen, plain_seen = await run(viewer, SHOWN), await run(plain, SHOWN)
    assert seen.content[0].text == plain_seen.content[0].text
    assert "<" not in seen.content[0].text, "the model's text carries no HTML"
    assert TABLES_KEY not in (plain_seen.meta or {})


async def test_a_program_showing_many_tables_is_capped_and_told(clients: tuple[Client, Client]) -> None:
    viewer, _ = clients
    code = f"import pandas as pd\nfor i in range({MAX_TABLES + 3}):\n    display(pd.Series([i]))"
    response = await run(viewer, code)
    assert len(response.meta[TABLES_KEY]) == MAX_TABLES
    assert "3 tables left out of the notebook view" in response.content[0].text


async def test_a_cut_stdout_keeps_its_tables_without_spans(clients: tuple[Client, Client]) -> None:
    viewer, _ = clients
    code = "import pandas as pd\ndisplay(pd.DataFrame({'a': [1]}))\nprint('x' * 100_000)"
    response = await run(viewer, code)
    (table,) = response.meta[TABLES_KEY]
    assert response.structured_content["truncated"] and table["printed"] is None


async def test_a_written_file_can_be_read_back_through_its_link(clients: tuple[Client, Client]) -> None:
    viewer, _ = clients
    code = "import os\nos.makedirs('output', exist_ok=True)\n"
    code += "open('output/table.bin', 'wb').write(bytes(range(256)))"
    response = await run(viewer, code)
    (file,) = response.structured_content["files"]
    links = [block for block in response.content if block.type == "resource_link"]
    assert [link.uri for link in links] == [file["uri"]] and links[0].name == "table.bin"
    read = (await viewer.read_resource(file["uri"])).contents[0]
    assert base64.b64decode(read.blob) == bytes(range(256))  # type: ignore[union-attr]
