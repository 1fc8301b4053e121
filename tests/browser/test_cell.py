"""The notebook-cell app (cell/, built into mcp_sandbox/ui/cell.html) in a real browser, hosted
through the official AppBridge, showing real results of a real server over a real MCP client
(harness.py). Skips, saying why, without Chromium, node, the npm packages or Playwright."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from mcp import Client
from mcp.client import advertise

from tests.browser.harness import (
    APP_MIME,
    CHROMIUM,
    UI_EXTENSION,
    Browser,
    Cell,
    app_resource,
    build_host,
    missing_tools,
)
from tests.helpers import TEST_ENV, server_params

pytestmark = [pytest.mark.anyio, pytest.mark.skipif(missing_tools() is not None, reason=str(missing_tools()))]

PROGRAM = """\
import sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

print("hello from the cell \N{SNAKE}")
print("second line")
print("a warning", file=sys.stderr)
frame = pd.DataFrame({"name": ["carol", "alice", "bob"], "score": [2.5, 10.0, 7.25]})
display(frame)
print("after the table")
plt.plot([1, 2, 3], [1, 4, 9])
plt.title("squares")
import os
os.makedirs("output", exist_ok=True)
with open("output/report.csv", "w") as out:
    out.write("a,b\\n1,2\\n")
with open("output/big.txt", "w") as out:
    out.write("big file line\\n" * 6000)
frame.sort_values("score")
"""

HOSTILE = """
print("<script>window.__pwned = 'stdout script'</script>")
print('<img src=x onerror="window.__pwned = \\'stdout img\\'">')

class Sneaky:
    def _repr_html_(self):
        return "<script>window.__pwned = 'repr_html'</script><b>bold</b>"
    def __repr__(self):
        return "<img src=y onerror=\\"window.__pwned = 'repr'\\">"

Sneaky()
"""


@pytest.fixture(scope="module", params=["subprocess", "inprocess", "pyodide"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str) -> AsyncIterator[Client]:
    # The client announces MCP Apps, so the server sends what only the app reads (_meta tables).
    apps = advertise(UI_EXTENSION, {"mimeTypes": [APP_MIME]})
    # The CPython backends have pandas (a dependency of the server); Pyodide only from a package index.
    if backend == "pyodide" and not TEST_ENV["MCP_SANDBOX_DEFAULT_PACKAGES"]:
        pytest.skip(
            "pyodide: no pandas there (test servers fetch no Pyodide packages: MCP_SANDBOX_DEFAULT_PACKAGES "
            "is empty in tests.helpers.TEST_ENV), so there is no DataFrame to show"
        )
    no_pandas = None
    async with Client(server_params(MCP_SANDBOX_BACKEND=backend), extensions=[apps]) as connected:
        if backend == "pyodide":
            answer = await connected.call_tool("execute_python", {"code": "import pandas"})
            structured = answer.structured_content or {}
            if structured.get("success") is not True:
                no_pandas = structured.get("error_type") or answer.content
        if no_pandas is None:
            yield connected
    if no_pandas is not None:
        # Skipped outside the client's task group, which would wrap the skip in an exception group.
        pytest.skip(f"{backend}: `import pandas` fails there ({no_pandas}), so there is no DataFrame to show")


@pytest.fixture(scope="module")
async def chromium(anyio_backend: str) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture(scope="module")
def host_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_host(tmp_path_factory.mktemp("host"))


@pytest.fixture(scope="module")
async def browser(chromium: Any, host_html: str, client: Client) -> Browser:
    return Browser(chromium, host_html, await app_resource(client))


def once(backend: str) -> None:
    """What the app does with these results does not depend on the backend that made them: run on
    one backend only, to keep the file quick."""
    if backend != "subprocess":
        pytest.skip("the app's handling of this does not depend on the backend: checked on subprocess")


async def assert_clean(cell: Cell) -> None:
    """Nothing blocked by the CSP, no error in any frame, no request off the page, no tool called."""
    assert await cell.frame_problems() == []
    assert cell.refused == []
    assert [r for r in cell.requests if r["method"] == "tools/call"] == []
    assert [r for r in await cell.host_log() if r["method"] in ("tools/call", "ui/message")] == []


async def assert_readable(cell: Cell, theme: str) -> None:
    worst = await cell.contrast()
    assert worst["checked"] > 5, worst
    assert worst["ratio"] >= 4.5, f"{theme}: {worst}"


async def test_a_program_as_a_cell(browser: Browser, client: Client, backend: str) -> None:
    async with browser.cell(client) as cell:
        result = await cell.run(PROGRAM)
        assert result["structuredContent"]["success"] is True, result["structuredContent"]
        text = await cell.text()
        # The code, the printed lines in order around the displayed table, stderr marked as such.
        assert "frame.sort_values" in await cell.text("#code")
        assert text.index("hello from the cell") < text.index("second line")
        assert "a warning" in await cell.text(".stream.stderr")
        assert "stderr" in (await cell.text(".stream.stderr")).lower()

        tables = cell.frame.locator("figure.table")
        tables_sent = (result.get("_meta") or {}).get("mcp-sandbox/tables") or []
        assert len(tables_sent) == 2, f"the server sent no tables: {result.get('_meta')}"
        assert await tables.count() == 2
        displayed, value = tables.nth(0), tables.nth(1)
        caption = await displayed.locator("figcaption").inner_text()
        assert "DataFrame" in caption and "3 rows \N{MULTIPLICATION SIGN} 2 columns" in caption
        # The displayed table sits in stdout where display() printed it.
        assert text.index("second line") < text.index("carol") < text.index("after the table")
        # (at the span the server gave, in code points: the snake is one of them, two in UTF-16)
        streams = await cell.frame.locator(".stream.stdout").evaluate_all(
            "(all) => all.map((e) => e.textContent)"
        )
        assert streams == ["hello from the cell \N{SNAKE}\nsecond line\n", "after the table\n"]
        names = displayed.locator("tbody td:nth-child(2)")
        assert await names.all_inner_texts() == ["carol", "alice", "bob"]
        await displayed.locator("thead th", has_text="name").click()
        assert await names.all_inner_texts() == ["alice", "bob", "carol"]
        await displayed.locator("thead th", has_text="name").click()
        assert await names.all_inner_texts() == ["carol", "bob", "alice"]
        await displayed.locator("thead th", has_text="score").click()
        assert await displayed.locator("tbody td:nth-child(3)").all_inner_texts() == ["2.5", "7.25", "10"]
        # The final value (sorted by score) is a table in place of its text.
        assert await value.locator("tbody td:nth-child(2)").all_inner_texts() == ["carol", "bob", "alice"]
        assert "Out" in await cell.text(".out-row")

        figure = cell.frame.locator("img.figure[alt='Figure 1']")
        await figure.wait_for()
        size = await figure.evaluate("(img) => [img.complete, img.naturalWidth, img.naturalHeight]")
        assert size[0] and size[1] > 0 and size[2] > 0, size

        files = cell.frame.locator("li.file")
        assert await files.count() == 2
        assert (
            "report.csv" in await files.nth(0).inner_text() or "report.csv" in await files.nth(1).inner_text()
        )
        big = cell.frame.locator("li.file", has_text="big.txt")
        assert "KB" in await big.locator(".file-size").first.inner_text()
        await big.locator("button", has_text="Open").click()
        await big.locator("pre.preview:not(.pending)").wait_for()
        assert "big file line" in await big.locator("pre.preview").inner_text()
        reads = [r for r in cell.requests if r["method"] == "resources/read"]
        assert [r["params"]["uri"] for r in reads] == [
            link for link in (b.get("uri") for b in result["content"]) if link and link.endswith("/big.txt")
        ]
        await big.locator("button", has_text="Save").click()
        report = cell.frame.locator("li.file", has_text="report.csv")
        await report.locator("button", has_text="Open").click()
        await report.locator("pre.preview:not(.pending)").wait_for()
        assert "a,b" in await report.locator("pre.preview").inner_text()
        downloads = [r for r in await cell.host_log() if r["method"] == "ui/download-file"]
        assert downloads and downloads[0]["params"]["contents"][0]["uri"].endswith("big.txt")

        # The cell sizes itself through the host's size notifications.
        sizes = [r for r in await cell.host_log() if r["method"] == "ui/notifications/size-changed"]
        assert sizes and sizes[-1]["params"]["height"] > 300

        await assert_readable(cell, "light")
        await cell.screenshot(f"cell-{backend}-light")
        await cell.set_theme("dark")
        await assert_readable(cell, "dark")
        await cell.screenshot(f"cell-{backend}-dark")

        # Past the host's max height the cell scrolls inside, and says its new size.
        await cell.page.evaluate(
            "() => host.context({ containerDimensions: { maxHeight: 400, width: 720 } })"
        )
        await cell.page.wait_for_function(
            "() => parseFloat(document.querySelector('iframe').style.height) <= 400"
        )
        scroll = await cell.frame.evaluate("() => [cell.scrollHeight, cell.clientHeight]")
        assert scroll[0] > scroll[1], scroll
        await assert_clean(cell)


async def test_an_error_shows_its_type_and_traceback(browser: Browser, client: Client) -> None:
    async with browser.cell(client, theme="dark") as cell:
        await cell.run("def inner():\n    return 1 / 0\n\nprint('before')\ninner()")
        assert "ZeroDivisionError" in await cell.text("#status")
        error = await cell.text(".error")
        assert "ZeroDivisionError" in error and "division by zero" in error and "return 1 / 0" in error
        assert "before" in await cell.text(".stream.stdout")
        await assert_readable(cell, "dark")
        await assert_clean(cell)


async def test_a_long_table_and_a_cut_output(browser: Browser, client: Client, backend: str) -> None:
    once(backend)
    async with browser.cell(client) as cell:
        code = "import pandas as pd\ndisplay(pd.Series(range(1000), name='n'))\n"
        code += "for i in range(5000):\n    print('row', i)"
        result = await cell.run(code)
        structured = result["structuredContent"]
        assert structured["truncated"] is True and structured["stdout_uri"], structured
        table = cell.frame.locator("figure.table")
        caption = await table.locator("figcaption").inner_text()
        assert caption.startswith("Series \N{MIDDLE DOT} 1,000 rows"), caption
        # Head and tail were sent: a gap row says how many rows between them were not.
        assert "more rows" in await table.locator("tr.gap").first.inner_text()
        kept = cell.frame.locator(".kept", has_text="stdout was cut")
        await kept.locator("button", has_text="Show all").click()
        whole = cell.frame.locator("pre.preview", has_text="row 4999")
        await whole.wait_for()
        assert "row 2500" in await whole.inner_text()
        reads = [r["params"]["uri"] for r in cell.requests if r["method"] == "resources/read"]
        assert reads == [structured["stdout_uri"]]
        await assert_clean(cell)


async def test_notes_and_sandbox_outcomes(browser: Browser, client: Client, backend: str) -> None:
    """Server notes, a restored session and the sandbox's own outcomes, from hand-made results of
    the shape the server sends (those outcomes are slow or unsafe to cause for real)."""
    once(backend)
    base = {
        "success": False,
        "exception": None,
        "stdout": "",
        "stderr": "",
        "result": None,
        "truncated": False,
    }
    base |= {"duration_ms": 12, "backend": "subprocess", "session_id": "s1", "files": [], "figures": 0}
    base |= {"session_lost": False, "session_restored": True, "restored_from_call": 3}
    async with browser.cell(client) as cell:
        await cell.page.evaluate("() => host.input({ code: 'x = [0] * 10**10' })")
        note = "output/huge.bin left out: over MCP_SANDBOX_MAX_OUTPUT_MB in all"
        structured = base | {
            "status": "memory_limit",
            "error_type": "MemoryLimit",
            "error": "The program used too much memory.",
            "notes": [note],
        }
        await cell.show({"content": [{"type": "text", "text": "..."}], "structuredContent": structured})
        assert "Out of memory" in await cell.text("#status")
        assert "used too much memory" in await cell.text(".error")
        notes = await cell.text(".notes")
        assert note in notes and "restored from call 3" in notes
        assert "restored from call 3" in await cell.text("#meta")
        await assert_clean(cell)
    async with browser.cell(client) as cell:
        await cell.page.evaluate("() => host.input({ code: 'while True: pass' })")
        cancelled = {"status": "cancelled", "error_type": "Cancelled", "error": "The call was cancelled."}
        structured = base | cancelled | {"notes": []}
        await cell.show({"content": [{"type": "text", "text": "..."}], "structuredContent": structured})
        assert "Stopped" in await cell.text("#status") and "Stopped" in await cell.text(".error")
        await assert_clean(cell)


async def test_program_made_html_is_shown_as_text_and_runs_nothing(
    browser: Browser, client: Client, backend: str
) -> None:
    once(backend)
    async with browser.cell(client) as cell:
        await cell.run(HOSTILE)
        text = await cell.text()
        assert "<script>window.__pwned = 'stdout script'</script>" in text
        assert "onerror=" in text
        assert await cell.frame.evaluate("() => window.__pwned === undefined")
        assert await cell.frame.locator("#output img, #output script, #output b").count() == 0
        await assert_clean(cell)


async def test_timeout_and_stop_are_said_as_such(browser: Browser, client: Client, backend: str) -> None:
    once(backend)
    async with browser.cell(client) as cell:
        result = await cell.run("import time\ntime.sleep(30)", timeout=1)
        assert result["structuredContent"]["status"] == "timeout"
        assert "Timed out after 1 s" in await cell.text("#status")
        assert "Timed out after 1 s" in await cell.text(".error")
        await assert_clean(cell)
    async with browser.cell(client) as cell:
        # The program's own exception named Timeout is its error, not a timeout.
        result = await cell.run("class Timeout(Exception): pass\nraise Timeout('mine')", timeout=5)
        assert result["structuredContent"]["status"] == "error"
        assert await cell.text("#status") == "✗ Timeout" and "Timed out" not in await cell.text()
        assert "Timeout: mine" in await cell.text(".error")
        await assert_clean(cell)
    async with browser.cell(client) as cell:
        # The host cancels a call it started: the cell says it stopped.
        await cell.page.evaluate("() => host.input({ code: 'import time; time.sleep(60)' })")
        await cell.frame.wait_for_function("document.getElementById('status').textContent === 'Running…'")
        await cell.page.evaluate("() => host.cancelled('the user stopped it')")
        await cell.frame.wait_for_function(
            "document.getElementById('status').textContent.includes('Stopped')"
        )
        assert "the user stopped it" in await cell.text(".error")
        await cell.page.evaluate("() => host.teardown()")
        await assert_clean(cell)
