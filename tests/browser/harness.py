"""The browser tests' host: Chromium (Debian's, driven by Playwright) showing a page that hosts the
cell app through the official AppBridge (host.ts), fed by a real MCP client of a real server.

The host page is served as http://host.test/ and the app as http://app.test/cell.html (a separate
origin, in an iframe sandboxed as hosts do, under the CSP its resource asks for or the default
strict one), both from Playwright routes: nothing listens, and any other request is refused and
recorded. The page reaches the MCP client through one binding, `mcpRequest`, which answers the
host page only (never the app's frame); every request the app made reaches `requests`."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CELL = ROOT / "cell"
BUNDLE = ROOT / "mcp_sandbox" / "ui" / "cell.html"
SCREENSHOTS = ROOT / "tests" / ".screenshots"
HOST_URL = "http://host.test/"
APP_URL = "http://app.test/cell.html"
UI_EXTENSION = "io.modelcontextprotocol/ui"
APP_MIME = "text/html;profile=mcp-app"

#: Host style variables as a real host sends them: one value per theme, by light-dark().
HOST_STYLES = {
    "--color-background-primary": "light-dark(#fcfcfc, #1b1c1f)",
    "--color-text-primary": "light-dark(#1c1d20, #ececee)",
    "--font-sans": "system-ui, sans-serif",
}

#: What the frames record before any of their own scripts run (Playwright's init scripts pass CSP).
WATCH = """
window.__cellProblems = [];
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cellProblems.push(`CSP blocked ${event.blockedURI || "(inline)"}: ${event.violatedDirective}`);
}, true);
window.addEventListener("error", (event) => window.__cellProblems.push(`error: ${event.message}`));
window.addEventListener("unhandledrejection", (event) => {
  window.__cellProblems.push(`unhandled rejection: ${event.reason}`);
});
"""

#: The lowest contrast of shown text against what is behind it (WCAG 2 ratio), and where.
CONTRAST = """
() => {
  const parse = (text) => {
    const m = text.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const parts = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [parts[0], parts[1], parts[2], parts.length > 3 ? parts[3] : 1];
  };
  const over = (top, bottom) => {
    const a = top[3];
    return [0, 1, 2].map((i) => top[i] * a + bottom[i] * (1 - a)).concat([1]);
  };
  const background = (node) => {
    const layers = [];
    for (let at = node; at; at = at.parentElement) {
      const color = parse(getComputedStyle(at).backgroundColor);
      if (color && color[3] > 0) {
        layers.push(color);
        if (color[3] >= 1) break;
      }
    }
    let result = [255, 255, 255, 1];
    for (const layer of layers.reverse()) result = over(layer, result);
    return result;
  };
  const luminance = (c) => {
    const [r, g, b] = c.slice(0, 3).map((v) => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  let worst = { ratio: 99, text: "", color: "", background: "" };
  let checked = 0;
  for (const node of document.querySelectorAll("body *")) {
    const own = [...node.childNodes].some((c) => c.nodeType === 3 && c.textContent.trim());
    const box = node.getBoundingClientRect();
    const hidden = box.width === 0 || box.height === 0 || getComputedStyle(node).visibility === "hidden";
    if (!own || hidden) continue;
    const back = background(node);
    const fore = over(parse(getComputedStyle(node).color), back);
    const [l1, l2] = [luminance(fore), luminance(back)].sort((a, b) => b - a);
    const ratio = (l1 + 0.05) / (l2 + 0.05);
    checked++;
    if (ratio < worst.ratio) {
      worst = { ratio, text: node.textContent.slice(0, 40), color: String(fore), background: String(back) };
    }
  }
  return { ...worst, checked };
}
"""


def missing_tools() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)"
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not (CELL / "node_modules" / "@modelcontextprotocol" / "ext-apps").is_dir():
        return "the npm packages are not installed: npm ci --prefix cell"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


def build_host(folder: Path) -> str:
    """The host page, bundled with esbuild from tests/browser/host.ts."""
    subprocess.run(
        ["node", str(CELL / "build.mjs"), "--host", str(folder)], check=True, capture_output=True, timeout=60
    )
    return (folder / "host.html").read_text(encoding="utf-8")


def dump(model: Any) -> dict[str, Any]:
    """A result of the Python MCP client as its JSON on the wire."""
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    return data


@dataclass
class AppResource:
    """The app's page as the server serves it, and the CSP the host puts it under."""

    html: str
    csp: str
    source: str


def csp_header(meta: dict[str, Any] | None) -> str:
    """The CSP a host applies to an app (SEP-1865's default, widened by its resource's
    `_meta.ui.csp` domains)."""
    csp = ((meta or {}).get("ui") or {}).get("csp") or {}
    connect = " ".join(csp.get("connectDomains") or [])
    resources = " ".join(csp.get("resourceDomains") or [])
    return (
        "default-src 'none'; "
        f"script-src 'self' 'unsafe-inline' {resources}; style-src 'self' 'unsafe-inline' {resources}; "
        f"img-src 'self' data: {resources}; font-src 'self' {resources}; media-src 'self' data: {resources}; "
        f"connect-src 'none' {connect}; frame-src 'none'; base-uri 'self'; object-src 'none'"
    ).replace("  ", " ")


async def app_resource(client: Client) -> AppResource:
    """The app's page: from the resource execute_python's `_meta.ui.resourceUri` names, read through
    the client as a host would (the built file until the server serves it)."""
    listed = await client.list_tools()
    tool = next(t for t in listed.tools if t.name == "execute_python")
    uri = ((dump(tool).get("_meta") or {}).get("ui") or {}).get("resourceUri")
    if uri is None:
        return AppResource(BUNDLE.read_text(encoding="utf-8"), csp_header(None), f"file {BUNDLE}")
    read = dump(await client.read_resource(uri))
    content = read["contents"][0]
    assert content.get("mimeType") == APP_MIME, content.get("mimeType")
    return AppResource(content["text"], csp_header(content.get("_meta")), uri)


@dataclass
class Cell:
    """One app in the host page: its page, its frame, and what it asked of the host."""

    page: Any
    frame: Any
    client: Client
    requests: list[dict[str, Any]]
    problems: list[str]
    refused: list[str]

    async def run(self, code: str, **arguments: Any) -> dict[str, Any]:
        """Call execute_python as a host does: the input to the app, the call through the real
        client, its result to the app; wait until the cell shows it. The result's JSON."""
        arguments = {"code": code, **arguments}
        await self.page.evaluate("(args) => host.input(args)", arguments)
        result = dump(await self.client.call_tool("execute_python", arguments))
        await self.show(result)
        return result

    async def show(self, result: dict[str, Any]) -> None:
        await self.page.evaluate("(result) => host.result(result)", result)
        await self.frame.wait_for_function(
            "!['Running…', 'Waiting for the code…'].includes(document.getElementById('status').textContent)"
        )

    async def text(self, selector: str = "#cell") -> str:
        text: str = await self.frame.locator(selector).inner_text()
        return text

    async def host_log(self) -> list[dict[str, Any]]:
        log: list[dict[str, Any]] = await self.page.evaluate("() => hostLog")
        return log

    async def frame_problems(self) -> list[str]:
        found: list[str] = await self.frame.evaluate("() => window.__cellProblems")
        return found + self.problems

    async def contrast(self) -> dict[str, Any]:
        worst: dict[str, Any] = await self.frame.evaluate(CONTRAST)
        return worst

    async def set_theme(self, theme: str) -> None:
        await self.page.evaluate("(theme) => host.context({ theme })", theme)
        await self.frame.wait_for_function(
            "(theme) => document.documentElement.getAttribute('data-theme') === theme", arg=theme
        )

    async def screenshot(self, name: str) -> Path:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        path = SCREENSHOTS / f"{name}.png"
        await self.page.locator("iframe").screenshot(path=str(path))
        print(f"screenshot: {path}")
        return path


@dataclass
class Browser:
    browser: Any
    host_html: str
    resource: AppResource
    pages: list[Any] = field(default_factory=list)

    @asynccontextmanager
    async def cell(self, client: Client, theme: str = "light") -> AsyncIterator[Cell]:
        """A fresh page hosting the app, connected and initialized with `theme`."""
        context = await self.browser.new_context(viewport={"width": 760, "height": 2400})
        await context.add_init_script(WATCH)
        requests: list[dict[str, Any]] = []
        problems: list[str] = []
        refused: list[str] = []

        async def route(route: Any) -> None:
            url = route.request.url
            if url == HOST_URL:
                await route.fulfill(status=200, content_type="text/html; charset=utf-8", body=self.host_html)
            elif url == APP_URL:
                headers = {"Content-Security-Policy": self.resource.csp}
                await route.fulfill(
                    status=200,
                    content_type="text/html; charset=utf-8",
                    headers=headers,
                    body=self.resource.html,
                )
            elif url.endswith("/favicon.ico"):
                await route.fulfill(status=204, body="")
            else:
                refused.append(url)
                await route.abort()

        async def mcp_request(source: dict[str, Any], method: str, params: str) -> str:
            # Only the host page may reach the MCP client: never the app's frame.
            if source["frame"] != source["page"].main_frame:
                raise PermissionError("only the host page reaches the MCP client")
            parsed = json.loads(params)
            requests.append({"method": method, "params": parsed})
            if method == "resources/read":
                return json.dumps(dump(await client.read_resource(parsed["uri"])))
            if method == "tools/call":
                answer = await client.call_tool(parsed["name"], parsed.get("arguments") or {})
                return json.dumps(dump(answer))
            raise ValueError(f"the test host does not pass on {method}")

        await context.route("**/*", route)
        await context.expose_binding("mcpRequest", mcp_request)
        context.set_default_timeout(15_000)
        page = await context.new_page()
        page.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
        page.on(
            "console",
            lambda message: problems.append(f"console: {message.text}") if message.type == "error" else None,
        )
        try:
            await page.goto(HOST_URL)
            context_json = {
                "theme": theme,
                "styles": {"variables": HOST_STYLES},
                "containerDimensions": {"maxHeight": 2000, "width": 720},
                "displayMode": "inline",
                "platform": "web",
            }
            await page.evaluate("([src, context]) => host.mount(src, context)", [APP_URL, context_json])
            frame = page.frame(url=APP_URL)
            assert frame is not None
            yield Cell(page, frame, client, requests, problems, refused)
        finally:
            await context.close()


def skip_unless_ready() -> None:
    why = missing_tools()
    if why:
        pytest.skip(why)
