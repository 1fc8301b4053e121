"""The program's `tools`: the upstream tools as Python functions, and the channel their calls
and the program's progress travel to the host on."""

from __future__ import annotations

import inspect
import itertools
import threading
from binascii import a2b_base64
from collections.abc import Callable
from contextlib import suppress

# Bound at import, so a program that patches json cannot break a call.
from json import dumps, loads
from typing import Any

from mcp_sandbox.protocol import (
    DescribeMessage,
    ManifestTool,
    ProgressMessage,
    ToolCallMessage,
    ToolContentItem,
    closest_hint,
)


class ToolError(RuntimeError):
    """A bridged tool call failed: the message is the upstream's, or the bridge's, reason. A
    RuntimeError, so code written for DSPy's interpreter (`except RuntimeError`) catches it too."""


ToolError.__module__ = "tools"  # shown as tools.ToolError, the name code can catch it by


class ToolContent:
    """An image, audio clip, resource or resource link a tool returned. `data`: the bytes (an
    image, audio, a binary resource) or the text (a text resource); `mime_type`; `uri` (a
    resource's, or a link's); `kind`: image, audio, resource or resource_link."""

    __slots__ = ("data", "kind", "mime_type", "uri")

    def __init__(self, item: ToolContentItem) -> None:
        self.kind = item["kind"]
        self.mime_type = item.get("mime_type")
        self.uri = item.get("uri")
        self.data: bytes | str | None = item.get("text")
        if "data" in item:
            self.data = a2b_base64(item["data"])

    def __repr__(self) -> str:
        size = ""
        if self.data is not None:
            size = f"{len(self.data):,} {'bytes' if isinstance(self.data, bytes) else 'characters'}"
        described = [self.mime_type or "", self.uri or "", size]
        return f"<tools.ToolContent {self.kind}: {', '.join(part for part in described if part)}>"


ToolContent.__module__ = "tools"


class ToolChannel:
    """The guest's end of bridged tool calls and progress, the same in every runner.

    A runner gives it ``send``, which carries one RunnerMessage (JSON text) to the host, and
    answers each tool_call by calling ``deliver`` with the host's reply. A blocking call waits
    on a thread event, unless the runner gives ``block`` (Pyodide has no second thread to
    deliver from: it sends the message itself and sleeps until the reply is in shared memory).
    A reply is a ToolReply as JSON text; an interrupted wait raises KeyboardInterrupt.
    """

    def __init__(self, send: Callable[[str], None], block: Callable[[int, str], str] | None = None) -> None:
        self._send = send
        self._block = block
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()  # program threads may call tools too
        self._waiting: dict[int, Callable[[str], None]] = {}

    def progress(self, line: str) -> None:
        """The latest line the program printed; the host shows it in progress reports."""
        message: ProgressMessage = {"type": "progress", "line": line}
        self._send(dumps(message))

    def _request(self, server: str, tool: str, arguments: str) -> tuple[int, str]:
        call = next(self._numbers)
        message: ToolCallMessage = {
            "type": "tool_call",
            "call": call,
            "server": server,
            "tool": tool,
            "arguments": arguments,
        }
        return call, dumps(message)

    def call_sync(self, server: str, tool: str, arguments: str) -> str:
        return self._exchange(*self._request(server, tool, arguments))

    def describe(self, query: str, limit: int) -> str:
        """The host's stubs of the tools `query` names, as a ToolReply (JSON text)."""
        call = next(self._numbers)
        message: DescribeMessage = {"type": "describe", "call": call, "query": query, "limit": limit}
        return self._exchange(call, dumps(message))

    def _exchange(self, call: int, message: str) -> str:
        """Send `message` (request number `call`) and wait for the host's reply."""
        if self._block is not None:
            return self._block(call, message)
        replies: list[str] = []
        done = threading.Event()

        def resolve(reply: str) -> None:
            replies.append(reply)
            done.set()

        with self._lock:
            self._waiting[call] = resolve
        try:
            self._send(message)
            # The CPython worker's SIGINT ends the wait; in-process, the host cancels the call at
            # the deadline, whose reply ends it, and then the interrupt lands.
            done.wait()
        finally:
            with self._lock:
                self._waiting.pop(call, None)
        return replies[0]

    def call_async(self, server: str, tool: str, arguments: str) -> Any:
        import asyncio  # imported when first needed: most programs never call a tool

        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def settle(reply: str) -> None:
            if not future.done():
                future.set_result(reply)

        def resolve(reply: str) -> None:
            with suppress(RuntimeError):  # the program's loop is closed: nobody is waiting
                loop.call_soon_threadsafe(settle, reply)

        call, message = self._request(server, tool, arguments)
        with self._lock:
            self._waiting[call] = resolve
        self._send(message)
        return future

    def deliver(self, call: int, reply: str) -> None:
        """The host's reply to tool_call ``call``, from whichever thread the runner reads on."""
        with self._lock:
            resolve = self._waiting.pop(call, None)
        if resolve is not None:
            resolve(reply)


_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}
_TYPES["None"] = type(None)


def _annotation(text: str, optional: bool) -> Any:
    names = text.split(" | ") + (["None"] if optional else [])
    if any(name not in _TYPES for name in names):
        return Any
    annotation = _TYPES[names[0]]
    for name in names[1:]:
        annotation = annotation | _TYPES[name]
    return annotation


def _unpack(reply_text: str) -> Any:
    reply = loads(reply_text)
    if reply.get("ok"):
        if "content" not in reply:
            return reply.get("value")
        # Text blocks stay strings beside the images and resources; one block comes alone.
        items = [item["text"] if item["kind"] == "text" else ToolContent(item) for item in reply["content"]]
        return items[0] if len(items) == 1 else items
    if reply.get("interrupted"):
        raise KeyboardInterrupt
    raise ToolError(reply.get("error") or "the tool call failed")


def _make_tool(spec: ManifestTool, channel: ToolChannel) -> tuple[Any, Any]:
    """The sync function and its async twin for one upstream tool, with a real signature."""
    server, tool = spec["server_py"], spec["name_py"]
    ordered = [p for p in spec["params"] if p["required"]] + [p for p in spec["params"] if not p["required"]]
    parameters = [
        inspect.Parameter(
            p["py"],
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            default=inspect.Parameter.empty if p["required"] else None,
            annotation=_annotation(p["annotation"], not p["required"]),
        )
        for p in ordered
    ]
    upstream_names = {p["py"]: p["name"] for p in ordered}
    # The schema takes properties it does not list (additionalProperties): they go as given.
    other = spec.get("other_keywords")
    if other is not None:
        parameters.append(inspect.Parameter(other, inspect.Parameter.VAR_KEYWORD))
    signature = inspect.Signature(parameters)
    optional = {p["py"] for p in ordered if not p["required"]}

    def encode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(
                f"tools.{server}.{tool}{signature}: {error}{_argument_hint(args, kwargs)}"
            ) from None
        arguments = {
            upstream_names[k]: v
            for k, v in bound.arguments.items()
            if k != other and not (v is None and k in optional)
        }
        if other is not None:
            arguments |= bound.arguments.get(other, {})
        try:
            return dumps(arguments)
        except (TypeError, ValueError) as error:
            raise TypeError(f"arguments to tools.{server}.{tool} must be JSON data: {error}") from None

    def _argument_hint(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        known = list(signature.parameters)
        unknown = [name for name in kwargs if name not in signature.parameters]
        hints = [f"{name!r} is not one of its arguments{closest_hint(name, known)}" for name in unknown]
        given = set(known[: len(args)]) | set(kwargs)
        missing = [p for p in ordered if p["required"] and p["py"] not in given]
        hints += [f"{p['py']!r} ({p['annotation']}) is required" for p in missing]
        return "; " + "; ".join(hints) if hints else ""

    def call(*args: Any, **kwargs: Any) -> Any:
        return _unpack(channel.call_sync(server, tool, encode(args, kwargs)))

    async def call_async(*args: Any, **kwargs: Any) -> Any:
        return _unpack(await channel.call_async(server, tool, encode(args, kwargs)))

    functions: tuple[Any, Any] = (call, call_async)
    for function, name in zip(functions, (tool, tool + "_async"), strict=True):
        function.__name__ = function.__qualname__ = name
        function.__doc__ = spec["doc"]
        function.__module__ = f"tools.{server}"
        function.__signature__ = signature  # help() and inspect show the tool's parameters
    return functions


class ServerTools:
    """The tools of one upstream server: `tools.<server>.<tool>(...)`."""

    def __init__(self, name: str, functions: dict[str, Any]) -> None:
        self.__dict__.update(functions)
        self._server = name

    def __repr__(self) -> str:
        names = [n for n in vars(self) if not n.startswith("_") and not n.endswith("_async")]
        return f"<tools.{self._server}: {', '.join(names)}>"

    def __getattr__(self, name: str) -> Any:
        twins = name.endswith("_async")
        tools = [n for n in vars(self) if not n.startswith("_") and n.endswith("_async") == twins]
        raise AttributeError(f"the {self._server} server has no tool {name!r}{closest_hint(name, tools)}")


class StubText(str):
    """Python stubs, shown as the code they are (a REPL's last line shows them unescaped)."""

    def __repr__(self) -> str:
        return str(self)


class Tools:
    """The upstream MCP servers' tools: call ``tools.<server>.<tool>(**arguments)``, or
    ``await tools.<server>.<tool>_async(...)`` to run several at once with asyncio.gather.
    ``help(tools.<server>.<tool>)`` shows a tool's parameters, ``tools.describe("words")`` Python
    stubs of the tools they name; failures raise ToolError."""

    ToolError = ToolError
    ToolContent = ToolContent

    def __init__(self, servers: dict[str, ServerTools], channel: ToolChannel | None = None) -> None:
        self.__dict__.update(servers)
        self.__channel = channel  # mangled: no server name can clash with it

    def describe(self, query: Any = "", limit: int = 5) -> StubText:
        """Python stubs (TypedDicts of the arguments and results, and the signatures) of the tools
        ``query`` names: a server (all its tools), a tool (``"jira_create_item"``,
        ``"jira.jira_create_item"``, or the function itself), else the best ``limit`` matches of its
        words. The same text as search_tools(detail="stub"); print it."""
        if isinstance(query, ServerTools):
            query = query._server
        elif callable(query) and str(getattr(query, "__module__", "")).startswith("tools."):
            name = query.__name__
            if inspect.iscoroutinefunction(query):  # the async twin describes its tool
                name = name.removesuffix("_async")
            query = f"{query.__module__}.{name}"
        if not isinstance(query, str):
            raise TypeError(f"tools.describe() takes a name or words, not {type(query).__name__}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"tools.describe() limit must be a positive int, not {limit!r}")
        channel = self.__channel
        if channel is None:
            raise ToolError("no upstream MCP servers are configured")
        return StubText(_unpack(channel.describe(query, limit)))

    def __repr__(self) -> str:
        servers = [repr(v) for k, v in vars(self).items() if isinstance(v, ServerTools)]
        return "\n".join(servers) if servers else "<tools: no upstream MCP servers are configured>"

    def __getattr__(self, name: str) -> Any:
        servers = [k for k, v in vars(self).items() if isinstance(v, ServerTools)]
        if not servers:
            raise AttributeError(f"there is no upstream MCP server {name!r}; none is configured")
        raise AttributeError(f"there is no upstream MCP server {name!r}{closest_hint(name, servers)}")


def build_tools(manifest: list[ManifestTool], channel: ToolChannel | None) -> Tools:
    """The `tools` a program gets for the tool manifest; with no channel to the host, none."""
    servers: dict[str, dict[str, Any]] = {}
    if channel is not None:
        for spec in manifest:
            call, call_async = _make_tool(spec, channel)
            functions = servers.setdefault(spec["server_py"], {})
            functions[spec["name_py"]] = call
            functions[spec["name_py"] + "_async"] = call_async
    return Tools({name: ServerTools(name, functions) for name, functions in servers.items()}, channel)
