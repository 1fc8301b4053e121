"""Runs inside the sandbox: executes one program and describes its outcome.

The guest side of every backend. The Pyodide worker and the CPython worker load its source
(after mcp_sandbox.protocol) from the ``init`` message, and the in-process executor imports it,
so the rules for final expressions, top-level ``await``, output capping, tracebacks and bridged
tool calls are the same everywhere. Standard library only: it must load inside Pyodide.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import io
import itertools
import linecache
import os
import stat
import sys
import threading
import warnings
from binascii import a2b_base64, b2a_base64
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress

# Bound at import, so a program that patches json or traceback cannot break reporting.
from json import dumps, loads
from time import monotonic
from traceback import FrameSummary, StackSummary, TracebackException, format_exception_only, walk_tb
from types import CodeType, TracebackType
from typing import Any, ClassVar

from mcp_sandbox.protocol import (
    CHECKPOINT_FOLDER,
    DATA_DIR,
    MAX_PROGRESS_LINE_CHARS,
    MAX_SCANNED_FILES,
    OUTPUT_DIR,
    PROGRESS_EVERY_S,
    TRUNCATION_MARKER,
    DescribeMessage,
    GuestFile,
    GuestLimits,
    GuestOutcome,
    KeptText,
    OutputLimits,
    ProgressMessage,
    ToolCallMessage,
    ToolContentItem,
    cap_text,
    closest_hint,
)

CELL_PREFIX = "<cell-"
# Under the Agg backend plt.show() only warns; figures are captured when the program ends.
warnings.filterwarnings("ignore", message=".*non-interactive.*", category=UserWarning)
#: Where this runtime's own frames come from, so tracebacks can leave them out.
RUNTIME_FILES = {globals().get("__file__"), "<mcp_sandbox.backends.guest>"}
#: Frames a traceback shows at most, first and last: reading the source of a million frames of
#: runaway recursion takes longer than the timeout.
TRACEBACK_HEAD_FRAMES, TRACEBACK_TAIL_FRAMES = 30, 30
_ELIDED = "<frames not shown>"


class CappedText(io.TextIOBase):
    """A text stream that keeps the head and the tail, so a flood never fills memory.

    Keeps ``limit`` characters at most: the first half and the last half of everything
    written, and counts what falls between them.
    """

    def __init__(self, limit: int, on_line: Callable[[str], None] | None = None, keep: int = 0) -> None:
        """`keep`: also keep this many characters from the start whole, for when the stream is cut."""
        self._on_line = on_line
        self._keep_limit = keep
        self._kept: list[str] = []
        self._kept_len = 0
        self._partial = ""
        self._reported = 0.0
        self._head_limit = limit - limit // 2
        self._tail_limit = limit // 2
        self._head: list[str] = []
        self._head_len = 0
        self._tail: list[str] = []
        self._tail_len = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        length = len(text)
        self.total += length
        if self._on_line is not None:
            self._note_line(text)
        if self._kept_len < self._keep_limit:
            piece = text[: self._keep_limit - self._kept_len]
            self._kept.append(piece)
            self._kept_len += len(piece)
        room = self._head_limit - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, length)
            text = text[room:]
        if text and self._tail_limit:
            self._tail.append(text[-self._tail_limit :])
            self._tail_len += min(len(text), self._tail_limit)
            if self._tail_len > 2 * self._tail_limit:
                # Compact rarely, so many small writes stay cheap.
                joined = "".join(self._tail)[-self._tail_limit :]
                self._tail = [joined]
                self._tail_len = len(joined)
        return length

    def _note_line(self, text: str) -> None:
        """Tell the host the latest complete line, at most twice a second (for progress reports)."""
        if "\n" not in text:
            self._partial = (self._partial + text)[-MAX_PROGRESS_LINE_CHARS:]
            return
        lines = text.split("\n")
        line = (self._partial + lines[0]) if len(lines) == 2 else lines[-2]
        self._partial = lines[-1][-MAX_PROGRESS_LINE_CHARS:]
        now = monotonic()
        if now - self._reported >= PROGRESS_EVERY_S and self._on_line is not None:
            self._reported = now
            self._on_line(line[-MAX_PROGRESS_LINE_CHARS:])

    @property
    def truncated(self) -> bool:
        return self.total > self._head_limit + self._tail_limit

    def kept(self) -> KeptText | None:
        """The text from its start, up to the keep limit, when the stream was cut; else None."""
        if not self.truncated or not self._keep_limit:
            return None
        return {"text": "".join(self._kept), "total": self.total}

    def getvalue(self) -> str:
        head = "".join(self._head)
        if not self.truncated:
            return head + "".join(self._tail)
        tail = "".join(self._tail)[-self._tail_limit :] if self._tail_limit else ""
        cut = self.total - len(head) - len(tail)
        return head + TRUNCATION_MARKER.format(cut=cut) + tail


class Program:
    """One submitted program, compiled as a REPL cell: the last expression is its value."""

    def __init__(self, code: str, filename: str) -> None:
        self.filename = filename
        # Registered so tracebacks can quote the user's lines, as they can for a file.
        linecache.cache[self.filename] = (len(code), None, code.splitlines(True), self.filename)
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        tree = ast.parse(code, self.filename, "exec")
        last_expr: ast.Expression | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last_expr = ast.Expression(tree.body.pop().value)  # type: ignore[attr-defined]
        self.body: CodeType = compile(tree, self.filename, "exec", flags=flags)
        self.last: CodeType | None = (
            compile(last_expr, self.filename, "eval", flags=flags) if last_expr is not None else None
        )
        self.is_async = any(
            code is not None and code.co_flags & inspect.CO_COROUTINE for code in (self.body, self.last)
        )

    def run(self, namespace: dict[str, Any]) -> Any:
        exec(self.body, namespace)
        return eval(self.last, namespace) if self.last is not None else None

    async def run_async(self, namespace: dict[str, Any]) -> Any:
        pending = eval(self.body, namespace)
        if inspect.iscoroutine(pending):
            await pending
        if self.last is None:
            return None
        value = eval(self.last, namespace)
        return await value if self.last.co_flags & inspect.CO_COROUTINE else value


def _user_traceback(error: BaseException) -> str:
    """The traceback from the first frame of user code on: runner frames say nothing useful."""
    tb: TracebackType | None = error.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith(CELL_PREFIX):
        tb = tb.tb_next
    if isinstance(error, SyntaxError) or tb is None:
        return "".join(format_exception_only(type(error), error))
    most = TRACEBACK_HEAD_FRAMES + TRACEBACK_TAIL_FRAMES
    # Chained exceptions are capped at `most` too; this one keeps its head and its tail.
    report = TracebackException(type(error), error, tb, limit=most)
    frames = list(walk_tb(tb))
    elided = len(frames) - most
    if elided > 0:
        kept = frames[:TRACEBACK_HEAD_FRAMES] + frames[-TRACEBACK_TAIL_FRAMES:]
        report.stack = StackSummary.extract(iter(kept))
        report.stack.insert(TRACEBACK_HEAD_FRAMES, FrameSummary(_ELIDED, 0, str(elided), lookup_line=False))
    # The tool bridge's functions live here; the user's call into them is the frame that matters.
    report.stack = StackSummary.from_list([f for f in report.stack if f.filename not in RUNTIME_FILES])
    text = "".join(report.format())
    return text.replace(
        f'  File "{_ELIDED}", line 0, in {elided}\n', f"  ... {elided} frames not shown ...\n"
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


def _make_tool(spec: dict[str, Any], channel: ToolChannel) -> tuple[Any, Any]:
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
    other: str | None = spec.get("other_keywords")
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


def build_tools(manifest: list[dict[str, Any]], channel: ToolChannel | None) -> Tools:
    servers: dict[str, dict[str, Any]] = {}
    if channel is not None:
        for spec in manifest:
            call, call_async = _make_tool(spec, channel)
            functions = servers.setdefault(spec["server_py"], {})
            functions[spec["name_py"]] = call
            functions[spec["name_py"] + "_async"] = call_async
    return Tools({name: ServerTools(name, functions) for name, functions in servers.items()}, channel)


class Interpreter:
    """The state of one sandbox's Python: its globals, its cell counter, its `tools`."""

    #: output/ belongs to this interpreter alone (a sandbox process), so the scan after one run
    #: serves as the scan before the next; False where interpreters share a working directory.
    private_output: ClassVar[bool] = True

    def __init__(self, limits: GuestLimits, channel: ToolChannel | None = None, inline_files: bool = False):
        """``inline_files``: the host cannot read the sandbox's files (Pyodide), so output files
        travel in the outcome."""
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.namespace["tools"] = Tools({})
        self.namespace["ToolError"] = ToolError
        self.cells = 0
        self.limits = limits
        self.channel = channel
        self.inline_files = inline_files
        #: output/ as the last run left it; valid only where nothing else writes there between runs.
        self._output_after: dict[str, tuple[int, int]] | None = None

    def install_tools(self, manifest_json: str) -> None:
        """Give the interpreter's `tools` the upstream tools listed in ``manifest_json``."""
        self.namespace["tools"] = build_tools(loads(manifest_json), self.channel)

    def run(self, code: str) -> GuestOutcome | Coroutine[Any, Any, GuestOutcome]:
        """Run ``code``; the outcome, with the figures the program left open and the files it
        wrote to output/, or a coroutine for it when the code awaits."""
        before = self._output_after if self.private_output else None
        if before is None:
            before = _scan_output()
        outcome = self._run(code)
        if isinstance(outcome, dict):
            return self._with_artifacts(outcome, before)
        return self._with_artifacts_async(outcome, before)

    async def _with_artifacts_async(
        self, pending: Coroutine[Any, Any, GuestOutcome], before: dict[str, tuple[int, int]]
    ) -> GuestOutcome:
        return self._with_artifacts(await pending, before)

    def _with_artifacts(self, outcome: GuestOutcome, before: dict[str, tuple[int, int]]) -> GuestOutcome:
        output: OutputLimits = self.limits["output"]
        budget = output["max_bytes"]
        notes: list[str] = []
        figures, budget = _collect_figures(output["max_figures"], budget, notes)
        self._output_after = after = _scan_output()
        files = _collect_files(before, after, output["max_files"], budget, self.inline_files, notes)
        outcome["figures"], outcome["files"], outcome["notes"] = figures, files, notes
        return outcome

    def _run(self, code: str) -> GuestOutcome | Coroutine[Any, Any, GuestOutcome]:
        self.cells += 1
        report = self.channel.progress if self.channel is not None else None
        max_output_chars, keep = self.limits["max_output_chars"], self.limits["max_kept_output_chars"]
        stdout = CappedText(max_output_chars, report, keep)
        stderr = CappedText(max_output_chars, report, keep)
        try:
            program = Program(code, f"{CELL_PREFIX}{self.cells}>")
        except BaseException as error:  # noqa: BLE001 - a SyntaxError is the caller's outcome
            return _outcome(stdout, stderr, max_output_chars, error=error)
        if program.is_async:
            return self._run_async(program, stdout, stderr, max_output_chars)
        try:
            with self.capturing(stdout, stderr):
                value = program.run(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return _outcome(stdout, stderr, max_output_chars, error=_as_interrupt(error))
        return _outcome(stdout, stderr, max_output_chars, value=value)

    async def _run_async(
        self, program: Program, stdout: CappedText, stderr: CappedText, max_output_chars: int
    ) -> GuestOutcome:
        try:
            with self.capturing(stdout, stderr):
                value = await program.run_async(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return _outcome(stdout, stderr, max_output_chars, error=_as_interrupt(error))
        return _outcome(stdout, stderr, max_output_chars, value=value)

    @contextmanager
    def capturing(self, stdout: CappedText, stderr: CappedText) -> Iterator[None]:
        """Send the program's sys.stdout and sys.stderr to the run's streams, and give it a
        sys.stdin with nothing to read.

        A sandbox process has one program at a time, so swapping the sys attributes is enough;
        the in-process executor overrides this to route per thread.
        """
        saved = sys.stdout, sys.stderr, sys.stdin
        sys.stdout, sys.stderr, sys.stdin = stdout, stderr, NO_INPUT
        try:
            yield
        finally:
            sys.stdout, sys.stderr, sys.stdin = saved


class NoInput(io.TextIOBase):
    """A sandbox's stdin: nobody is there to type, so reading fails at once instead of waiting
    for the timeout."""

    MESSAGE = (
        "there is no input in the sandbox: input() and sys.stdin have nothing to read "
        "(put the data in the code, or read it from data/)"
    )

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        raise EOFError(self.MESSAGE)

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        raise EOFError(self.MESSAGE)

    def fileno(self) -> int:
        raise io.UnsupportedOperation(self.MESSAGE)


NO_INPUT = NoInput()


def install_waits(wait: Callable[[float], None]) -> None:
    """(Pyodide) Make the standard library's waits sleep in `wait`, which blocks without using
    the CPU and raises KeyboardInterrupt when the run is interrupted, instead of spinning.

    Covers time.sleep (however imported, as this runs before any program), select.select with
    no files, and every timed wait of threading and queue (Condition.wait sleeps on a fresh lock,
    which with one thread nothing can release meanwhile)."""
    import select
    import time

    def sleep(seconds: Any) -> None:
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        wait(float(seconds))

    real_select = select.select

    def select_files(rlist: Any, wlist: Any, xlist: Any, timeout: float | None = None) -> Any:
        if rlist or wlist or xlist:
            return real_select(rlist, wlist, xlist, timeout)
        sleep(float("inf") if timeout is None else timeout)
        return [], [], []

    real_lock = threading._allocate_lock  # type: ignore[attr-defined]

    class SleepingLock:
        __slots__ = ("_lock",)

        def __init__(self) -> None:
            self._lock = real_lock()

        def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
            if self._lock.acquire(False):
                return True
            if not blocking:
                return False
            sleep(float("inf") if timeout < 0 else timeout)
            return bool(self._lock.acquire(False))

        def release(self) -> None:
            self._lock.release()

        def locked(self) -> bool:
            return bool(self._lock.locked())

        __enter__ = acquire

        def __exit__(self, *exc: object) -> None:
            self._lock.release()

    time.sleep = sleep
    select.select = select_files
    threading._allocate_lock = SleepingLock  # type: ignore[attr-defined]


#: (Pyodide) This run was interrupted while its program awaited, and its tasks were cancelled.
_interrupted = False


def _as_interrupt(error: BaseException) -> BaseException:
    """A cancellation by `cancel_run` is the run's interrupt, as when the program computes."""
    return KeyboardInterrupt() if _interrupted and type(error).__name__ == "CancelledError" else error


#: (Pyodide) Tasks pending when the run began: earlier runs' work, which its interrupt leaves be.
_earlier_tasks: set[Any] = set()


def _pending_tasks() -> set[Any]:
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return set()  # never imported: no task exists
    return {task for task in asyncio.all_tasks(asyncio.get_event_loop()) if not task.done()}


def note_tasks() -> None:
    """(Pyodide) Before a run: remember the tasks earlier runs left pending."""
    global _earlier_tasks
    _earlier_tasks = _pending_tasks()


def cancel_run() -> bool:
    """(Pyodide) The run was interrupted while its program awaited (a top-level `await`, or
    asyncio.run blocked through stack switching): cancel the tasks it started, so it ends with
    KeyboardInterrupt. False when it had none pending."""
    global _interrupted
    pending = _pending_tasks() - _earlier_tasks
    for task in pending:
        task.cancel()
    _interrupted = _interrupted or bool(pending)
    return bool(pending)


def _scan_output() -> dict[str, tuple[int, int]]:
    """Regular files under output/ (not following links): relative path -> (size, mtime)."""
    found: dict[str, tuple[int, int]] = {}
    if not os.path.isdir(OUTPUT_DIR):
        return found
    for root, _dirs, names in os.walk(OUTPUT_DIR):
        for name in names:
            if len(found) >= MAX_SCANNED_FILES:
                return found
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[os.path.relpath(path, OUTPUT_DIR)] = (info.st_size, info.st_mtime_ns)
    return found


def _collect_figures(limit: int, budget: int, notes: list[str]) -> tuple[list[str], int]:
    """The open matplotlib figures as base64 PNGs (then closed), within the count and byte caps."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return [], budget
    figures: list[str] = []
    try:
        numbers = list(pyplot.get_fignums())
        for number in numbers[:limit]:
            buffer = io.BytesIO()
            pyplot.figure(number).savefig(buffer, format="png", dpi=100)
            image = buffer.getvalue()
            if len(image) > budget:
                notes.append(f"figure {number} left out: over the output size cap")
                continue
            budget -= len(image)
            figures.append(b2a_base64(image, newline=False).decode("ascii"))
        if len(numbers) > limit:
            notes.append(f"{len(numbers) - limit} figures left out: at most {limit} per call")
    except Exception as error:  # noqa: BLE001 - a broken figure must not lose the run's result
        notes.append(f"figures could not be saved: {type(error).__name__}: {error}")
    finally:
        pyplot.close("all")
    return figures, budget


def _collect_files(
    before: dict[str, tuple[int, int]],
    after: dict[str, tuple[int, int]],
    limit: int,
    budget: int,
    inline: bool,
    notes: list[str],
) -> list[GuestFile]:
    """The files in output/ that this run created or changed, within the count and byte caps."""
    changed = sorted(path for path, signature in after.items() if before.get(path) != signature)
    files: list[GuestFile] = []
    for path in changed[:limit]:
        size = after[path][0]
        if size > budget:
            notes.append(f"output/{path} ({size:,} bytes) left out: over the output size cap")
            continue
        entry: GuestFile = {"path": path, "size": size}
        if inline:
            try:
                with open(os.path.join(OUTPUT_DIR, path), "rb") as handle:
                    data = handle.read(budget + 1)
            except OSError as error:
                notes.append(f"output/{path} could not be read: {error}")
                continue
            if len(data) > budget:
                notes.append(f"output/{path} left out: over the output size cap")
                continue
            entry["size"] = len(data)
            entry["data"] = b2a_base64(data, newline=False).decode("ascii")
        budget -= entry["size"]
        files.append(entry)
    if len(changed) > limit:
        notes.append(f"{len(changed) - limit} files in output/ left out: at most {limit} per call")
    return files


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.truncate": 1,
    "os.utime": 1,
    "os.rename": 2,
    "os.link": 2,
    "os.symlink": 2,
}


def protect_read_only(folder: str) -> None:
    """Refuse, from now on, every write to `folder` made through Python's file functions.

    An audit hook: it stops a program's mistakes and ordinary writes, not a determined one
    (ctypes can make system calls directly). The CPython backends are not walls (see README).
    """
    root = os.path.realpath(folder)

    def inside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and inside(path):
                raise PermissionError(f"data/ is read-only: cannot write {os.fsdecode(path)}")
        elif event in _CHANGES and any(inside(arg) for arg in args[: _CHANGES[event]]):
            raise PermissionError(f"data/ is read-only: {event} refused")

    sys.addaudithook(hook)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except BaseException as error:  # noqa: BLE001 - a broken __repr__ must not lose the run
        return f"<repr() failed: {type(error).__name__}: {error}>"


def _outcome(
    stdout: CappedText,
    stderr: CappedText,
    max_output_chars: int,
    *,
    value: Any = None,
    error: BaseException | None = None,
) -> GuestOutcome:
    """The guest's half of the result: what only the sandbox can know."""
    result: str | None = None
    truncated = stdout.truncated or stderr.truncated
    error_type: str | None = None
    message: str | None = None
    if isinstance(error, SystemExit) and error.code in (None, 0):
        error = None  # sys.exit(0) is how a script says it succeeded.
    if error is not None:
        error_type = type(error).__name__
        message, cut = cap_text(_user_traceback(error), max_output_chars)
        truncated = truncated or cut
    elif value is not None:
        result, cut = cap_text(_safe_repr(value), max_output_chars)
        truncated = truncated or cut
    outcome: GuestOutcome = {
        "success": error is None,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "result": result,
        "error_type": error_type,
        "error": message,
        "truncated": truncated,
    }
    if (kept := stdout.kept()) is not None:
        outcome["kept_stdout"] = kept
    if (kept := stderr.kept()) is not None:
        outcome["kept_stderr"] = kept
    return outcome


def interrupted_outcome(error: BaseException) -> GuestOutcome:
    """The outcome of a run whose interrupt landed outside the program (in the runner's own code)."""
    name = type(error).__name__
    return {
        "success": False,
        "stdout": "",
        "stderr": "",
        "result": None,
        "error_type": name,
        "error": f"{name}: {error}" if str(error) else name,
        "truncated": False,
    }


def deliver(channel: ToolChannel, call: int, reply: str) -> None:
    """`channel.deliver`, for runners that must not read a method off a proxy (see worker.ts)."""
    channel.deliver(call, reply)


def run_json(interpreter: Interpreter, code: str, tools_manifest: str | None = None) -> str | Any:
    """A run for runners that speak JSON: the outcome as JSON text, or an awaitable of it."""
    global _interrupted
    _interrupted = False
    if tools_manifest is not None:
        interpreter.install_tools(tools_manifest)
    outcome = interpreter.run(code)
    if isinstance(outcome, dict):
        return dumps(outcome)
    return _dump_when_done(outcome)


async def _dump_when_done(pending: Coroutine[Any, Any, GuestOutcome]) -> str:
    return dumps(await pending)


#: A small program touching what most programs use: the compiler, calls, comprehensions,
#: strings, dicts, printing, repr and JSON (the runtime's own reporting).
WARM_UP_PROGRAM = """
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
rows = [{"n": i, "name": f"item {i}", "square": i * i} for i in range(40)]
total = sum(row["square"] for row in rows if row["n"] % 3)
print(total, fib(9), ",".join(str(row) for row in rows[:3]))
{key: value for key, value in sorted(rows[7].items())}
"""
#: Cells numbered from here on are the warm-up's, never a user's (tracebacks quote cells).
WARM_UP_FIRST_CELL = 1_000_000_000
#: The warm-up takes the same path as a run, artifacts included, but hands nothing back.
WARM_UP_LIMITS: GuestLimits = {
    "max_output_chars": 1000,
    "max_kept_output_chars": 0,
    "output": {"max_files": 0, "max_bytes": 0, "max_figures": 0},
}


def jit_warm_up(rounds: int) -> None:
    """Run WARM_UP_PROGRAM `rounds` times in a throwaway interpreter, so a JIT (V8 compiling
    Pyodide's WebAssembly) has compiled the hot paths before the user's next call.

    With max_figures 0 nothing is saved, and no figure is open between runs (each run closes them).
    """
    interpreter = Interpreter(WARM_UP_LIMITS)
    interpreter.cells = WARM_UP_FIRST_CELL
    for _ in range(rounds):
        dumps(interpreter.run(WARM_UP_PROGRAM))
        linecache.cache.pop(f"{CELL_PREFIX}{interpreter.cells}>", None)


# --- Checkpoints of a CPython sandbox (Pyodide's are its memory: checkpoint.ts) ---

#: Names every interpreter has from the start; a restore keeps the new sandbox's own.
_OWN_NAMES = frozenset({"__builtins__", "tools", "ToolError"})
#: Folders of the working directory a checkpoint leaves out: per call, the host's, its own.
_NOT_SAVED = frozenset({OUTPUT_DIR, DATA_DIR, CHECKPOINT_FOLDER})


def _pickler() -> Any:
    """cloudpickle where the sandbox has it (functions, classes and lambdas defined in the
    session travel by value), else the standard library's pickle."""
    try:
        import cloudpickle  # type: ignore[import-untyped, import-not-found, unused-ignore]

        return cloudpickle
    except ImportError:
        import pickle

        return pickle


def save_session(interpreter: Interpreter, file: str) -> tuple[int, list[str]]:
    """Write the session's variables and the files of its working directory to
    CHECKPOINT_FOLDER/`file`; (bytes written, what a restore will not bring back).

    Variables are pickled together, so two names for one object stay one object; the ones that
    cannot be pickled (an open file, a generator, a lock) are left out and named.
    """
    import io as _io
    import pickle
    import tarfile

    pickler = _pickler()
    names = {name: value for name, value in interpreter.namespace.items() if name not in _OWN_NAMES}
    lost: list[str] = []
    try:
        variables = pickler.dumps(names, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - find which names cannot be pickled
        kept = {}
        for name, value in names.items():
            try:
                pickler.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                kept[name] = value
            except Exception as error:  # noqa: BLE001 - any failure means "cannot be saved"
                lost.append(f"{name} ({type(error).__name__}: {str(error)[:80]})")
        variables = pickler.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)
    if lost:
        lost = [f"variables that cannot be pickled are not in the checkpoint: {', '.join(lost[:10])}"]
    home = os.path.realpath(os.environ.get("HOME", "."))
    files = _io.BytesIO()
    with tarfile.open(fileobj=files, mode="w") as archive:
        for entry in sorted(os.listdir(home)):
            if entry not in _NOT_SAVED:
                archive.add(os.path.join(home, entry), arcname=entry)  # links stay links
    cwd = os.path.relpath(os.getcwd(), home)
    state = {
        "format": 1,
        "cells": interpreter.cells,
        "variables": variables,
        "files": files.getvalue(),
        "cwd": cwd,
    }
    os.makedirs(os.path.join(home, CHECKPOINT_FOLDER), mode=0o700, exist_ok=True)
    path = os.path.join(home, CHECKPOINT_FOLDER, file)
    with open(path, "wb") as out:
        out.write(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        written = out.tell()
    return written, lost


def load_session(interpreter: Interpreter, file: str) -> None:
    """Put the checkpoint in CHECKPOINT_FOLDER/`file` (which is then deleted) into this fresh
    interpreter and working directory. Unpickling happens here, inside the sandbox, never on the host."""
    import io as _io
    import pickle
    import tarfile

    home = os.path.realpath(os.environ.get("HOME", "."))
    path = os.path.join(home, CHECKPOINT_FOLDER, file)
    try:
        with open(path, "rb") as source:
            state = pickle.loads(source.read())
    finally:
        with suppress(OSError):
            os.unlink(path)
    if not isinstance(state, dict) or state.get("format") != 1:
        raise ValueError("the checkpoint is not one this sandbox can read")
    _pickler()  # cloudpickle's functions must be importable before its pickles load
    variables = pickle.loads(state["variables"])
    with tarfile.open(fileobj=_io.BytesIO(state["files"])) as archive:
        archive.extractall(home, filter="data")  # nothing lands outside the working directory
    cwd = os.path.realpath(os.path.join(home, state["cwd"]))
    if cwd == home or cwd.startswith(home + os.sep):
        with suppress(OSError):
            os.chdir(cwd)
    interpreter.namespace.update(variables)
    interpreter.cells = int(state["cells"])
    interpreter._output_after = None  # the next run scans output/ afresh
