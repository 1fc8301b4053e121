"""What the model reads: the text block of execute_python through a real MCP client over stdio, on
every backend (the conformance suite's servers), with every fact of the result and lines as lines."""

from __future__ import annotations

import json

import pytest
from mcp import Client
from mcp.types import TextContent

from tests.helpers import in_memory

pytestmark = pytest.mark.anyio


async def read(client: Client, code: str, **arguments: object) -> tuple[str, dict[str, object]]:
    """The text block the model reads, and the structured result programs read."""
    response = await client.call_tool("execute_python", {"code": code, **arguments})
    assert not response.is_error, response.content
    first = response.content[0]
    assert isinstance(first, TextContent) and response.structured_content is not None
    return first.text, response.structured_content


async def test_a_value_reads_as_a_repl_shows_it(client: Client) -> None:
    text, result = await read(client, "x = 6 * 7; x")
    assert text == "Out: 42"
    assert result["result"] == "42" and result["stdout"] == "", "the structured content stays whole"


async def test_printed_lines_stay_lines_and_stderr_is_marked(client: Client) -> None:
    code = "import sys\nfor i in range(5):\n    print(f'row {i}')\nprint('careful', file=sys.stderr)\n[1, 2]"
    text, _ = await read(client, code)
    assert text.splitlines() == [
        "row 0",
        "row 1",
        "row 2",
        "row 3",
        "row 4",
        "[stderr]",
        "careful",
        "Out: [1, 2]",
    ]
    assert "\\n" not in text


async def test_nothing_printed_or_returned_says_so_briefly(client: Client) -> None:
    text, _ = await read(client, "y = 1")
    assert text == "(no output)"


async def test_an_error_reads_as_its_frames_and_exception(client: Client) -> None:
    text, result = await read(
        client, "def mean(xs):\n    return sum(xs) / len(xs)\nprint('before')\nmean([])"
    )
    lines = text.splitlines()
    assert lines[0] == "before"
    assert "    return sum(xs) / len(xs)" in lines and "    mean([])" in lines, text
    assert lines[-1] == "ZeroDivisionError: division by zero"
    assert "Traceback (most recent call last)" not in text and "~" not in text and "^" not in text
    assert "Traceback (most recent call last)" in str(result["error"]), "the field keeps it whole"


async def test_a_timeout_says_what_happened_to_the_session(client: Client) -> None:
    # Short sleeps: the in-process backend interrupts between them, never inside one.
    code = "import time\nprint('started')\nwhile True:\n    time.sleep(0.05)"
    text, _ = await read(client, code, timeout=1, session_id="slow")
    assert text.splitlines() == [
        "started",
        "Timeout: Execution timed out after 1 s and was interrupted; the session's variables are kept.",
    ], "the interrupt of a sleep leaves no traceback of the sandbox's own on stderr"


async def test_a_cut_output_shows_whole_lines_around_one_marker_with_its_link(client: Client) -> None:
    text, result = await read(client, "for n in range(60_000): print(f'line {n}')", session_id="long")
    link = result["stdout_uri"]
    assert isinstance(link, str) and link.startswith("sandbox://kept/")
    lines = text.splitlines()
    markers = [line for line in lines if "not shown" in line]
    total = sum(len(f"line {n}\n") for n in range(60_000))
    assert len(markers) == 1 and link in markers[0] and f"all {total:,}" in markers[0], markers
    assert lines[0] == "line 0" and lines[-1] == "line 59999"
    assert all(line.startswith("line ") and line[5:].isdigit() for line in lines if line not in markers)
    assert text.count(link) == 1, "the note that names the link is not said twice"


async def test_files_and_notes_get_a_line_each(client: Client, backend: str) -> None:
    text, result = await read(client, "open('output/report.csv', 'w').write('a,b\\n1,2\\n')\nprint('saved')")
    assert text.splitlines() == ["saved", "[file output/report.csv: 8 bytes, text/csv]"], result
    text, _ = await read(client, "import surely_not_a_module_here")
    assert text.splitlines()[-1] == "ModuleNotFoundError: No module named 'surely_not_a_module_here'"


async def test_a_dataframe_reads_as_a_compact_table_with_its_shape(client: Client, backend: str) -> None:
    if backend == "pyodide":
        pytest.skip("pandas cannot be loaded into Pyodide here: its package CDN is unreachable")
    code = "import pandas as pd\npd.DataFrame({'n': range(1000), 'sq': [i * i for i in range(1000)]})"
    text, _ = await read(client, code)
    lines = text.splitlines()
    assert lines[0] == "Out:" and lines[1].split() == ["n", "sq"]
    assert lines[-1] == "[1000 rows x 2 columns]"
    assert lines[2].split() == ["0", "0", "0"] and "999  999  998001" in text, text
    assert len(lines) < 20, "head and tail rows only"


async def test_json_text_is_a_setting_for_clients_that_want_every_field() -> None:
    async with in_memory(backend="inprocess", result_text="json") as client:
        text, result = await read(client, "print('hi')\n6 * 7")
    assert json.loads(text) == result
