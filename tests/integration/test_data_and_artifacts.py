"""Data in and artifacts out, through a real MCP client and server, on every backend: the
read-only data folder, output files, figures, offline packages, progress, and the record."""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.types import EmbeddedResource, ImageContent

from mcp_sandbox.packages import cached_pyodide_lock
from mcp_sandbox.settings import Settings
from tests.helpers import call, needs_pyodide, server_params
from tests.wheels import build_wheel

pytestmark = pytest.mark.anyio

CSV = "city,temp\nOslo,3\nRome,17\n"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Folders:
    data: Path
    output: Path
    packages: Path
    audit_log: Path
    saved_code: Path


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Folders:
    root = tmp_path_factory.mktemp(f"artifacts-{backend}")
    made = Folders(root / "data", root / "output", root / "packages", root / "audit.jsonl", root / "code")
    for folder in (made.data, made.output, made.packages):
        folder.mkdir()
    (made.data / "weather.csv").write_text(CSV)
    build_wheel(made.packages, "sandboxdemo", "VALUE = 42\ndef hello():\n    return 'hello from a wheel'\n")
    return made


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str, folders: Folders) -> AsyncIterator[Client]:
    params = server_params(
        MCP_SANDBOX_BACKEND=backend,
        MCP_SANDBOX_DATA_DIR=str(folders.data),
        MCP_SANDBOX_OUTPUT_DIR=str(folders.output),
        MCP_SANDBOX_PACKAGES_DIR=str(folders.packages),
        MCP_SANDBOX_AUDIT_LOG=str(folders.audit_log),
        MCP_SANDBOX_SAVE_CODE=str(folders.saved_code),
        MCP_SANDBOX_MAX_OUTPUT_FILES="3",
    )
    async with Client(params) as connected:
        yield connected


async def call_raw(client: Client, code: str, **arguments: Any) -> tuple[dict[str, Any], list[Any]]:
    response = await client.call_tool("execute_python", {"code": code, **arguments})
    assert not response.is_error and response.structured_content is not None, response.content
    return response.structured_content, response.content


async def test_data_folder_is_readable(client: Client) -> None:
    result = await call(client, "import csv\nlist(csv.DictReader(open('data/weather.csv')))[1]['temp']")
    assert result["result"] == "'17'", result


async def test_pandas_reads_the_data_folder(client: Client, backend: str) -> None:
    if backend == "pyodide":
        pytest.skip("pandas cannot be fetched into Pyodide here (no CDN); the CPython backends have it")
    result = await call(client, "import pandas as pd\nint(pd.read_csv('data/weather.csv')['temp'].sum())")
    assert result["result"] == "20", result


@pytest.mark.parametrize(
    "code",
    [
        "open('data/weather.csv', 'w').write('overwritten')",
        "open('data/new.csv', 'w').write('x')",
        "import os\nos.remove('data/weather.csv')",
    ],
)
async def test_data_folder_cannot_be_written(client: Client, folders: Folders, code: str) -> None:
    result = await call(client, code)
    assert result["success"] is False and result["error_type"] in {"PermissionError", "OSError"}, result
    assert (folders.data / "weather.csv").read_text() == CSV
    assert not (folders.data / "new.csv").exists()


async def test_new_data_is_seen_without_a_restart(client: Client, folders: Folders) -> None:
    await call(client, "1", session_id="data-refresh")
    (folders.data / "later.txt").write_text("arrived later")
    result = await call(client, "open('data/later.txt').read()", session_id="data-refresh")
    assert result["result"] == "'arrived later'", result


async def test_output_files_come_back(client: Client, folders: Folders) -> None:
    code = (
        "import os\n"
        "os.makedirs('output/tables', exist_ok=True)\n"
        "open('output/summary.txt', 'w').write('mean temp: 10')\n"
        "open('output/tables/rows.csv', 'w').write('a,b\\n1,2\\n')\n"
        f"open('output/pixel.png', 'wb').write({PNG_SIGNATURE!r} + bytes(20))\n"
    )
    result, content = await call_raw(client, code, session_id="writer")
    assert result["success"] is True, result
    files = {file["name"]: file for file in result["files"]}
    assert set(files) == {"summary.txt", "tables/rows.csv", "pixel.png"}
    assert files["summary.txt"]["size"] == 13 and files["summary.txt"]["mime_type"] == "text/plain"
    resources = {
        block.resource.uri: block.resource.text for block in content if isinstance(block, EmbeddedResource)
    }
    assert resources["sandbox://output/summary.txt"] == "mean temp: 10"
    images = [block for block in content if isinstance(block, ImageContent)]
    assert [base64.b64decode(image.data)[:8] for image in images] == [PNG_SIGNATURE]
    copy = folders.output / "writer" / "tables" / "rows.csv"
    assert copy.read_text() == "a,b\n1,2\n" and files["tables/rows.csv"]["saved_to"] == str(copy)
    again = await call(client, "'nothing new'", session_id="writer")
    assert again["files"] == [], "only files written by this call come back"


async def test_output_file_cap_says_what_was_left_out(client: Client) -> None:
    code = "for i in range(5):\n    open(f'output/part{i}.txt', 'w').write(str(i))"
    result = await call(client, code)
    assert len(result["files"]) == 3
    assert any("2 files" in note and "left out" in note for note in result["notes"]), result["notes"]


async def test_figures_come_back_as_images(client: Client, backend: str) -> None:
    if backend == "pyodide":
        pytest.skip("matplotlib cannot be fetched into Pyodide here (no CDN); the CPython backends have it")
    code = (
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [3, 1, 2])\n"
        "plt.show()\n"
        "plt.figure()\n"
        "plt.bar(['a', 'b'], [1, 2])\n"
        "'plotted'"
    )
    result, content = await call_raw(client, code)
    assert result["figures"] == 2 and result["stderr"] == "", result
    images = [base64.b64decode(block.data) for block in content if isinstance(block, ImageContent)]
    assert len(images) == 2 and all(image.startswith(PNG_SIGNATURE) for image in images)
    after = await call(client, "import matplotlib.pyplot as plt\nlen(plt.get_fignums())")
    assert after["result"] == "0"


async def test_a_wheel_in_the_packages_folder_imports_offline(client: Client, backend: str) -> None:
    needs_pyodide(backend, "the CPython backends import only what the host has installed")
    result = await call(client, "import sandboxdemo\nsandboxdemo.VALUE, sandboxdemo.hello()")
    assert result["result"] == "(42, 'hello from a wheel')", result


async def test_a_pyodide_package_in_the_folder_imports_without_a_note(
    client: Client, backend: str, folders: Folders, tmp_path: Path
) -> None:
    needs_pyodide(backend, "the CPython backends import only what the host has installed")
    # Under the file name Pyodide's lock file gives (the server has fetched Pyodide by now), as a
    # fetch leaves it; Pyodide loads it by its lock file, and the wheel loader must not load it again.
    six = cached_pyodide_lock(Settings().cache_dir).get("six")
    assert six is not None, "six is in Pyodide's lock file"
    built = build_wheel(tmp_path, "six", "MARKER = 'built by the tests'", version="1.17.0")
    built.replace(folders.packages / six.file_name)
    result = await call(client, "import six\nsix.MARKER")
    assert result["result"] == "'built by the tests'" and result["notes"] == [], result


async def test_a_missing_pyodide_package_says_how_to_get_it(client: Client, backend: str) -> None:
    needs_pyodide(backend, "the CPython backends import only what the host has installed")
    result = await call(client, "import numpy")
    assert result["error_type"] == "ModuleNotFoundError"
    # One note, the host's, with the fix (the default packages are off in tests): not Pyodide's own
    # complaint about each file it could not find.
    [note] = result["notes"]
    assert note.startswith("numpy is in the Pyodide distribution but not in the packages folder"), note
    assert "`mcp-sandbox fetch --packages numpy`" in note and "subprocess backend" in note


async def test_a_package_the_host_lacks_says_how_to_get_it(client: Client, backend: str) -> None:
    if backend == "pyodide":
        pytest.skip("CPython backends only: they import what the server's Python has")
    if importlib.util.find_spec("bs4") is not None:
        pytest.skip("this host has beautifulsoup4 installed")
    if cached_pyodide_lock(Settings().cache_dir).get("beautifulsoup4") is None:
        pytest.skip("Pyodide's lock file is not in the cache (a pyodide test fetches it)")
    result = await call(client, "from bs4 import BeautifulSoup")
    assert result["error_type"] == "ModuleNotFoundError"
    [note] = result["notes"]
    assert note.startswith("beautifulsoup4 is not installed in the server's Python"), note
    assert "-m pip install beautifulsoup4" in note and "pyodide backend" in note


async def test_a_long_execution_reports_progress(client: Client) -> None:
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    code = "import time\nfor step in range(6):\n    print('step', step)\n    time.sleep(0.5)"
    response = await client.call_tool("execute_python", {"code": code}, progress_callback=on_progress)
    assert not response.is_error
    assert len(messages) >= 2, messages
    # Before its program runs, a call says what it waits for (a loaded machine starts sandboxes late).
    assert all(message.startswith(("running for ", "waiting for a sandbox")) for message in messages), (
        messages
    )
    assert any("last output: step" in message for message in messages), messages


async def test_the_audit_log_has_one_line_per_call(client: Client, folders: Folders, backend: str) -> None:
    before = folders.audit_log.read_text().splitlines() if folders.audit_log.exists() else []
    codes = [f"'call {i}'" for i in range(6)]
    async with anyio.create_task_group() as group:
        for i, code in enumerate(codes):
            group.start_soon(functools.partial(call, client, code, session_id=f"audit-{i % 3}"))
    lines = folders.audit_log.read_text().splitlines()[len(before) :]
    records = [json.loads(line) for line in lines]
    assert sorted(record["code"] for record in records) == sorted(codes)
    for record in records:
        assert record["backend"] == backend and record["success"] is True and record["status"] == "ok"
        assert len(record["sha256"]) == 64 and isinstance(record["duration_ms"], int)
        assert record["session_id"].startswith("audit-")
    assert stat.S_IMODE(os.stat(folders.audit_log).st_mode) == 0o600


async def test_each_program_is_saved_with_a_replay_header(client: Client, folders: Folders) -> None:
    await call(client, "print('saved ' + 'program')", session_id="keeper")
    saved = [
        path for path in folders.saved_code.glob("*-keeper-*.py") if "saved ' + 'program" in path.read_text()
    ]
    assert len(saved) == 1
    text = saved[0].read_text()
    assert text.startswith("# mcp-sandbox: executed") and "# Replay:" in text and "# outcome: ok, " in text
    assert stat.S_IMODE(saved[0].stat().st_mode) == 0o600
