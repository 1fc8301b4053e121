"""The MCP adapter: the tools `execute_python`, `search_tools` and `reset_session` over an `App`.

Only the entry points (the command line) import this module; every limit lives in the App.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
    TextResourceContents,
    ToolAnnotations,
)
from pydantic import BaseModel, Field

from mcp_sandbox import __version__
from mcp_sandbox.app import MAX_SESSION_ID_CHARS, SESSION_ID_PATTERN, App, InvalidRequest
from mcp_sandbox.pool import PoolUnavailable
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sessions import SessionElsewhere, SessionLimitReached

#: Output text files up to this size also come back as embedded resources.
INLINE_TEXT_BYTES = 64 * 1024
#: MIME types a client can show as an image.
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
#: The header a client mirrors a call's session id into (MCP 2026-07-28 `x-mcp-header`), so a
#: load balancer can send each session's calls to one instance (docs/deploy.md).
SESSION_HEADER_TOKEN = "Session-Id"


def session_id_schema(schema: dict[str, Any]) -> None:
    """The session id's schema: shown to clients (the App checks it, so every adapter gives the
    same error) and mirrored into Mcp-Param-Session-Id, which needs a plain string type (a client
    drops a tool whose annotation sits on an anyOf), so an omitted id is simply absent."""
    schema.pop("anyOf", None)
    schema.pop("default", None)
    schema.update(
        {
            "type": "string",
            "pattern": SESSION_ID_PATTERN,
            "maxLength": MAX_SESSION_ID_CHARS,
            "x-mcp-header": SESSION_HEADER_TOKEN,
        }
    )


class ResetResult(BaseModel):
    session_id: str
    existed: bool = Field(description="False when there was no such session (nothing to reset).")


class FoundTool(BaseModel):
    signature: str = Field(description="How to call it from execute_python code.")
    description: str
    server: str = Field(description="The upstream server, as configured.")
    tool: str = Field(description="The tool's name on that server.")


class SearchResult(BaseModel):
    tools: list[FoundTool]
    total: int = Field(description="How many upstream tools there are in all.")


def tool_result(result: ExecutionResult) -> CallToolResult:
    """The MCP form of a result: its JSON, then figures and output images as image content,
    and small text files as embedded resources."""
    content: list[ContentBlock] = [TextContent(type="text", text=result.model_dump_json())]
    for figure in result.artifacts.figures:
        content.append(_image(figure, "image/png"))
    for file in result.files:
        data = result.artifacts.files[file.name]
        if file.mime_type in IMAGE_TYPES:
            content.append(_image(data, file.mime_type))
        elif len(data) <= INLINE_TEXT_BYTES and _is_text(file.mime_type):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            uri = f"sandbox://output/{file.name}"
            resource = TextResourceContents(uri=uri, mime_type=file.mime_type, text=text)
            content.append(EmbeddedResource(type="resource", resource=resource))
    return CallToolResult(content=content, structured_content=result.model_dump(mode="json"))


def _image(data: bytes, mime: str) -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)


def _is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in {"application/json", "application/xml", "application/x-yaml"}


def describe_execute_python(app: App) -> str:
    s = app.settings
    return (
        "Run Python code in a sandbox and return its stdout, stderr and the repr() of its last "
        "expression (like a REPL). Top-level `await` works. "
        f"{app.backend.describe()} "
        "Without session_id every call starts from a clean interpreter; pass the same session_id "
        "(any name you choose) to keep variables, imports and functions between calls. "
        f"Sessions expire after {s.session_ttl:g} s idle; reset_session clears one. "
        f"A call times out after {s.timeout:g} s unless `timeout` says otherwise (at most "
        f"{s.max_timeout:g} s). stdout and stderr are capped at {s.max_output_chars} characters each, "
        "keeping the beginning and the end." + describe_bridge(app)
    )


def describe_bridge(app: App) -> str:
    if app.bridge is None:
        return ""
    summary = app.bridge.summary()
    listed = f" Available: {summary}." if summary else " (none has listed its tools yet)"
    return (
        " Code can call other MCP servers' tools as plain functions: "
        "`tools.<server>.<tool>(**arguments)` returns the tool's structured result as dicts and lists "
        "(or its text) and raises ToolError on failure; `await tools.<server>.<tool>_async(...)` with "
        "asyncio.gather runs calls in parallel. Prefer one program that calls many tools and filters "
        f"their results over many separate calls.{listed} Use search_tools to see signatures."
    )


def build_server(app: App) -> MCPServer:
    """An MCP server whose tools run code through `app`."""
    server: MCPServer = MCPServer(
        "mcp-sandbox",
        version=__version__,
        instructions="Use execute_python to run Python code; use a session_id to keep state between calls.",
    )

    async def execute_python(
        ctx: Context,
        code: Annotated[str, Field(description="The Python program to run.")],
        timeout: Annotated[
            float | None,
            Field(
                description="Seconds the program may run (clamped to the server's maximum).",
                json_schema_extra={"exclusiveMinimum": 0},
            ),
        ] = None,
        session_id: Annotated[
            str | None,
            Field(
                description="Run in this named session to keep state between calls; omit for a clean run.",
                json_schema_extra=session_id_schema,
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        async def report(elapsed: float, line: str | None) -> None:
            message = f"running for {elapsed:.0f} s" + (f"; last output: {line}" if line else "")
            await ctx.report_progress(elapsed, None, message)

        try:
            result = await app.execute(code, timeout=timeout, session_id=session_id, progress=report)
        except (InvalidRequest, PoolUnavailable, SessionLimitReached, SessionElsewhere) as error:
            raise ToolError(str(error)) from None
        return tool_result(result)

    async def reset_session(
        session_id: Annotated[
            str, Field(description="The session to clear.", json_schema_extra=session_id_schema)
        ],
    ) -> ResetResult:
        """Clear a session: its variables are dropped and its sandbox is stopped."""
        try:
            existed = await app.reset_session(session_id)
        except (InvalidRequest, SessionElsewhere) as error:
            raise ToolError(str(error)) from None
        return ResetResult(session_id=session_id, existed=existed)

    async def search_tools(
        query: Annotated[
            str, Field(max_length=500, description="Words to look for in tool names and descriptions.")
        ],
        limit: Annotated[int, Field(ge=1, le=100, description="Most tools to return.")] = 10,
    ) -> SearchResult:
        """Find upstream MCP tools that code in execute_python can call, with their Python signatures.
        An empty query lists the first `limit` tools."""
        if app.bridge is None:
            return SearchResult(tools=[], total=0)
        found = [
            FoundTool(
                signature=spec.signature, description=spec.description, server=spec.server, tool=spec.name
            )
            for spec in app.bridge.search(query, limit)
        ]
        return SearchResult(tools=found, total=len(app.bridge.specs))

    server.add_tool(
        execute_python,
        description=describe_execute_python(app),
        annotations=ToolAnnotations(title="Run Python", read_only_hint=False, open_world_hint=False),
    )
    if app.bridge is not None:
        server.add_tool(
            search_tools, annotations=ToolAnnotations(title="Search bridged tools", read_only_hint=True)
        )
    server.add_tool(
        reset_session,
        annotations=ToolAnnotations(title="Reset a session", destructive_hint=True, idempotent_hint=True),
    )
    return server
