"""The notebook view of a call (an MCP App, `io.modelcontextprotocol/ui`): the `ui://` resource
execute_python points hosts at, and the data only it reads. The model reads the text alone."""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from mcp.server.apps import Apps

from mcp_sandbox.result import ExecutionResult

#: The app's page, one HTML file built from cell/ (cell/build.mjs), shipped in the wheel.
VIEW_URI = "ui://mcp-sandbox/cell.html"
#: The `_meta` key of a result that holds its tables, as data for the view.
TABLES_KEY = "mcp-sandbox/tables"


def view_html() -> str | None:
    """The built page, or None in a checkout where it was never built."""
    page = files("mcp_sandbox") / "ui" / "cell.html"
    return page.read_text(encoding="utf-8") if page.is_file() else None


def view_extension(html: str) -> Apps:
    """The extension that announces MCP Apps and serves the page, under the default CSP (the page
    loads nothing: its script and style are inline, its images data: URIs)."""
    apps = Apps()
    apps.add_html_resource(
        VIEW_URI,
        html,
        name="cell",
        title="A call as a notebook cell",
        description="Shows an execute_python call: its code, output, tables, figures, files and errors.",
        prefers_border=True,
    )
    return apps


def view_meta(result: ExecutionResult) -> dict[str, Any] | None:
    """What only the view reads of `result`: its tables (None when it showed none)."""
    tables = result.artifacts.tables
    return {TABLES_KEY: list(tables)} if tables else None
