"""A real upstream MCP server for the bridge tests.

`python -m tests.upstreams.calc_server` serves stdio; add `http PORT` or `sse PORT` for those.
"""

from __future__ import annotations

import base64
import os
import sys
from typing import Annotated

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent, TextResourceContents
from pydantic import BaseModel, Field

app = MCPServer("calc")


class Sum(BaseModel):
    sum: int


@app.tool()
def add(
    a: Annotated[int, Field(description="The first addend.")],
    b: Annotated[int, Field(description="The second.")],
) -> Sum:
    """Add two integers."""
    return Sum(sum=a + b)


@app.tool(structured_output=False)
def shout(text: str, times: int = 1) -> str:
    """Upper-case some text, repeated."""
    return " ".join([text.upper()] * times)


@app.tool()
def numbers(count: int) -> list[int]:
    """The integers from 0 below count."""
    return list(range(count))


@app.tool()
def fail(message: str) -> str:
    """Always fails with the given message."""
    raise ToolError(message)


_slow_calls = 0


@app.tool()
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    global _slow_calls
    _slow_calls += 1
    await anyio.sleep(seconds)
    return "slept"


@app.tool()
def slow_calls() -> int:
    """How many calls to `slow` this server has received."""
    return _slow_calls


@app.tool()
def crash() -> str:
    """The server process dies mid-call."""
    os._exit(3)


@app.tool(name="get-weather")
def get_weather(city: str) -> dict[str, str]:
    """A tool whose name is not a Python identifier."""
    return {"city": city, "sky": "clear"}


@app.tool(name="class")
def class_(kind: str) -> str:
    """A tool named like a Python keyword."""
    return f"class {kind}"


#: The 8 bytes every PNG starts with, then a marker: enough to check bytes arrive unchanged.
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


@app.tool()
def chart(title: str) -> CallToolResult:
    """An image and its caption, as a plotting server answers."""
    image = ImageContent(type="image", data=base64.b64encode(PNG).decode(), mime_type="image/png")
    return CallToolResult(content=[TextContent(type="text", text=f"chart: {title}"), image])


@app.tool()
def manual(page: str) -> CallToolResult:
    """One embedded text resource, as a documentation server answers."""
    text = TextResourceContents(uri=f"docs://manual/{page}", mime_type="text/markdown", text=f"# {page}\n")
    return CallToolResult(content=[EmbeddedResource(type="resource", resource=text)])


@app.tool()
def whoami() -> dict[str, str | None]:
    """Where this server runs: its pid and the marker in its environment."""
    return {"pid": str(os.getpid()), "marker": os.environ.get("CALC_MARKER")}


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "http":
        app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif mode == "sse":
        app.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        app.run("stdio")
