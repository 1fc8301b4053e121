"""The default packages, end to end on the pyodide backend: the real server process fetches them
in the background at start from a package index in the Pyodide CDN's layout (served here on
127.0.0.1), checks each against its sha256, and sandboxes already running import them once they
arrive; a later start fetches nothing; a tampered file is refused; an unreachable index is one
log line and an import note, each naming the fix. Through the real MCP client, with real Deno
and Pyodide."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import stdio_client

from tests.helpers import call, server_params
from tests.package_index import PackageIndex, closed_port_url, serve_index

pytestmark = pytest.mark.anyio

#: Seconds a test waits for the background fetch to land (it takes well under one here).
FETCH_LIMIT = 60.0
DEMO = "import sbxdemo\nsbxdemo.ANSWER"


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    folder = tmp_path / "index"
    folder.mkdir()
    with serve_index(folder) as served:
        served.add_wheel("sbxdemo", "ANSWER = 42")
        served.add_wheel("sbxtampered", "ANSWER = 'tampered'", tampered=True)
        yield served


@asynccontextmanager
async def pyodide_server(log: Path, packages: Path, index_url: str, default: str) -> AsyncIterator[Client]:
    """The real server on pyodide with a fresh packages folder; its stderr (the log) goes to `log`."""
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide",
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_PACKAGES_DIR=str(packages),
        MCP_SANDBOX_PACKAGE_INDEX_URL=index_url,
        MCP_SANDBOX_DEFAULT_PACKAGES=default,
    )
    with log.open("a") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            yield client


async def poll(client: Client, code: str, done: Any, **arguments: Any) -> list[dict[str, Any]]:
    """Call `code` until `done(result)`, at most FETCH_LIMIT seconds; every result, in order."""
    results: list[dict[str, Any]] = []
    deadline = time.monotonic() + FETCH_LIMIT
    while time.monotonic() < deadline:
        results.append(await call(client, code, **arguments))
        if done(results[-1]):
            return results
        await anyio.sleep(0.2)
    raise AssertionError(f"not done within {FETCH_LIMIT:g} s: {results[-1]}")


async def description(client: Client) -> str:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    return tools["execute_python"].description or ""


def package_lines(log: Path) -> list[str]:
    """The log's lines from the package fetcher."""
    return [line for line in log.read_text().splitlines() if "mcp_sandbox.packages" in line]


async def test_the_default_set_arrives_while_sandboxes_run_and_a_later_start_fetches_nothing(
    tmp_path: Path, index: PackageIndex
) -> None:
    packages, log = tmp_path / "packages", tmp_path / "server.log"
    index.release.clear()  # the package file is held back: the server is caught fetching
    async with pyodide_server(log, packages, index.url, "sbxdemo") as client:
        assert "Imports: the standard library, sbxdemo." in await description(client)
        early = await call(client, DEMO, session_id="s")
        assert early["error_type"] == "ModuleNotFoundError", early
        assert any("sbxdemo is being fetched" in note and "again" in note for note in early["notes"]), early
        index.release.set()
        # The same session, whose sandbox started before the file arrived, imports it now.
        results = await poll(client, DEMO, lambda result: result["success"], session_id="s")
        assert results[-1]["result"] == "42", results[-1]
        # Until then each failed import said why (it may land between the sandbox's look and the note's).
        waiting = re.compile(
            r"sbxdemo (is being fetched|is in the packages folder now).*run the import again"
        )
        assert all(waiting.search(" ".join(result["notes"])) for result in results[:-1]), results
    wheel = packages / "sbxdemo-1.0-py3-none-any.whl"
    assert wheel.is_file() and wheel.read_bytes() == (index.folder / wheel.name).read_bytes()
    assert index.requests == ["/pyodide/pyodide-lock.json", "/pyodide/sbxdemo-1.0-py3-none-any.whl"]

    index.requests.clear()
    async with pyodide_server(log, packages, index.url, "sbxdemo") as client:
        again = await call(client, DEMO)
        assert again["result"] == "42" and again["notes"] == [], again
    assert index.requests == [], "verified files already there: the second start fetched nothing"
    assert not any("WARNING" in line for line in package_lines(log)), log.read_text()


async def test_a_file_that_does_not_match_the_lock_is_refused(tmp_path: Path, index: PackageIndex) -> None:
    packages, log = tmp_path / "packages", tmp_path / "server.log"
    async with pyodide_server(log, packages, index.url, "sbxdemo,sbxtampered") as client:
        results = await poll(
            client,
            "import sbxtampered",
            lambda result: any("could not be fetched" in note for note in result["notes"]),
        )
        refused = results[-1]
        assert refused["error_type"] == "ModuleNotFoundError", refused
        note = next(note for note in refused["notes"] if "could not be fetched" in note)
        assert "does not match the sha256" in note and "`mcp-sandbox fetch --packages sbxtampered`" in note
        fine = await poll(client, DEMO, lambda result: result["success"])
        assert fine[-1]["result"] == "42"
    assert sorted(path.name for path in packages.iterdir()) == [
        ".index-lock.json",
        "sbxdemo-1.0-py3-none-any.whl",
    ]
    refusals = [line for line in package_lines(log) if "refused" in line]
    assert len(refusals) == 1 and "package sbxtampered refused" in refusals[0], log.read_text()
    assert "does not match the sha256 in the lock file" in refusals[0] and "not kept" in refusals[0]


async def test_an_unreachable_index_is_one_log_line_and_an_import_note(tmp_path: Path) -> None:
    packages, log = tmp_path / "packages", tmp_path / "server.log"
    # `six` is in Pyodide's own lock file: its entry, and the fix, come from there.
    async with pyodide_server(log, packages, closed_port_url(), "six") as client:
        results = await poll(
            client,
            "import six",
            lambda result: any("could not be fetched" in note for note in result["notes"]),
        )
        note = next(note for note in results[-1]["notes"] if "could not be fetched" in note)
        assert results[-1]["error_type"] == "ModuleNotFoundError"
        for fix in (
            "`mcp-sandbox fetch --packages six`",
            "MCP_SANDBOX_PACKAGE_INDEX_URL",
            "subprocess backend",
        ):
            assert fix in note, note
        other = await call(client, "import nonesuch_module")
        assert other["error_type"] == "ModuleNotFoundError" and other["notes"] == [], "no lock knows it"
        assert "Imports: the standard library only." in await description(client), "six failed"
    lines = package_lines(log)
    assert len(lines) == 1 and " WARNING " in lines[0], log.read_text()
    assert re.search(
        r"packages six are not in .* could not be fetched: the package index .* could not be reached",
        lines[0],
    )
    for fix in ("`mcp-sandbox fetch`", "MCP_SANDBOX_PACKAGE_INDEX_URL", "subprocess backend"):
        assert fix in lines[0], lines[0]
    assert list(packages.glob("*.whl")) == []
