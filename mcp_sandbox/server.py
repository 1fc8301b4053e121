"""The MCP adapter: the tools `execute_python`, `search_tools` and `reset_session` over an `App`.

Only the entry points (the command line) import this module; every limit lives in the App.
"""

from __future__ import annotations

import base64
import json
from typing import Annotated, Any, Literal, cast

from mcp.server.apps import client_supports_apps
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.types import (
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    GetPromptRequestParams,
    GetPromptResult,
    ImageContent,
    InputRequiredResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    Resource,
    ResourceLink,
    SetLevelRequestParams,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)
from pydantic import AnyHttpUrl, BaseModel, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mcp_sandbox.app import MAX_SESSION_ID_CHARS, App
from mcp_sandbox.bridge.catalog import NO_MATCH, ToolSpec
from mcp_sandbox.bridge.stubs import stubs
from mcp_sandbox.client_log import forwarding, install, set_level
from mcp_sandbox.errors import Refused
from mcp_sandbox.kept import FILE_URI_TEMPLATE, URI_TEMPLATE, KeptOutputMissing, line_number
from mcp_sandbox.kept import URI_PREFIX as KEPT_PREFIX
from mcp_sandbox.metrics import CONTENT_TYPE
from mcp_sandbox.principals import SOLE, Caller, Verifier
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import ResultTextName, Settings
from mcp_sandbox.stdio import wire_stdin
from mcp_sandbox.text import model_text
from mcp_sandbox.version import __version__
from mcp_sandbox.view import VIEW_URI, view_extension, view_html, view_meta

#: Output text files up to this size also come back as embedded resources.
INLINE_TEXT_BYTES = 64 * 1024
#: MIME types a client can show as an image.
IMAGE_TYPES = {"image/png", "image/jpeg", "image/gif", "image/webp"}
#: The header a client mirrors a call's session id into (MCP 2026-07-28 `x-mcp-header`), so a
#: load balancer can send each session's calls to one instance (docs/deploy.md).
SESSION_HEADER_TOKEN = "Session-Id"
#: What an operator's tools ask over HTTP, without a token (add_operator_routes).
HEALTH_PATH, READY_PATH, METRICS_PATH = "/healthz", "/readyz", "/metrics"


def session_id_schema(schema: dict[str, Any]) -> None:
    """The session id's schema: its length only (the App checks its characters, so every adapter
    gives the same error, and a regex here costs every agent 25 tokens) and mirrored into
    Mcp-Param-Session-Id, which needs a plain string type (a client
    drops a tool whose annotation sits on an anyOf), so an omitted id is simply absent."""
    schema.pop("anyOf", None)
    schema.pop("default", None)
    schema.update(
        {
            "type": "string",
            "maxLength": MAX_SESSION_ID_CHARS,
            "x-mcp-header": SESSION_HEADER_TOKEN,
        }
    )


class ResetResult(BaseModel):
    session_id: str
    existed: bool = Field(description="False when there was no such session (nothing to reset).")


def found_tool(spec: ToolSpec, full: bool) -> dict[str, Any]:
    """One search hit as data: signature and first sentence; with `full`, all the description
    and the schemas; the upstream's own names where Python's differ."""
    found: dict[str, Any] = {
        "signature": spec.signature,
        "description": spec.description if full else spec.summary,
    }
    if spec.server != spec.server_py or spec.name != spec.name_py:
        found |= {"server": spec.server, "tool": spec.name}
    if full:
        found |= {"input_schema": spec.input_schema, "output_schema": spec.output_schema}
    return found


#: How much search_tools says of each tool: a line, everything, or Python stubs.
SearchDetail = Literal["brief", "full", "stub"]


def search_answer(specs: list[ToolSpec], total: int, detail: SearchDetail = "brief") -> CallToolResult:
    """A search_tools answer: for the agent, one line per tool (signature  # first sentence), the
    full entries as JSON, or Python stubs (valid Python: the count is a comment); for programs,
    the same as structured content."""
    found = [found_tool(spec, detail == "full") for spec in specs]
    count = f"{len(found)} of {total} tools"
    if detail == "stub":
        text = stubs(specs, count)
        return CallToolResult(
            content=[TextContent(type="text", text=text)],
            structured_content={"tools": found, "total": total, "stubs": text},
        )
    if detail == "full":
        text = json.dumps(found, separators=(",", ":"), ensure_ascii=False)
    else:
        text = "\n".join(
            f"{hit['signature']}  # {hit['description']}"
            + (f" (upstream: {hit['server']}/{hit['tool']})" if "server" in hit else "")
            for hit in found
        )
    if not found:
        text = NO_MATCH
    text += f"\n({count})"
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content={"tools": found, "total": total}
    )


def tool_result(
    result: ExecutionResult, form: ResultTextName = "compact", for_view: bool = False
) -> CallToolResult:
    """The MCP form of a result: the text the model reads (model_text, or with "json" the
    structured content's JSON), then figures and output images as image content, and small text
    files as embedded resources; every field as structured content; `for_view` (a client that
    shows the notebook view): its tables as data in `_meta`, where the model does not read."""
    first = model_text(result) if form == "compact" else result.model_dump_json()
    content: list[ContentBlock] = [TextContent(type="text", text=first)]
    for figure in result.artifacts.figures:
        content.append(_image(figure, "image/png"))
    for file in result.files:
        data = result.artifacts.files[file.name]
        if file.mime_type in IMAGE_TYPES:
            content.append(_image(data, file.mime_type))
            continue
        if len(data) <= INLINE_TEXT_BYTES and _is_text(file.mime_type):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is not None:
                uri = f"sandbox://output/{file.name}"
                resource = TextResourceContents(uri=uri, mime_type=file.mime_type, text=text)
                content.append(EmbeddedResource(type="resource", resource=resource))
                continue
        if file.uri is not None:
            description = f"output/{file.name}, a file the call wrote"
            content.append(
                ResourceLink(
                    type="resource_link",
                    name=file.name,
                    uri=file.uri,
                    mime_type=file.mime_type,
                    description=description,
                    size=file.size,
                )
            )
    for stream, link in (("stdout", result.stdout_uri), ("stderr", result.stderr_uri)):
        if link is not None:
            kept = result.artifacts.kept_output[stream]
            description = f"The whole {stream} ({kept.total:,} characters) of a call whose {stream} was cut"
            content.append(
                ResourceLink(
                    type="resource_link",
                    name=f"{stream}.txt",
                    uri=link,
                    mime_type="text/plain",
                    description=description,
                    size=len(kept.text.encode("utf-8")),
                )
            )
    return CallToolResult(
        content=content,
        structured_content=result.model_dump(mode="json"),
        _meta=view_meta(result) if for_view else None,
    )


def _image(data: bytes, mime: str) -> ImageContent:
    return ImageContent(type="image", data=base64.b64encode(data).decode(), mime_type=mime)


def _is_text(mime: str) -> bool:
    return mime.startswith("text/") or mime in {"application/json", "application/xml", "application/x-yaml"}


def execute_python_description(app: App) -> str:
    s = app.settings
    return (
        "Run Python in a sandbox as a REPL cell: you read its prints (display(x) too) and its last "
        f"value; top-level await works. {app.backend.summary()} A session_id keeps variables until "
        f"idle {s.session_ttl:g} s (reset_session ends it). Timeout {s.timeout:g} s, at most "
        f"{s.max_timeout:g}. Output past {s.max_output_chars:,} characters is cut, all kept behind a link."
        + bridge_description(app)
    )


def bridge_description(app: App) -> str:
    """How to find and call the bridged tools, in the same few words however many there are: the
    tools themselves are found with search_tools, never listed here."""
    if app.bridge is None:
        return ""
    return (
        f" Call other MCP servers' tools as `tools.<server>.<tool>(**arguments)`{app.bridge.summary()}, "
        "found with search_tools; misspelt names are refused before running. Results are data "
        "(structured or parsed JSON; images and resources with .data, .mime_type, .uri). "
        "Failures raise ToolError; `_async` twins run at once with asyncio.gather. Prefer one "
        "program calling many tools."
    )


#: Result fields kept for clients that read them, no longer listed in the output schema.
DEPRECATED = frozenset({"error_type"})


def compact_schema(schema: Any, *, result: bool = False) -> Any:
    """`schema` in as few tokens as it says the same: no titles (the property names say them),
    `anyOf [X, null]` as `type: [X, "null"]`, and for a result's schema no descriptions or
    defaults either (its fields are named plainly; the README's table says the rest)."""
    if isinstance(schema, list):
        return [compact_schema(item, result=result) for item in schema]
    if not isinstance(schema, dict):
        return schema
    options = schema.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = next(option for option in options if option != {"type": "null"})
        if isinstance(other.get("type"), str):
            schema = {
                **{k: v for k, v in schema.items() if k != "anyOf"},
                **other,
                "type": [other["type"], "null"],
            }
    # A result's schema keeps what a client validates with: types and the properties' names (its
    # fields' values are the README's table).
    dropped = {"title", "default", "description", "required", "enum"} if result else {"title"}
    compacted = {}
    for key, value in schema.items():
        if key == "default" and value is None:
            continue  # an optional argument's absence says it
        if key in ("properties", "$defs"):
            compacted[key] = {name: compact_schema(sub, result=result) for name, sub in value.items()}
        elif key not in dropped:
            compacted[key] = compact_schema(value, result=result)
    if result and isinstance(compacted.get("properties"), dict):
        # Deprecated fields stay in results for a release, unadvertised (README, "The result").
        compacted["properties"] = {k: v for k, v in compacted["properties"].items() if k not in DEPRECATED}
    if result and "$defs" in compacted:
        # Nested result models (an output file) are described in the README: an array says enough.
        compacted = _without_refs(compacted)
    return compacted


def _without_refs(schema: dict[str, Any]) -> dict[str, Any]:
    properties = {
        name: {"type": "array"} if "$ref" in json.dumps(sub) else sub
        for name, sub in schema.get("properties", {}).items()
    }
    return {key: value for key, value in schema.items() if key != "$defs"} | {"properties": properties}


class SandboxServer(MCPServer):
    """The SDK's server, listing its tools in fewer tokens (compact_schema): every agent reads
    the listing before its first call. execute_python's description is made at each listing:
    what the sandbox imports changes while the server runs (packages arrive, or fail to).

    A request that names what is not there (a tool, a prompt, a cursor) is the protocol error
    -32602 (Invalid params), as the spec says, not a tool error, a traceback in the log and code 0.

    It declares `logging`: what it logs about a tool call goes to the client that made it, at the
    level that client asked for (client_log)."""

    def __init__(self, app: App, **options: Any) -> None:
        super().__init__("mcp-sandbox", **options)
        self._app = app
        # MCPServer takes no setLevel handler; the low-level server declares `logging` for one.
        self._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
        install()

    async def run_stdio(self) -> None:
        """Serve on stdin and stdout until stdin ends; unlike the SDK's `run_stdio_async`, a cancel
        stops it at once (stdio.py)."""
        with wire_stdin() as lines:
            # The transport only iterates over its stdin's lines, which `lines` gives.
            async with stdio_server(stdin=cast(Any, lines)) as (read, write):
                lowlevel = self._lowlevel_server
                await lowlevel.run(read, write, lowlevel.create_initialization_options())

    async def _handle_call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult | InputRequiredResult:
        if self._tool_manager.get_tool(params.name) is None:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        async with forwarding(ctx):
            return await super()._handle_call_tool(ctx, params)

    async def _handle_get_prompt(
        self, ctx: ServerRequestContext[Any], params: GetPromptRequestParams
    ) -> GetPromptResult | InputRequiredResult:
        if params.name not in {prompt.name for prompt in await self.list_prompts()}:
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown prompt: {params.name}")
        return await super()._handle_get_prompt(ctx, params)

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        no_cursor(params)
        return await super()._handle_list_tools(ctx, params)

    async def _handle_list_prompts(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListPromptsResult:
        no_cursor(params)
        return await super()._handle_list_prompts(ctx, params)

    async def _handle_list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourceTemplatesResult:
        no_cursor(params)
        return await super()._handle_list_resource_templates(ctx, params)

    async def _handle_list_resources(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        no_cursor(params)
        # The SDK's handler, plus the caller's own kept outputs: a listing is per principal.
        listed = await super()._handle_list_resources(ctx, params)
        principal = principal_of_request(ctx.request)
        kept = [
            Resource(
                uri=link,
                name=link.removeprefix(KEPT_PREFIX),
                title="A cut output, kept whole",
                mime_type="text/plain",
                size=characters,
            )
            for link, characters in self._app.kept.links(principal)
        ]
        return listed.model_copy(update={"resources": [*listed.resources, *kept]})

    async def list_tools(self) -> list[Tool]:
        return [
            tool.model_copy(
                update={
                    "input_schema": compact_schema(tool.input_schema),
                    "output_schema": compact_schema(tool.output_schema, result=True)
                    if tool.output_schema is not None
                    else None,
                }
                | (
                    {"description": execute_python_description(self._app)}
                    if tool.name == "execute_python"
                    else {}
                )
            )
            for tool in await super().list_tools()
        ]


def no_cursor(params: PaginatedRequestParams | None) -> None:
    """Every listing is one page, so this server hands out no cursors: any cursor is invalid."""
    if params is not None and params.cursor is not None:
        raise MCPError(
            code=INVALID_PARAMS,
            message="Invalid cursor: this server lists everything in one page and hands out no cursors",
        )


def principal_of(ctx: Context) -> str:
    """The caller's principal (principal_of_request) of a tool or resource call."""
    return principal_of_request(ctx.request_context.request)


def principal_of_request(request: object) -> str:
    """The principal a bearer token named (the SDK's bearer middleware puts the verifier's Caller
    on the request), else the server's sole principal (stdio, no token)."""
    user = getattr(request, "scope", {}).get("user")
    caller = user.access_token if isinstance(user, AuthenticatedUser) else None
    return caller.principal if isinstance(caller, Caller) else SOLE


def auth_settings(settings: Settings) -> AuthSettings:
    """What the SDK's bearer middleware needs. With an OAuth issuer it also publishes this server's
    RFC 9728 protected-resource metadata; the tokens an operator hands out need none."""
    if settings.auth_jwks is not None:
        assert settings.auth_issuer is not None and settings.auth_resource_url is not None  # Settings checks
        return AuthSettings(
            issuer_url=AnyHttpUrl(settings.auth_issuer),
            resource_server_url=AnyHttpUrl(settings.auth_resource_url),
            validate_token_resource=False,  # JwtVerifier checks `aud` itself
        )
    # Without resource_server_url nothing is published, so this issuer is never shown to anyone.
    return AuthSettings(issuer_url=AnyHttpUrl("http://localhost"), resource_server_url=None)


def build_server(app: App, verifier: Verifier | None = None) -> SandboxServer:
    """An MCP server whose tools run code through `app`; over HTTP, every request needs a bearer
    token `verifier` accepts (None: none is asked for)."""
    html = view_html()
    server = SandboxServer(
        app,
        extensions=[view_extension(html)] if html is not None else None,
        token_verifier=verifier,
        auth=auth_settings(app.settings) if verifier is not None else None,
        version=__version__,
        instructions="Use execute_python to run Python code; use a session_id to keep state between calls.",
    )

    async def execute_python(
        ctx: Context,
        code: Annotated[str, Field(description="The Python program to run.")],
        timeout: Annotated[
            float | None,
            Field(
                description="Seconds it may run.",
                json_schema_extra={"exclusiveMinimum": 0},
            ),
        ] = None,
        session_id: Annotated[
            str | None,
            Field(
                description="Keep state between calls under this name; omit for a clean run.",
                json_schema_extra=session_id_schema,
            ),
        ] = None,
    ) -> Annotated[CallToolResult, ExecutionResult]:
        async def report(elapsed: float, message: str) -> None:
            await ctx.report_progress(elapsed, None, message)

        try:
            result = await app.execute(
                code, timeout=timeout, session_id=session_id, progress=report, principal=principal_of(ctx)
            )
        except Refused as error:
            raise ToolError(str(error)) from None
        return tool_result(result, app.settings.result_text, client_supports_apps(ctx))

    async def reset_session(
        ctx: Context,
        session_id: Annotated[
            str, Field(description="The session to clear.", json_schema_extra=session_id_schema)
        ],
    ) -> ResetResult:
        """End a session: drop its variables and stop its sandbox."""
        try:
            existed = await app.reset_session(session_id, principal_of(ctx))
        except Refused as error:
            raise ToolError(str(error)) from None
        return ResetResult(session_id=session_id, existed=existed)

    async def search_tools(
        query: Annotated[str, Field(max_length=500, description="Words describing the tool.")],
        limit: Annotated[int, Field(ge=1, le=100)] = 5,
        detail: Annotated[
            SearchDetail,
            Field(description="full: description and schemas; stub: Python stubs."),
        ] = "brief",
    ) -> CallToolResult:
        # Its description is set in add_tool: a docstring's indentation would cost tokens in every listing.
        if app.bridge is None:
            return search_answer([], 0, detail)
        return search_answer(app.bridge.search(query, limit), len(app.bridge.specs), detail)

    @server.resource(
        URI_TEMPLATE,
        name="kept_output",
        title="The whole of a cut stdout or stderr",
        description="A call's whole stdout or stderr, when the result's was cut (its stdout_uri or "
        "stderr_uri); first and last pick lines (from 1; negative from the end).",
        mime_type="text/plain",
    )
    def kept_output(
        ctx: Context, call: str, stream: str, first: str | None = None, last: str | None = None
    ) -> str:
        try:
            return app.kept.read(call, stream, line_number(first), line_number(last), principal_of(ctx))
        except KeptOutputMissing as error:
            raise ResourceNotFoundError(str(error)) from None
        except ValueError as error:
            raise ResourceError(str(error)) from None

    @server.resource(
        FILE_URI_TEMPLATE,
        name="kept_file",
        title="A file a call wrote",
        description="The bytes of a file a call wrote to output/ (its files[].uri), while kept.",
        mime_type="application/octet-stream",
    )
    def kept_file(ctx: Context, call: str, name: str) -> bytes:
        try:
            return app.kept.read_file(call, name, principal_of(ctx))
        except KeptOutputMissing as error:
            raise ResourceNotFoundError(str(error)) from None

    server.add_tool(
        execute_python,
        description=execute_python_description(app),
        annotations=ToolAnnotations(title="Run Python", open_world_hint=False),
        meta={"ui": {"resourceUri": VIEW_URI}} if html is not None else None,
    )
    if app.bridge is not None:
        server.add_tool(
            search_tools,
            description="Find the tools execute_python code can call, best first, as Python signatures; "
            "an empty query lists them.",
            annotations=ToolAnnotations(title="Search bridged tools", read_only_hint=True),
        )
    server.add_tool(
        reset_session,
        annotations=ToolAnnotations(title="Reset a session", destructive_hint=True, idempotent_hint=True),
    )
    add_operator_routes(server, app)
    return server


def add_operator_routes(server: MCPServer, app: App) -> None:
    """What an operator's tools ask over HTTP and SSE, without a token (the SDK's custom routes
    skip its bearer check): /healthz (the process answers), /readyz (a call could be served now;
    503 and the reason when not) and, unless MCP_SANDBOX_METRICS=false, /metrics."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        if (reason := await app.readiness()) is not None:
            return JSONResponse({"status": "not ready", "reason": reason}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def metrics(request: Request) -> Response:
        return Response(app.metrics.exposition(), media_type=CONTENT_TYPE)

    routes = {HEALTH_PATH: healthz, READY_PATH: readyz} | (
        {METRICS_PATH: metrics} if app.settings.metrics else {}
    )
    for path, endpoint in routes.items():
        server.custom_route(path, methods=["GET"], include_in_schema=False)(endpoint)
