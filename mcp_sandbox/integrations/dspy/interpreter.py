"""SandboxInterpreter: DSPy's PythonInterpreter, running its code in an mcp-sandbox session.

One interpreter is one session. The sandbox lives in an event loop on a thread of the
interpreter's own, and `execute` blocks on it. The session's side of the work is guest.py, run
into the session once per sandbox; host callables reach the code through the tool bridge as
local tools, bound to plain globals; and every execute() ends with one report from the guest
(its final value, SUBMIT's fields, or the error), which is what execute() returns or raises.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import contextvars
import functools
import inspect
import json
import logging
import os
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from importlib import resources
from os import PathLike
from types import TracebackType
from typing import Any, ClassVar, TypeVar, cast

import anyio
from anyio.from_thread import BlockingPortal
from dspy.utils.callback import BaseCallback  # type: ignore[import-untyped]
from dspy.utils.callback import with_callbacks as _untyped_with_callbacks

from mcp_sandbox.backends.registry import BACKENDS
from mcp_sandbox.errors import InvalidRequest, Refused
from mcp_sandbox.integrations.dspy.errors import CodeExecutionError, CodeInterpreterError, FinalOutput
from mcp_sandbox.integrations.dspy.mounts import PART_CHARS, Mounts
from mcp_sandbox.integrations.dspy.values import INTERNAL_PREFIX, check_name, tool_result, variable_json
from mcp_sandbox.result import SANDBOX_NAMES, ExecutionResult
from mcp_sandbox.sandbox import Sandbox
from mcp_sandbox.settings import BackendName, Settings

logger = logging.getLogger(__name__)

SESSION_ID = "dspy"
#: A restored result with one of these: the call's sandbox died during it, so the call did not count.
SANDBOX_DEATHS = frozenset({"crash", "memory_limit", "timeout"})
#: Annotations SUBMIT may show for an output field (DSPy's SIMPLE_TYPES, by name).
SUBMIT_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "NoneType"})
#: An idle session must not expire under DSPy: its state is the point (about 30 years).
NEVER = 1e9
#: How long shutdown waits for the sandbox to close before leaving it to the daemon thread.
CLOSE_WAIT = 30.0
#: Memory per sandbox unless set: DSPy's own Pyodide may grow to 4 GB, and its variables reach 100s of MB.
MEMORY_MB = 2048
#: A request (code and variables, JSON) up to this many characters travels inside the run's code.
INLINE_CHARS = 64_000
#: The longest report (the final value as JSON) the host takes: what a program can make it hold.
MAX_REPORT_CHARS = 256 * 2**20
#: Variables up to this many characters of JSON travel inside the request; larger ones in parts.
INLINE_VARIABLE_CHARS = 16_000
GUEST_SOURCE = resources.files(__package__).joinpath("guest.py").read_text(encoding="utf-8")

_Function = TypeVar("_Function", bound=Callable[..., Any])


def with_callbacks(function: _Function) -> _Function:
    """DSPy's decorator that reports a call to the `callbacks` (the instance's and dspy.settings')."""
    return cast(_Function, _untyped_with_callbacks(function))


#: Set, inside a host tool, to the exchange of the interpreter that called it (recursion guard).
_inside_tool: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("_inside_tool", default=None)


@dataclass(eq=False)
class _Exchange:
    """What one execute() shares with the tool calls its code makes, which run on other threads."""

    #: The caller's context, so dspy.context(...) settings and callbacks hold inside tools.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    #: The request (JSON text) and the large variables' JSON texts, for the guest to take in parts.
    held: dict[str, str] = field(default_factory=dict)
    report_parts: list[str] = field(default_factory=list)
    report_chars: int = 0
    report: Any = None

    def begin(self) -> None:
        """Ready for one run: the caller's context now, and no report yet."""
        self.context = contextvars.copy_context()
        self.report_parts, self.report_chars, self.report = [], 0, None

    def take(self, key: str, part: int) -> dict[str, Any]:
        text = self.held[key]
        start = max(part, 0) * PART_CHARS
        return {"text": text[start : start + PART_CHARS], "more": start + PART_CHARS < len(text)}

    def receive(self, part: str, last: bool) -> None:
        if not isinstance(part, str) or not part.isascii():  # the runtime sends ASCII JSON text
            raise CodeExecutionError("a report's part must be ASCII text")
        self.report_chars += len(part)
        if self.report_chars > MAX_REPORT_CHARS:
            self.report_parts, self.report_chars = [], 0
            raise CodeExecutionError(f"the program's value is over {MAX_REPORT_CHARS:,} characters as JSON")
        self.report_parts.append(part)
        if last:
            text, self.report_parts, self.report_chars = "".join(self.report_parts), [], 0
            self.report = _parsed(text)


def _parsed(text: str) -> Any:
    """JSON text as data, or None when it is not JSON (or nested past what the parser takes)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _ended_by(result: ExecutionResult) -> str:
    """What ended a failed run, by name: the sandbox's outcome (Timeout, ...) or the program's exception."""
    return SANDBOX_NAMES.get(result.status) or str(result.exception)


def _why(result: ExecutionResult) -> str:
    """What the server said about a restore (its notes: why the sandbox went), for the error."""
    return f" ({'; '.join(result.notes)})" if result.notes else ""


def _literal(text: str) -> str:
    """`text` as a Python string literal (JSON's string syntax is a subset of Python's)."""
    return json.dumps(text)


def _awaits(code: str) -> bool:
    """Whether `code` awaits at its top level (False when this Python cannot compile it: the
    sandbox then reports its SyntaxError, or runs syntax newer than the host's)."""
    if "await" not in code and "async" not in code:
        return False
    try:
        compiled = compile(code, "<dspy>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return bool(compiled.co_flags & inspect.CO_COROUTINE)


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


class _Runtime:
    """A started Sandbox and the event loop it lives in, on a daemon thread, so an interpreter
    nobody shut down cannot hold up the process's exit (its finalizer closes it)."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox
        started: Future[BlockingPortal] = Future()
        self._thread = threading.Thread(
            target=self._main, args=(started,), name="mcp-sandbox-dspy", daemon=True
        )
        self._thread.start()
        self.portal = started.result()

    def _main(self, started: Future[BlockingPortal]) -> None:
        try:
            anyio.run(self._serve, started)
        except Exception as error:  # noqa: BLE001 - a start failure goes to the caller; later ones are logged
            if not started.done():
                started.set_exception(error)
            else:
                logger.warning("the DSPy interpreter's sandbox did not close cleanly: %s", error)

    async def _serve(self, started: Future[BlockingPortal]) -> None:
        async with self.sandbox, BlockingPortal() as portal:
            started.set_result(portal)
            await portal.sleep_until_stopped()

    def close(self) -> None:
        if threading.current_thread() is self._thread:
            return  # a finalizer running on the loop's own thread cannot wait for it
        with contextlib.suppress(RuntimeError):  # the loop has already stopped
            self.portal.call(self.portal.stop, True)
        self._thread.join(CLOSE_WAIT)


class SandboxInterpreter:
    """DSPy's `PythonInterpreter`, with the same arguments and behaviour, running code in an
    mcp-sandbox session.

    DSPy's arguments: `tools` (host callables code calls as globals, sync or async),
    `output_fields` (SUBMIT's typed parameters), `enable_read_paths` and `enable_write_paths`
    (host files at /sandbox/<name>; `sync_files` writes changes back), `enable_env_vars` (host
    environment variables by name), `enable_network_access` (hosts code may reach; pyodide) and
    `callbacks`. `deno_command` is refused: this interpreter starts its own runtime.

    Its own, keyword-only: `backend` (a backend's name, or auto; default: the
    `MCP_SANDBOX_BACKEND` setting), `timeout` (seconds per execute), and any other mcp-sandbox
    setting (`memory_mb=1024`, `data_dir=...`). Safe to use from several threads: calls take
    turns. `shutdown()` ends it (a `with` block does too).
    """

    execution_instructions: ClassVar[str] = (
        "Python runs in an mcp-sandbox sandbox: Pyodide (WebAssembly) or a CPython worker process. State "
        "persists across executions. Python standard libraries such as re, json, collections and math are "
        "available. Host files, environment variables and network access are reachable only where given. "
        "Each execution has a time limit. A failing tool raises ToolError, a RuntimeError."
    )

    def __init__(
        self,
        deno_command: list[str] | None = None,
        enable_read_paths: list[PathLike[str] | str] | None = None,
        enable_write_paths: list[PathLike[str] | str] | None = None,
        enable_env_vars: list[str] | None = None,
        enable_network_access: list[str] | None = None,
        sync_files: bool = True,
        tools: dict[str, Callable[..., Any]] | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        callbacks: list[BaseCallback] | None = None,
        *,
        backend: BackendName | None = None,
        timeout: float | None = None,
        **settings: Any,
    ) -> None:
        if isinstance(deno_command, dict):
            raise TypeError("deno_command must be a list of strings, not a dict")
        if deno_command:
            raise CodeInterpreterError(
                "SandboxInterpreter does not take deno_command: it starts its own sandbox (Deno with "
                "Pyodide, "
                "or a CPython worker), whose permissions come from enable_read_paths, enable_write_paths, "
                "enable_env_vars and enable_network_access; leave deno_command out"
            )
        self._mounts = Mounts(list(enable_read_paths or []), list(enable_write_paths or []), sync_files)
        self.enable_read_paths = list(enable_read_paths or [])
        self.enable_write_paths = list(enable_write_paths or [])
        self.enable_env_vars = [str(name).strip() for name in enable_env_vars or []]
        self.enable_network_access = [str(host) for host in enable_network_access or []]
        self.sync_files = sync_files
        #: The host callables code may call, by global name. RLM adds its own; a change reaches
        #: the sandbox at the next execute.
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        #: RLM sets this to its output fields, for a typed SUBMIT(field, ...).
        self.output_fields = output_fields
        self.callbacks = list(callbacks or [])
        settings.setdefault("pool_size", 0)  # the session's sandbox is the only one needed
        settings.setdefault("session_ttl", NEVER)
        settings.setdefault("memory_mb", MEMORY_MB)
        if backend is not None:
            settings["backend"] = backend
        if timeout is not None:
            settings["timeout"] = timeout
            settings.setdefault("max_timeout", max(timeout, Settings.model_fields["max_timeout"].default))
        if self.enable_network_access:
            settings.setdefault("allow_net", ",".join(self.enable_network_access))
        try:
            self.settings = Settings(**settings)
        except ValueError as error:
            raise CodeInterpreterError(f"the sandbox's settings are not valid: {error}") from None
        if "bridge_call_timeout" not in settings:
            # A tool call cannot outlive its execution, so by default it may take all of it.
            self.settings = self.settings.model_copy(update={"bridge_call_timeout": self.settings.timeout})
        self._lock = threading.RLock()
        self._exchange = _Exchange()
        self._runtime: _Runtime | None = None
        self._close: weakref.finalize[..., Any] | None = None
        self._ended = False
        #: The session's calls that ran, as the server counts them (what a restore is held to).
        self._calls = 0
        #: Whether the session has the guest runtime: False again once it comes back in a new sandbox.
        self._installed = False
        self._synced: tuple[dict[str, Callable[..., Any]], Any] | None = None
        #: The tools the Sandbox was last given (None: none yet).
        self._given: dict[str, Callable[..., Any]] | None = None

    @property
    def backend(self) -> str | None:
        """The name of the backend in use once started, else None."""
        return self._runtime.sandbox.backend if self._runtime is not None else None

    @with_callbacks
    def start(self) -> None:
        """Start the sandbox and its session; idempotent. Raises CodeInterpreterError after shutdown
        or a lost sandbox, or when the sandbox cannot start."""
        with self._lock:
            self._start()

    @with_callbacks
    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """Run `code` in the session, with `variables` bound as globals first.

        Returns FinalOutput when the code called SUBMIT, else the value of its final expression
        (as JSON data: tuples as lists, sets as sorted lists; a value that is not data as its
        repr), or else what it printed ('' for nothing). Raises SyntaxError, CodeExecutionError
        for an error in the code (a timeout included: the session survives it), and
        CodeInterpreterError when the sandbox fails or is lost (the interpreter is then finished).
        """
        if _inside_tool.get() is self._exchange:
            raise CodeInterpreterError("SandboxInterpreter cannot execute recursively from one of its tools.")
        with self._lock:
            self._check_active()
            texts = {check_name(k, "variable"): variable_json(v) for k, v in (variables or {}).items()}
            if self._runtime is None:
                self.start()
            self._ensure_installed()
            self._sync_tools()
            exchange = self._exchange
            inline = {k: v if len(v) <= INLINE_VARIABLE_CHARS else None for k, v in texts.items()}
            exchange.held = {f"variable {k}": v for k, v in texts.items() if inline[k] is None}
            request = json.dumps({"code": code, "variables": inline})
            literal = _literal(request)
            if len(literal) > INLINE_CHARS:
                exchange.held["request"], literal = request, "None"
            call = "await _mcp_sandbox_dspy.run_async" if _awaits(code) else "_mcp_sandbox_dspy.run"
            try:
                exchange.begin()
                self._mounts.begin()
                result = self._run(f"{call}({literal})")
                if self._lost_runtime(result):
                    # Restored into a new sandbox from a checkpoint that could not keep the runtime:
                    # the program never started, so it runs once the runtime is back.
                    self._check_alive(result)
                    self._ensure_installed()
                    self._sync_tools()
                    exchange.begin()
                    result = self._run(f"{call}({literal})")
                return self._outcome(result)
            finally:
                exchange.held = {}

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        return self.execute(code, variables)

    @with_callbacks
    def invoke_tool(self, tool_name: str, kwargs: dict[str, Any]) -> Any:
        """Call one of `tools` as the code's call does (an async tool's result awaited)."""
        if tool_name not in self.tools:
            raise CodeInterpreterError(f"Unknown tool: {tool_name}")
        value = self.tools[tool_name](**kwargs)
        if isinstance(value, Awaitable):  # an async tool: this is a worker thread, with no loop running
            return asyncio.run(_awaited(value))
        return value

    @with_callbacks
    def shutdown(self) -> None:
        """Stop the sandbox and end the session; idempotent. The interpreter cannot be used again."""
        with self._lock:
            self._end()

    def __enter__(self) -> SandboxInterpreter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    def _check_active(self) -> None:
        if self._ended:
            raise CodeInterpreterError(
                "SandboxInterpreter session has ended (shut down, or its sandbox was lost); create a new "
                "interpreter for a fresh session."
            )

    def _start(self) -> None:
        self._check_active()
        if self._runtime is not None:
            return
        try:
            runtime = _Runtime(Sandbox(settings=self.settings, tools={}))
        except Exception as error:
            raise CodeInterpreterError(f"the sandbox could not start: {error}") from error
        self._runtime = runtime
        self._close = weakref.finalize(self, runtime.close)
        backend = runtime.sandbox.backend
        if self.enable_network_access and not BACKENDS[backend].network:
            self._end()
            networked = " or ".join(name for name, entry in BACKENDS.items() if entry.network)
            raise CodeInterpreterError(
                f"enable_network_access needs the {networked} backend; the {backend} backend gives code "
                "no network"
            )
        if self._mounts.files and not BACKENDS[backend].isolated:
            self._end()
            sandboxes = " or ".join(name for name, entry in BACKENDS.items() if entry.isolated)
            raise CodeInterpreterError(
                f"enable_read_paths and enable_write_paths need a sandbox ({sandboxes}); the {backend} "
                "backend runs code on the host, where it opens host files itself"
            )
        self._ensure_installed()  # also starts the session's sandbox, so start() leaves it warm
        self._sync_tools()

    def _end(self) -> None:
        self._ended = True
        self._runtime = None
        if self._close is not None:
            self._close()

    def _local_tools(self) -> dict[str, Callable[..., Any]]:
        exchange, mounts = self._exchange, self._mounts
        local: dict[str, Callable[..., Any]] = {name: self._as_local_tool(name) for name in self.tools}

        def report(part: str, last: bool) -> None:
            exchange.receive(part, last)

        def request(part: int) -> dict[str, Any]:
            return exchange.take("request", part)

        def variable(name: str, part: int) -> dict[str, Any]:
            return exchange.take(f"variable {name}", part)

        def file(index: int, part: int) -> str:
            return mounts.part(index, part)

        def sync(index: int, part: str, last: bool) -> None:
            mounts.receive(index, part, last)

        for function in (report, request, variable, file, sync):
            local[f"{INTERNAL_PREFIX}_{function.__name__}"] = function
        return local

    def _as_local_tool(self, name: str) -> Callable[..., Any]:
        """Tool `name` as a bridge tool: called through invoke_tool in the context of the
        execute() that called it, its result converted as DSPy converts it."""
        exchange, function = self._exchange, self.tools[name]

        def call(**arguments: Any) -> Any:
            return exchange.context.copy().run(self._call_tool, name, arguments)

        call.__signature__ = inspect.signature(function)  # type: ignore[attr-defined]
        call.__doc__ = inspect.getdoc(function)
        return call

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        _inside_tool.set(self._exchange)
        return tool_result(self.invoke_tool(name, arguments))

    def _ensure_installed(self) -> None:
        """Put the guest runtime, the environment variables and the files into the session."""
        if self._installed:
            return
        self._synced = None  # the tools and SUBMIT are bound again in the new sandbox
        self._give_tools()  # the runtime takes the files through them
        environment = {name: os.environ[name] for name in self.enable_env_vars if name in os.environ}
        files = self._mounts.load()
        self._prepare(
            "def _mcp_sandbox_install(source):\n"
            '    scope = {"__name__": "mcp_sandbox_dspy_guest"}\n'
            '    exec(compile(source, "mcp_sandbox/integrations/dspy/guest.py", "exec"), scope)\n'
            f'    return scope["Runtime"](globals(), {self.settings.max_output_chars})\n'
            f"_mcp_sandbox_dspy = _mcp_sandbox_install({_literal(GUEST_SOURCE)})\n"
            "del _mcp_sandbox_install\n"
            f"_mcp_sandbox_dspy.set_environment({json.dumps(environment)})\n"
            f"_mcp_sandbox_dspy.mount({_literal(json.dumps(files))})\n"
        )
        self._mounts.loaded()
        self._installed = True

    def _sync_tools(self) -> None:
        """Give the session the current tools and SUBMIT, when they changed since the last time."""
        fields = self._submit_fields()
        wanted = (dict(self.tools), fields)
        if wanted == self._synced:
            return
        names = [check_name(name, "tool") for name in wanted[0]]
        self._give_tools()
        stale = sorted(set(self._synced[0]) - set(names)) if self._synced is not None else []
        self._prepare(
            f"_mcp_sandbox_dspy.bind_tools({json.dumps(names)}, {json.dumps(stale)})\n"
            f"_mcp_sandbox_dspy.define_submit({json.dumps(fields)})\n"
        )
        self._synced = wanted

    def _give_tools(self) -> None:
        """Give the Sandbox (host side, kept across the session's sandboxes) the current tools and
        the runtime's own, unless it has them already."""
        tools = dict(self.tools)
        if tools == self._given:
            return
        runtime = self._started()
        try:
            runtime.portal.call(runtime.sandbox.set_tools, self._local_tools())
        except (ValueError, TypeError) as error:  # a callable whose signature cannot be read
            raise CodeInterpreterError(f"the tools cannot be given to the sandbox: {error}") from error
        self._given = tools

    def _submit_fields(self) -> list[list[str]]:
        """[name, type] for each output field RLM declares; none: the one-argument SUBMIT(output)."""
        fields = []
        for entry in self.output_fields or []:
            kind = entry.get("type")
            fields.append(
                [check_name(entry.get("name"), "output field"), kind if kind in SUBMIT_TYPES else ""]
            )
        return fields

    def _prepare(self, code: str) -> None:
        """Run the interpreter's own code in the session; it fails only when the sandbox does."""
        self._exchange.begin()
        result = self._run(code)
        self._check_alive(result)
        if self._lost_runtime(result):  # restored without it: put it back, then this code again
            self._ensure_installed()
            self._exchange.begin()
            result = self._run(code)
            self._check_alive(result)
        if not result.success:
            raise CodeInterpreterError(f"the sandbox session could not be prepared: {result.error}")

    def _run(self, code: str) -> ExecutionResult:
        runtime = self._started()
        run = functools.partial(runtime.sandbox.run, code, session_id=SESSION_ID)
        try:
            return runtime.portal.call(run)
        except InvalidRequest as error:  # the code is over a limit: the program's to fix
            raise CodeExecutionError(str(error)) from None
        except (Refused, RuntimeError) as error:
            self._end()
            raise CodeInterpreterError(f"the sandbox is unavailable: {error}") from error

    def _started(self) -> _Runtime:
        assert self._runtime is not None, "started by _start"
        return self._runtime

    def _check_alive(self, result: ExecutionResult) -> None:
        """End the interpreter when its session's state is gone or rolled back: DSPy's modules
        read no notes, so going on would hand them wrong data without a word."""
        if result.session_lost:
            self._end()
            raise CodeInterpreterError(
                f"the sandbox was lost ({_ended_by(result)}: {result.error}); interpreter state was lost. "
                "Create a new interpreter for a fresh session."
            )
        if result.session_restored:
            self._installed = False  # a new sandbox: the runtime is put in again before the next run
        if result.session_restored and result.restored_from_call is not None:
            if result.restored_from_call < self._calls:
                self._end()
                raise CodeInterpreterError(
                    "the sandbox was lost and its session restored from an earlier checkpoint (after call "
                    f"{result.restored_from_call} of {self._calls}){_why(result)}; interpreter state was "
                    "lost. Create a new interpreter for a fresh session."
                )
            self._calls = result.restored_from_call
            if result.status in SANDBOX_DEATHS:
                return
        self._calls += 1

    def _report(self, result: ExecutionResult) -> dict[str, Any] | None:
        """The guest's report: the run's value, or what came through the tool when it was long.
        The program could have replaced the runtime, so a report of the wrong shape is an error."""
        report = self._exchange.report
        if report is None and result.success and result.result is not None:
            report = _parsed(result.result)
        elif report is None:
            return None
        error = report.get("error") if isinstance(report, dict) else None
        well_formed = isinstance(report, dict) and (
            "error" not in report
            or (
                isinstance(error, dict)
                and isinstance(error.get("type"), str)
                and isinstance(error.get("args"), list)
                and isinstance(error.get("message"), str)
            )
        )
        if not well_formed:
            raise CodeExecutionError("the program's report is malformed: did it replace _mcp_sandbox_dspy?")
        return report  # type: ignore[no-any-return]

    @staticmethod
    def _lost_runtime(result: ExecutionResult) -> bool:
        """Whether the run found a session restored without the runtime (checkpoints leave it out)."""
        return (
            result.session_restored
            and result.exception == "NameError"
            and "'_mcp_sandbox_dspy' is not defined" in (result.error or "")
        )

    def _outcome(self, result: ExecutionResult) -> Any:
        self._check_alive(result)
        report = self._report(result)
        if report is None:
            if result.success:
                raise CodeExecutionError(
                    "the program ended without a result: did it replace _mcp_sandbox_dspy, the sandbox's "
                    "runner?"
                )
            # Ended by the sandbox (a timeout, the memory limit) or by a KeyboardInterrupt it raised.
            message = (result.error or "").strip().splitlines()
            last = message[-1] if message else ""
            kind = _ended_by(result)
            raise CodeExecutionError(last if last.startswith(kind) else f"{kind}: {result.error}")
        if "final" in report:
            return FinalOutput(report["final"])
        if "error" in report:
            error = report["error"]
            if error["type"] in ("SyntaxError", "IndentationError", "TabError"):
                raise SyntaxError(f"Invalid Python syntax. message: {error['message']}")
            raise CodeExecutionError(f"{error['type']}: {error['args'] or error['message']}")
        if "value" in report:
            return report["value"]
        return self._whole_stdout(result)

    def _whole_stdout(self, result: ExecutionResult) -> str:
        """What the code printed: all of it (up to max_kept_output_chars) when the result cut it."""
        if result.stdout_uri is None:
            return result.stdout
        runtime = self._started()
        try:
            return runtime.portal.call(runtime.sandbox.read_output, result.stdout_uri)
        except Exception:  # noqa: BLE001 - dropped meanwhile: the cut text is what there is
            return result.stdout
