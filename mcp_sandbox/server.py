"""The MCP server: the `App` that owns every sandbox, and the tools it exposes."""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Annotated, Any

import anyio
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
from mcp_sandbox.audit import ExecutionRecord
from mcp_sandbox.backends.base import Backend
from mcp_sandbox.backends.choice import prepare_backend
from mcp_sandbox.backends.policy import policy_violation
from mcp_sandbox.bridge.config import BridgeConfig, load_bridge_config
from mcp_sandbox.bridge.local import LocalTools
from mcp_sandbox.bridge.upstreams import ToolBridge
from mcp_sandbox.pool import PoolUnavailable, WarmPool
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sessions import ProgressReport, SessionLimitReached, SessionPool
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

#: Letters, digits and _.:- with at least one that is not a dot: a session id names a folder.
SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]*[A-Za-z0-9_:-][A-Za-z0-9_.:-]*$"
#: How long start-up waits for the upstream servers to list their tools (they keep trying after).
BRIDGE_STARTUP_WAIT = 15.0


#: Output text files up to this size also come back as embedded resources.
INLINE_TEXT_BYTES = 64 * 1024
#: MIME types a client can show as an image.
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}


class App:
    """Everything that lives as long as the server: the backend, the warm pool, the sessions.

    Kept apart from the MCP transport so that one App serves every client of an HTTP server
    (the SDK starts its lifespan per connection) and so the Python API can use it without MCP.
    """

    def __init__(self, settings: Settings, tools: Mapping[str, Callable[..., Any]] | None = None) -> None:
        """`tools`: host callables code may call as `tools.local.<name>(...)` (the Python API).
        Raises ValueError for a tool name that is not a Python identifier."""
        self.settings = settings
        self._local = LocalTools(tools, settings.bridge_call_timeout) if tools is not None else None
        self._stack = AsyncExitStack()
        self._backend: Backend | None = None
        self._pool: WarmPool | None = None
        self._sessions: SessionPool | None = None
        self.bridge: ToolBridge | None = None
        self.record = ExecutionRecord(settings.audit_log, settings.save_code)

    @property
    def backend(self) -> Backend:
        assert self._backend is not None, "App is not started"
        return self._backend

    @property
    def sessions(self) -> SessionPool:
        assert self._sessions is not None, "App is not started"
        return self._sessions

    async def __aenter__(self) -> App:
        task_group = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.push_async_callback(self._stop, task_group)
        try:
            if self.settings.bridge_config is not None or self._local is not None:
                config = BridgeConfig()
                if self.settings.bridge_config is not None:
                    config = load_bridge_config(self.settings.bridge_config)
                self.bridge = ToolBridge(config, self.settings.bridge_call_timeout, self._local)
                await self.bridge.start(task_group, wait=BRIDGE_STARTUP_WAIT)
            self._backend = await prepare_backend(self.settings, task_group)
        except BaseException:
            await self._stack.aclose()
            raise
        self._pool = WarmPool(
            self._backend.start,
            size=self.settings.pool_size,
            task_group=task_group,
            acquire_timeout=self.settings.acquire_timeout,
        )
        self._pool.fill()
        self._sessions = SessionPool(self._pool, self.settings, self._backend.name, self.bridge)
        task_group.start_soon(self._sessions.expire_idle)
        logger.info(
            "mcp-sandbox %s: %s backend, %d warm sandboxes",
            __version__,
            self._backend.name,
            self.settings.pool_size,
        )
        return self

    async def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
    ) -> ExecutionResult:
        """Run code (the policy first, when it is on); keep the record; copy output files out.

        Raises PoolUnavailable or SessionLimitReached when no sandbox can be had.
        """
        settings = self.settings
        if settings.policy == "strict" and (reason := policy_violation(code)) is not None:
            rejected = ExecutionResult.failure("Rejected", reason, backend=self.backend.name)
            result = rejected.model_copy(update={"session_id": session_id})
        else:
            result = await self.sessions.run(
                code, timeout=settings.clamp_timeout(timeout), session_id=session_id, progress=progress
            )
        if settings.output_dir is not None and result.files:
            await anyio.to_thread.run_sync(self._copy_out, result)
        await self.record.add(code, result)
        return result

    def _copy_out(self, result: ExecutionResult) -> None:
        assert self.settings.output_dir is not None
        root = self.settings.output_dir.resolve()
        folder = root / (result.session_id or "one-off")
        for file in result.files:
            target = (folder / file.name).resolve()
            # Names were checked when the guest reported them; this holds whatever they are.
            if not target.is_relative_to(folder.resolve()) or not folder.resolve().is_relative_to(root):
                result.notes.append(f"output/{file.name} was not copied: its path leaves {root}")
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(result.artifacts.files[file.name])
                file.saved_to = str(target)
            except OSError as error:
                result.notes.append(f"output/{file.name} could not be copied to {folder}: {error.strerror}")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    async def _stop(self, task_group: anyio.abc.TaskGroup) -> None:
        with anyio.CancelScope(shield=True):
            if self._sessions is not None:
                await self._sessions.close()
            if self._pool is not None:
                await self._pool.close()
        task_group.cancel_scope.cancel()


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
    settings = app.settings
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
            Field(gt=0, description="Seconds the program may run (clamped to the server's maximum)."),
        ] = None,
        session_id: Annotated[
            str | None,
            Field(
                pattern=SESSION_ID_PATTERN,
                max_length=128,
                description="Run in this named session to keep state between calls; omit for a clean run.",
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        if len(code) > settings.max_code_chars:
            raise ToolError(
                f"code is {len(code):,} characters long; the limit is {settings.max_code_chars:,} "
                "(MCP_SANDBOX_MAX_CODE_CHARS)"
            )

        async def report(elapsed: float, line: str | None) -> None:
            message = f"running for {elapsed:.0f} s" + (f"; last output: {line}" if line else "")
            await ctx.report_progress(elapsed, None, message)

        try:
            result = await app.execute(code, timeout=timeout, session_id=session_id, progress=report)
        except (PoolUnavailable, SessionLimitReached) as error:
            raise ToolError(str(error)) from None
        return tool_result(result)

    async def reset_session(
        session_id: Annotated[
            str, Field(pattern=SESSION_ID_PATTERN, max_length=128, description="The session to clear.")
        ],
    ) -> ResetResult:
        """Clear a session: its variables are dropped and its sandbox is stopped."""
        return ResetResult(session_id=session_id, existed=await app.sessions.reset(session_id))

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
