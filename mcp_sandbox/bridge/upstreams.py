"""The host side of the bridge: connections to the upstream MCP servers, and calls through them.

Sandboxed code never talks to an upstream itself. Its call arrives over the sandbox's existing
channel as (server, tool, arguments), is looked up here among the configured upstreams'
listed tools, and only then sent; anything else is refused. Replies go back as one JSON text,
`{"ok": true, "value": ...}` or `{"ok": false, "error": "..."}`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    AudioContent,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
)

from mcp_sandbox.bridge.catalog import LOCAL_SERVER, SearchIndex, ToolSpec, python_name, tool_spec
from mcp_sandbox.bridge.check import Catalog, WrongCall, wrong_tool_calls
from mcp_sandbox.bridge.config import BridgeConfig, StdioUpstream, Upstream
from mcp_sandbox.bridge.local import LocalTools
from mcp_sandbox.bridge.stubs import stubs
from mcp_sandbox.protocol import MAX_TOOL_REPLY_CHARS, ToolContentItem, reply_error, reply_ok
from mcp_sandbox.retry import Backoff

logger = logging.getLogger(__name__)

#: How long a call waits for an upstream that is reconnecting.
RECONNECT_WAIT = 5.0
#: Pages of tools/list read at most, so a server that loops its cursor cannot hang us.
MAX_TOOL_PAGES = 100


@asynccontextmanager
async def connect_upstream(config: Upstream) -> AsyncIterator[Client]:
    """An MCP client for one configured upstream: a stdio child process for a command, SSE for a
    URL ending in /sse, else streamable HTTP."""
    if isinstance(config, StdioUpstream):
        params = StdioServerParameters(
            command=config.command, args=config.args, env=config.env or None, cwd=config.cwd
        )
        async with Client(params) as client:
            yield client
    elif config.is_sse:
        async with Client(sse_client(config.url, headers=config.headers or None)) as client:
            yield client
    else:
        http = create_mcp_http_client(headers=config.headers or None)
        async with http, Client(streamable_http_client(config.url, http_client=http)) as client:
            yield client


async def list_all_tools(client: Client) -> list[Tool]:
    """Every tool an upstream lists, across its pages."""
    tools: list[Tool] = []
    cursor: str | None = None
    for _ in range(MAX_TOOL_PAGES):
        listing = await client.list_tools(cursor=cursor)
        tools += listing.tools
        cursor = listing.next_cursor
        if not cursor:
            break
    return tools


class UpstreamConnection:
    """One upstream server, kept connected by `maintain` and reconnected after it fails."""

    def __init__(self, name: str, name_py: str, config: Upstream, on_change: Callable[[], None]) -> None:
        self.name = name
        self.name_py = name_py
        self.config = config
        self.client: Client | None = None
        self.specs: list[ToolSpec] = []
        self.last_error: str | None = None
        #: When it last answered (wall clock), for the error of a call made while it is down.
        self.last_reachable: float | None = None
        self._on_change = on_change
        self._connected = anyio.Event()
        self._broken = anyio.Event()

    def _open(self) -> AbstractAsyncContextManager[Client]:
        return connect_upstream(self.config)

    async def _list_tools(self, client: Client) -> list[ToolSpec]:
        specs: list[ToolSpec] = []
        taken: set[str] = set()
        for tool in await list_all_tools(client):
            name_py = python_name(tool.name, taken)
            taken.add(name_py + "_async")  # each tool's async twin takes that name too
            specs.append(
                tool_spec(
                    self.name,
                    self.name_py,
                    tool.name,
                    name_py,
                    tool.description,
                    tool.input_schema,
                    tool.output_schema,
                )
            )
        return specs

    async def maintain(self) -> None:
        """Connect, list the tools, wait until the connection breaks, and start again."""
        backoff = Backoff()
        while True:
            try:
                async with self._open() as client:
                    self.specs = await self._list_tools(client)
                    self.client, self.last_error = client, None
                    self.last_reachable = time.time()
                    self._on_change()
                    logger.info("upstream %r connected: %d tools", self.name, len(self.specs))
                    self._connected.set()
                    backoff.succeeded()
                    await self._broken.wait()
            except Exception as error:  # noqa: BLE001 - any failure of an upstream means reconnect
                self.last_error = _describe(error)
                backoff.failed()
                logger.warning(
                    "upstream %r unavailable (%s); retrying in %.1f s",
                    self.name,
                    self.last_error,
                    backoff.delay,
                )
            finally:
                if self.client is not None:
                    self.last_reachable = time.time()  # it answered until now
                self.client = None
                self._connected = anyio.Event()
                self._broken = anyio.Event()
            # A connection that broke after working is retried after the shortest wait.
            await anyio.sleep(backoff.delay or backoff.first)

    async def wait_connected(self, limit: float) -> Client | None:
        with anyio.move_on_after(limit):
            await self._connected.wait()
        return self.client

    def mark_broken(self) -> None:
        self._broken.set()

    def down_since(self) -> str:
        """When it was last reachable, in words for an error."""
        if self.last_reachable is None:
            return "it has not been reachable since the server started"
        ago = time.time() - self.last_reachable
        at = time.strftime("%H:%M:%S", time.localtime(self.last_reachable))
        return f"it was last reachable at {at} ({ago:.0f} s ago)"


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return _describe(error.exceptions[0])
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def _media(result: CallToolResult) -> list[ToolContentItem] | None:
    """The result's blocks for the guest to make objects of, when any is an image, audio or a
    resource; None when all are text (the value is then data or text)."""
    if all(isinstance(block, TextContent) for block in result.content):
        return None
    items: list[ToolContentItem] = []
    for block in result.content:
        if isinstance(block, TextContent):
            items.append({"kind": "text", "text": block.text})
        elif isinstance(block, ImageContent | AudioContent):
            items.append({"kind": block.type, "mime_type": block.mime_type, "data": block.data})
        elif isinstance(block, EmbeddedResource):
            resource = block.resource
            item: ToolContentItem = {
                "kind": "resource",
                "mime_type": resource.mime_type,
                "uri": str(resource.uri),
            }
            if isinstance(resource, TextResourceContents):
                item["text"] = resource.text
            else:
                item["data"] = resource.blob
            items.append(item)
        elif isinstance(block, ResourceLink):
            items.append({"kind": "resource_link", "mime_type": block.mime_type, "uri": str(block.uri)})
    return items


def _tool_value(result: CallToolResult, spec: ToolSpec) -> Any:
    """Results as data: the structured content; else one text block that is a JSON object or
    array, parsed (most servers answer JSON as text); else the text."""
    structured = result.structured_content
    if structured is not None:
        if spec.unwrap_result and isinstance(structured, dict) and set(structured) == {"result"}:
            return _parsed(structured["result"])
        return structured
    if len(result.content) == 1 and isinstance(result.content[0], TextContent):
        return _parsed(result.content[0].text)
    return _text(result) if any(isinstance(b, TextContent) for b in result.content) else None


def _parsed(value: Any) -> Any:
    # Only objects and arrays: a tool that answers "42" or "true" as text means the text.
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


class ToolBridge:
    """Every configured upstream, the catalog of their tools, and calls to them."""

    def __init__(self, config: BridgeConfig, call_timeout: float, local: LocalTools | None = None) -> None:
        """`local` (host callables, see bridge/local.py), even empty, reserves `tools.local` for
        them, so they can be replaced later with `set_local_tools`."""
        self.call_timeout = call_timeout
        taken: set[str] = {"ToolError", "describe"}  # the guest's `tools` has these
        if local is not None:
            taken.add(LOCAL_SERVER)
        self.local = local
        self.connections = {
            (
                conn := UpstreamConnection(name, python_name(name, taken), upstream, self._changed)
            ).name_py: conn
            for name, upstream in config.servers.items()
        }
        #: Bumped whenever the catalog changes, so executors know to refresh the guest's `tools`.
        self.version = 0
        self.manifest_json = "[]"
        self._specs: dict[tuple[str, str], ToolSpec] = {}
        self._index = SearchIndex([])
        if self.local is not None:
            self._changed()

    @property
    def specs(self) -> list[ToolSpec]:
        return list(self._specs.values())

    @property
    def has_tools(self) -> bool:
        """Whether anything can be called: a configured upstream, or local tools."""
        return bool(self.connections) or self.local is not None

    def set_local_tools(self, local: LocalTools) -> None:
        """Replace the local tools; each sandbox's `tools.local` follows at its next run."""
        if self.local is None:
            raise RuntimeError(
                "this bridge was made without local tools, so `tools.local` may name an upstream"
            )
        self.local = local
        self._changed()

    def _changed(self) -> None:
        upstream = [spec for conn in self.connections.values() for spec in conn.specs]
        local = self.local.specs if self.local is not None else []
        self._specs = {(spec.server_py, spec.name_py): spec for spec in [*upstream, *local]}
        self._index = SearchIndex(list(self._specs.values()))
        self.manifest_json = json.dumps([spec.manifest() for spec in self._specs.values()])
        self.version += 1

    async def start(self, task_group: anyio.abc.TaskGroup, wait: float) -> None:
        """Start every connection and wait (up to `wait` s) for them to list their tools."""
        for conn in self.connections.values():
            task_group.start_soon(conn.maintain, name=f"upstream {conn.name}")
        with anyio.move_on_after(wait):
            for conn in self.connections.values():
                await conn.wait_connected(wait)
        missing = [conn.name for conn in self.connections.values() if conn.client is None]
        logger.info(
            "tool bridge: %d upstreams, %d tools%s",
            len(self.connections),
            len(self._specs),
            f"; still connecting: {', '.join(missing)}" if missing else "",
        )

    async def call(self, server_py: str, tool_py: str, arguments: Any) -> str:
        """Call one tool; the reply as JSON text. Never raises except on cancellation."""
        if self.local is not None and server_py == LOCAL_SERVER:
            if not isinstance(arguments, dict):
                return reply_error("arguments must be a JSON object")
            return await self.local.call(tool_py, arguments)
        spec = self._specs.get((server_py, tool_py))
        conn = self.connections.get(server_py)
        if conn is None or spec is None:
            return reply_error(f"there is no upstream tool tools.{server_py}.{tool_py}")
        if not isinstance(arguments, dict):
            return reply_error("arguments must be a JSON object")
        waited = min(RECONNECT_WAIT, self.call_timeout)
        client = conn.client or await conn.wait_connected(waited)
        if client is None:
            detail = f" ({conn.last_error})" if conn.last_error else ""
            return reply_error(
                f"upstream {conn.name!r} is down{detail}; {conn.down_since()}; this call waited {waited:g} s "
                f"for it (calls may take {self.call_timeout:g} s: MCP_SANDBOX_BRIDGE_CALL_TIMEOUT); it is "
                "being reconnected, so try again shortly"
            )
        try:
            with anyio.fail_after(self.call_timeout):
                result = await client.call_tool(spec.name, arguments)
        except TimeoutError:
            return reply_error(
                f"{conn.name}.{spec.name} timed out after {self.call_timeout:g} s "
                "(MCP_SANDBOX_BRIDGE_CALL_TIMEOUT)"
            )
        except MCPError as error:
            if error.code == CONNECTION_CLOSED:
                conn.mark_broken()
                return reply_error(f"{conn.name}.{spec.name} failed: the upstream disconnected ({error})")
            return reply_error(f"{conn.name}.{spec.name} failed: {error}")
        except Exception as error:  # noqa: BLE001 - a broken connection: report it and reconnect
            conn.mark_broken()
            return reply_error(f"{conn.name}.{spec.name} failed: upstream disconnected ({_describe(error)})")
        if result.is_error:
            return reply_error(_text(result) or f"{conn.name}.{spec.name} reported an error")
        try:
            media = None if result.structured_content is not None else _media(result)
            reply = reply_ok(None, media) if media is not None else reply_ok(_tool_value(result, spec))
        except (TypeError, ValueError) as error:
            return reply_error(f"{conn.name}.{spec.name} returned data that is not JSON: {error}")
        if len(reply) > MAX_TOOL_REPLY_CHARS:
            return reply_error(
                f"{conn.name}.{spec.name} returned {len(reply):,} characters; the bridge passes at most "
                f"{MAX_TOOL_REPLY_CHARS:,}"
            )
        return reply

    def search(self, query: str, limit: int) -> list[ToolSpec]:
        return self._index.search(query, limit)

    def wrong_calls(self, code: str) -> list[WrongCall]:
        """The calls in `code` that name a server, tool or keyword the catalog does not have; a
        server whose tools are not listed yet (still connecting) is not judged."""
        unlisted = frozenset(conn.name_py for conn in self.connections.values() if not conn.specs)
        return wrong_tool_calls(code, Catalog(self._specs, unlisted))

    def named(self, name: str) -> list[ToolSpec]:
        """The tools `name` names: every tool of a server (`jira`), or a tool (`jira_create_item`,
        `jira.jira_create_item`, `tools.jira.jira_create_item`), by its Python or upstream name."""
        name = name.strip().removeprefix("tools.")
        specs = list(self._specs.values())
        of_server = [spec for spec in specs if name in (spec.server_py, spec.server)]
        if of_server:
            return of_server
        server, dot, tool = name.rpartition(".")
        return [
            spec
            for spec in specs
            if tool in (spec.name_py, spec.name) and (not dot or server in (spec.server_py, spec.server))
        ]

    def describe(self, query: str, limit: int) -> str:
        """tools.describe(query) in the sandbox: the stubs of the tools `query` names, else of the
        best `limit` matches of its words (as search_tools(detail="stub") gives them)."""
        specs = self.named(query) or self.search(query, limit)
        return stubs(specs, f"{len(specs)} of {len(self._specs)} tools")

    def summary(self, most: int = 5) -> str:
        """For the execute_python description: how many tools on which servers, the same few words
        however many tools there are (" (100 tools on jira, github and 3 more)")."""
        if not self._specs:
            return " (no upstream has listed its tools yet)"
        servers = list(dict.fromkeys(spec.server_py for spec in self._specs.values()))
        named = ", ".join(servers[:most]) + (
            f" and {len(servers) - most} more" if len(servers) > most else ""
        )
        return f" ({len(self._specs)} tools on {named})"
