"""Runs inside the sandbox: executes one program and describes its outcome.

This file is the guest side of every backend. Pyodide receives its source at start-up,
the CPython worker imports it, and the in-process executor calls it directly, so the
rules for final expressions, top-level ``await``, output capping and tracebacks are the
same everywhere. Standard library only: it must load inside Pyodide with nothing else.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import io
import linecache
import os
import stat
import sys
import warnings
from binascii import b2a_base64
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager

# Bound at import, so a program that patches json or traceback cannot break reporting.
from json import dumps, loads
from time import monotonic
from traceback import StackSummary, TracebackException, format_exception_only
from types import CodeType, TracebackType
from typing import Any, ClassVar, Protocol

CELL_PREFIX = "<cell-"
#: Files written here (relative to the working directory) come back with the result.
OUTPUT_DIR = "output"
#: A program that leaves more files than this in output/ is not scanned further.
MAX_SCANNED_FILES = 10_000
# Under the Agg backend plt.show() only warns; figures are captured when the program ends.
warnings.filterwarnings("ignore", message=".*non-interactive.*", category=UserWarning)
#: Where this file's own frames come from, so tracebacks can leave them out.
RUNTIME_FILES = {"<guest_runtime>", globals().get("__file__")}
TRUNCATION_MARKER = "\n... [{cut:,} characters truncated] ...\n"


class CappedText(io.TextIOBase):
    """A text stream that keeps the head and the tail, so a flood never fills memory.

    Keeps ``limit`` characters at most: the first half and the last half of everything
    written, and counts what falls between them.
    """

    def __init__(self, limit: int, on_line: Callable[[str], None] | None = None) -> None:
        self._on_line = on_line
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
            self._partial = (self._partial + text)[-200:]
            return
        lines = text.split("\n")
        line = (self._partial + lines[0]) if len(lines) == 2 else lines[-2]
        self._partial = lines[-1][-200:]
        now = monotonic()
        if now - self._reported >= 0.5 and self._on_line is not None:
            self._reported = now
            self._on_line(line[-200:])

    @property
    def truncated(self) -> bool:
        return self.total > self._head_limit + self._tail_limit

    def getvalue(self) -> str:
        head = "".join(self._head)
        if not self.truncated:
            return head + "".join(self._tail)
        tail = "".join(self._tail)[-self._tail_limit :] if self._tail_limit else ""
        cut = self.total - len(head) - len(tail)
        return head + TRUNCATION_MARKER.format(cut=cut) + tail


def cap_text(text: str, limit: int) -> tuple[str, bool]:
    """Cap an already-built string the same way CappedText caps a stream."""
    stream = CappedText(limit)
    stream.write(text)
    return stream.getvalue(), stream.truncated


class Program:
    """One submitted program, compiled as a REPL cell: the last expression is its value."""

    def __init__(self, code: str, cell: int) -> None:
        self.filename = f"{CELL_PREFIX}{cell}>"
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
    report = TracebackException(type(error), error, tb)
    # The tool bridge's functions live here; the user's call into them is the frame that matters.
    report.stack = StackSummary.from_list([f for f in report.stack if f.filename not in RUNTIME_FILES])
    return "".join(report.format())


class ToolError(Exception):
    """A bridged tool call failed: the message is the upstream's, or the bridge's, reason."""


ToolError.__module__ = "tools"  # shown as tools.ToolError, the name code can catch it by


class ToolTransport(Protocol):
    """How a sandbox carries bridged calls to the host; each runner provides one.

    Both take (server, tool, arguments as JSON text) and give the host's reply as JSON text:
    ``{"ok": true, "value": ...}``, ``{"ok": false, "error": "..."}``, or, when the execution
    was interrupted while waiting, ``{"ok": false, "interrupted": true}``.
    """

    def call_sync(self, server: str, tool: str, arguments: str) -> str: ...

    def call_async(self, server: str, tool: str, arguments: str) -> Any: ...

    def progress(self, line: str) -> None:
        """The latest line the program printed; the host shows it in progress reports."""


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
        return reply.get("value")
    if reply.get("interrupted"):
        raise KeyboardInterrupt
    raise ToolError(reply.get("error") or "the tool call failed")


def _make_tool(spec: dict[str, Any], transport: ToolTransport) -> tuple[Any, Any]:
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
    signature = inspect.Signature(parameters)
    upstream_names = {p["py"]: p["name"] for p in ordered}
    optional = {p["py"] for p in ordered if not p["required"]}

    def encode(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"tools.{server}.{tool}{signature}: {error}") from None
        arguments = {
            upstream_names[k]: v for k, v in bound.arguments.items() if not (v is None and k in optional)
        }
        try:
            return dumps(arguments)
        except (TypeError, ValueError) as error:
            raise TypeError(f"arguments to tools.{server}.{tool} must be JSON data: {error}") from None

    def call(*args: Any, **kwargs: Any) -> Any:
        return _unpack(transport.call_sync(server, tool, encode(args, kwargs)))

    async def call_async(*args: Any, **kwargs: Any) -> Any:
        return _unpack(await transport.call_async(server, tool, encode(args, kwargs)))

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
        tools = [n for n in vars(self) if not n.startswith("_") and not n.endswith("_async")]
        raise AttributeError(f"the {self._server} server has no tool {name!r}; it has: {', '.join(tools)}")


class Tools:
    """The upstream MCP servers' tools: call ``tools.<server>.<tool>(**arguments)``, or
    ``await tools.<server>.<tool>_async(...)`` to run several at once with asyncio.gather.
    ``help(tools.<server>.<tool>)`` shows a tool's parameters; failures raise ToolError."""

    ToolError = ToolError

    def __init__(self, servers: dict[str, ServerTools]) -> None:
        self.__dict__.update(servers)

    def __repr__(self) -> str:
        servers = [repr(v) for k, v in vars(self).items() if isinstance(v, ServerTools)]
        return "\n".join(servers) if servers else "<tools: no upstream MCP servers are configured>"

    def __getattr__(self, name: str) -> Any:
        servers = [k for k, v in vars(self).items() if isinstance(v, ServerTools)]
        known = f"the configured servers are: {', '.join(servers)}" if servers else "none is configured"
        raise AttributeError(f"there is no upstream MCP server {name!r}; {known}")


def build_tools(manifest: list[dict[str, Any]], transport: ToolTransport | None) -> Tools:
    servers: dict[str, dict[str, Any]] = {}
    if transport is not None:
        for spec in manifest:
            call, call_async = _make_tool(spec, transport)
            functions = servers.setdefault(spec["server_py"], {})
            functions[spec["name_py"]] = call
            functions[spec["name_py"] + "_async"] = call_async
    return Tools({name: ServerTools(name, functions) for name, functions in servers.items()})


class Session:
    """The interpreter state of one sandbox session: its globals and its cell counter."""

    #: output/ belongs to this session alone (a sandbox process), so the scan after one run
    #: serves as the scan before the next; False where sessions share a working directory.
    private_output: ClassVar[bool] = True

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self.namespace["tools"] = Tools({})
        self.namespace["ToolError"] = ToolError
        self.cells = 0
        #: True where the host cannot read the sandbox's files (Pyodide): send them in the outcome.
        self.inline_files = False
        #: Where the latest line of output goes while a program runs (the runner's transport).
        self.report_line: Callable[[str], None] | None = None
        #: output/ as the last run left it; valid only where nothing else writes there between runs.
        self._output_after: dict[str, tuple[int, int]] | None = None

    def install_tools(self, manifest_json: str, transport: ToolTransport | None) -> None:
        """Give the session's `tools` the upstream tools listed in ``manifest_json``."""
        self.namespace["tools"] = build_tools(loads(manifest_json), transport)

    def run(
        self, code: str, max_output_chars: int, output: dict[str, int] | None = None
    ) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
        """Run ``code``; returns the outcome, or a coroutine for it when the code awaits.

        With ``output`` limits, the outcome also carries the figures the program left open and
        the files it wrote to output/.
        """
        if output is None:
            return self._run(code, max_output_chars)
        before = self._output_after if self.private_output else None
        if before is None:
            before = _scan_output()
        outcome = self._run(code, max_output_chars)
        if isinstance(outcome, dict):
            return self._with_artifacts(outcome, before, output)
        return self._with_artifacts_async(outcome, before, output)

    async def _with_artifacts_async(
        self, pending: Coroutine[Any, Any, dict[str, Any]], before: dict[str, Any], output: dict[str, int]
    ) -> dict[str, Any]:
        return self._with_artifacts(await pending, before, output)

    def _with_artifacts(
        self, outcome: dict[str, Any], before: dict[str, Any], output: dict[str, int]
    ) -> dict[str, Any]:
        budget = output["max_bytes"]
        notes: list[str] = []
        figures, budget = _collect_figures(output["max_figures"], budget, notes)
        self._output_after = after = _scan_output()
        files = _collect_files(before, after, output["max_files"], budget, self.inline_files, notes)
        outcome.update(figures=figures, files=files, notes=notes)
        return outcome

    def _run(self, code: str, max_output_chars: int) -> dict[str, Any] | Coroutine[Any, Any, dict[str, Any]]:
        self.cells += 1
        stdout = CappedText(max_output_chars, self.report_line)
        stderr = CappedText(max_output_chars, self.report_line)
        try:
            program = Program(code, self.cells)
        except BaseException as error:  # noqa: BLE001 - a SyntaxError is the caller's outcome
            return _outcome(stdout, stderr, max_output_chars, error=error)
        if program.is_async:
            return self._run_async(program, stdout, stderr, max_output_chars)
        try:
            with self.capturing(stdout, stderr):
                value = program.run(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return _outcome(stdout, stderr, max_output_chars, error=error)
        return _outcome(stdout, stderr, max_output_chars, value=value)

    async def _run_async(
        self, program: Program, stdout: CappedText, stderr: CappedText, max_output_chars: int
    ) -> dict[str, Any]:
        try:
            with self.capturing(stdout, stderr):
                value = await program.run_async(self.namespace)
        except BaseException as error:  # noqa: BLE001 - every failure is reported, not raised
            return _outcome(stdout, stderr, max_output_chars, error=error)
        return _outcome(stdout, stderr, max_output_chars, value=value)

    @contextmanager
    def capturing(self, stdout: CappedText, stderr: CappedText) -> Iterator[None]:
        """Send the program's sys.stdout and sys.stderr to the run's streams.

        A sandbox process has one program at a time, so swapping the sys attributes is enough;
        the in-process executor overrides this to route per thread.
        """
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = stdout, stderr
        try:
            yield
        finally:
            sys.stdout, sys.stderr = saved


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
) -> list[dict[str, Any]]:
    """The files in output/ that this run created or changed, within the count and byte caps."""
    changed = sorted(path for path, signature in after.items() if before.get(path) != signature)
    files: list[dict[str, Any]] = []
    for path in changed[:limit]:
        size = after[path][0]
        if size > budget:
            notes.append(f"output/{path} ({size:,} bytes) left out: over the output size cap")
            continue
        entry: dict[str, Any] = {"path": path, "size": size}
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
) -> dict[str, Any]:
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
    return {
        "success": error is None,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "result": result,
        "error_type": error_type,
        "error": message,
        "truncated": truncated,
    }


_session = Session()
_transport: ToolTransport | None = None


def install_transport(transport: ToolTransport, inline_files: bool = False) -> None:
    """Called once by a runner: how bridged calls reach the host, and whether output files
    must travel in the outcome because the host cannot read the sandbox's disk."""
    global _transport
    _transport = transport
    _session.inline_files = inline_files
    _session.report_line = transport.progress


def _output_limits(output: Any) -> dict[str, int] | None:
    """Output limits as a dict: runners pass a JsProxy in Pyodide."""
    return output.to_py() if hasattr(output, "to_py") else output  # type: ignore[no-any-return]


def run_program_json(
    code: str, max_output_chars: int, tools_manifest: str | None = None, output: Any = None
) -> str | Coroutine[Any, Any, str]:
    """Entry point for runners that speak JSON (the Pyodide worker, the CPython worker)."""
    if tools_manifest is not None:
        _session.install_tools(tools_manifest, _transport)
    outcome = _session.run(code, max_output_chars, _output_limits(output))
    if isinstance(outcome, dict):
        return dumps(outcome)
    return _dump_when_done(outcome)


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


def warm_up(rounds: int, output: Any = None) -> None:
    """Run WARM_UP_PROGRAM `rounds` times in a throwaway session, so a JIT (V8 compiling
    Pyodide's WebAssembly) has compiled the hot paths before the user's next call.

    `output` limits, as a run gets them, take the same path through artifact collection; with
    max_figures 0 nothing is saved, and no figure is open between runs (each run closes them).
    """
    session = Session()
    session.cells = WARM_UP_FIRST_CELL
    limits = _output_limits(output)
    for _ in range(rounds):
        dumps(session.run(WARM_UP_PROGRAM, 1000, limits))
        linecache.cache.pop(f"{CELL_PREFIX}{session.cells}>", None)


async def _dump_when_done(pending: Coroutine[Any, Any, dict[str, Any]]) -> str:
    return dumps(await pending)
