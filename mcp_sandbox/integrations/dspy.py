"""DSPy's CodeInterpreter on mcp-sandbox: ProgramOfThought, CodeAct and RLM run their code here.

    import dspy
    from mcp_sandbox.integrations.dspy import SandboxInterpreter

    dspy.configure(interpreter_factory=SandboxInterpreter)

One interpreter is one sandbox session, so state persists from one `execute` to the next. The
sandbox lives in an event loop on a thread of the interpreter's own; `execute` blocks on it.
DSPy tools are host callables: they join the tool bridge as local tools (`tools.local.<name>`)
and a prelude binds each to a plain global, next to `SUBMIT`, which hands its value to the host
through the same channel and stops the program.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import json
import keyword
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar

import anyio
from anyio.from_thread import BlockingPortal
from pydantic_core import PydanticSerializationError, to_jsonable_python

try:
    from dspy.primitives.code_interpreter import (  # type: ignore[import-untyped]
        CodeExecutionError,
        CodeInterpreterError,
        FinalOutput,
    )
except ImportError as missing:  # pragma: no cover - depends on the environment
    raise ImportError(
        'mcp_sandbox.integrations.dspy needs DSPy: pip install "mcp-sandbox[dspy]"'
    ) from missing

from mcp_sandbox.app import InvalidRequest
from mcp_sandbox.pool import PoolUnavailable
from mcp_sandbox.protocol import MAX_TOOL_REPLY_CHARS
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sandbox import Sandbox
from mcp_sandbox.sessions import SessionElsewhere, SessionLimitReached
from mcp_sandbox.settings import BackendName, Settings

__all__ = ["CodeExecutionError", "CodeInterpreterError", "FinalOutput", "SandboxInterpreter"]

logger = logging.getLogger(__name__)

SESSION_ID = "dspy"
#: Names the interpreter defines in the session; tools and variables may not take them.
RESERVED_NAMES = frozenset({"SUBMIT", "tools", "ToolError"})
INTERNAL_PREFIX = "_mcp_sandbox"
SYNTAX_ERRORS = frozenset({"SyntaxError", "IndentationError", "TabError"})
#: A restored result with one of these: the call's sandbox died during it, so the call did not count.
SANDBOX_DEATHS = frozenset({"SandboxCrash", "MemoryLimit", "Timeout"})
#: Annotations SUBMIT may show for an output field (DSPy's SIMPLE_TYPES, by name).
SUBMIT_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict"})
#: An idle session must not expire under DSPy: its state is the point (about 30 years).
NEVER = 1e9
#: How long shutdown waits for the sandbox to close before leaving it to the daemon thread.
CLOSE_WAIT = 30.0

#: Set, inside a host tool, to the exchange of the interpreter that called it (recursion guard).
_inside_tool: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("_inside_tool", default=None)


@dataclass(eq=False)
class _Exchange:
    """What one execute() shares with the host tools its code calls, which run on other threads."""

    #: The caller's context, so dspy.context(...) settings hold inside tools as in DSPy's own interpreter.
    context: contextvars.Context = field(default_factory=contextvars.copy_context)
    variables: dict[str, Any] = field(default_factory=dict)
    submitted: list[Any] = field(default_factory=list)

    async def submit(self, value: Any) -> None:
        self.submitted.append(value)

    async def variable(self, name: str) -> Any:
        return self.variables[name]


def _as_local_tool(function: Callable[..., Any], exchange: _Exchange) -> Callable[..., Any]:
    """`function` as a bridge tool that runs in the context of the execute() that called it."""

    @functools.wraps(function)  # keeps the name, docstring and (through __wrapped__) the signature
    def call(**arguments: Any) -> Any:
        return exchange.context.copy().run(_call_tool, exchange, function, arguments)

    return call


def _call_tool(exchange: _Exchange, function: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    _inside_tool.set(exchange)
    value = function(**arguments)
    if isinstance(value, Awaitable):  # an async tool: this is a worker thread, with no loop running
        return asyncio.run(_awaited(value))
    return value


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


def _check_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise CodeInterpreterError(f"{what} name {name!r} is not a Python identifier")
    if name in RESERVED_NAMES or name.startswith(INTERNAL_PREFIX):
        raise CodeInterpreterError(f"{what} name {name!r} is reserved by the sandbox")
    return name


def _submit_fields(output_fields: list[dict[str, Any]] | None) -> list[tuple[str, str | None]] | None:
    """(name, annotation) for each output field RLM declares; None: the one-argument SUBMIT(output)."""
    if not output_fields:
        return None
    fields = []
    for entry in output_fields:
        kind = entry.get("type")
        fields.append(
            (_check_name(entry.get("name"), "output field"), kind if kind in SUBMIT_TYPES else None)
        )
    return fields


def _prelude(names: list[str], stale: list[str], fields: list[tuple[str, str | None]] | None) -> str:
    """Code that defines SUBMIT and binds each tool to a global (every name checked by _check_name)."""
    pairs = fields or [("output", None)]
    params = ", ".join(f"{name}: {kind}" if kind else name for name, kind in pairs)
    value = "{" + ", ".join(f"{name!r}: {name}" for name, _ in pairs) + "}"
    return f'''
def _mcp_sandbox_define(local):
    def SUBMIT({params}):
        """Submit the final output: the program stops here and execute() returns it."""
        local._mcp_sandbox_submit(value={value})
        raise SystemExit(0)

    def inject(names):
        namespace = globals()
        for name in names:
            namespace[name] = local._mcp_sandbox_variable(name=name)

    return SUBMIT, inject


SUBMIT, _mcp_sandbox_inject = _mcp_sandbox_define(tools.local)
del _mcp_sandbox_define
for _mcp_sandbox_name in {stale!r}:
    globals().pop(_mcp_sandbox_name, None)
globals().update({{name: getattr(tools.local, name) for name in {names!r}}})
'''


def _jsonable(name: str, value: Any) -> Any:
    """`value` as JSON data (pydantic models, dataclasses, sets... converted), or a clear error."""
    try:
        data = to_jsonable_python(value)
        size = len(json.dumps(data))
    except (PydanticSerializationError, TypeError, ValueError) as error:
        raise CodeInterpreterError(
            f"variable {name!r} ({type(value).__name__}) cannot cross into the sandbox: values must be "
            f"JSON data (str, numbers, bool, None, lists, dicts, or models that dump to them): {error}"
        ) from None
    if size > MAX_TOOL_REPLY_CHARS:
        raise CodeInterpreterError(
            f"variable {name!r} is {size:,} characters as JSON; at most {MAX_TOOL_REPLY_CHARS:,} can cross"
        )
    return data


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
    """DSPy's `CodeInterpreter` protocol, running code in an mcp-sandbox session.

    `tools` are host callables (sync or async) that code calls as globals, with JSON data in and
    out; `backend` is pyodide, subprocess or inprocess (default: the `MCP_SANDBOX_BACKEND`
    setting, `auto`); `timeout` is seconds per `execute`; other keyword arguments are mcp-sandbox
    settings (`memory_mb=256`, `data_dir=...`). Safe to use from several threads: calls take
    turns. Create one per session; `shutdown()` ends it (a `with` block does too).
    """

    execution_instructions: ClassVar[str] = (
        "Python runs in an mcp-sandbox sandbox: Pyodide (WebAssembly) or a CPython worker process, with no "
        "network. State persists across executions. The standard library is available. Each execution has "
        "a time limit. Tools are plain functions taking keyword arguments; a failing tool raises ToolError."
    )

    def __init__(
        self,
        tools: dict[str, Callable[..., Any]] | None = None,
        backend: BackendName | None = None,
        timeout: float | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        **settings: Any,
    ) -> None:
        settings.setdefault("pool_size", 0)  # the session's sandbox is the only one needed
        settings.setdefault("session_ttl", NEVER)
        if backend is not None:
            settings["backend"] = backend
        if timeout is not None:
            settings["timeout"] = timeout
            settings.setdefault("max_timeout", max(timeout, Settings.model_fields["max_timeout"].default))
        self.settings = Settings(**settings)
        if "bridge_call_timeout" not in settings:
            # A tool call cannot outlive its execution, so by default it may take all of it.
            self.settings = self.settings.model_copy(update={"bridge_call_timeout": self.settings.timeout})
        self._tools: dict[str, Callable[..., Any]] = dict(tools or {})
        #: RLM sets this to its output fields, for a typed SUBMIT(field, ...).
        self.output_fields = output_fields
        self._lock = threading.Lock()
        self._exchange = _Exchange()
        self._runtime: _Runtime | None = None
        self._close: weakref.finalize[..., Any] | None = None
        self._ended = False
        #: The session's calls that ran, as the server counts them (what a restore is held to).
        self._calls = 0
        self._synced: tuple[dict[str, Callable[..., Any]], Any] | None = None

    @property
    def tools(self) -> dict[str, Callable[..., Any]]:
        """The host callables code may call, by global name. Mutable (RLM adds its own); changes
        reach the sandbox at the next `execute`."""
        return self._tools

    @property
    def backend(self) -> str | None:
        """The backend in use once started (pyodide, subprocess or inprocess), else None."""
        return self._runtime.sandbox.backend if self._runtime is not None else None

    def start(self) -> None:
        """Start the sandbox and its session; idempotent. Raises CodeInterpreterError after shutdown
        or a lost sandbox, or when the sandbox cannot start."""
        with self._lock:
            self._start()

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        """Run `code` in the session, with `variables` (JSON data) bound as globals first.

        Returns FinalOutput when the code called SUBMIT, else its printed output followed by the
        repr of a final expression (REPL style), or None when there is neither. Raises SyntaxError,
        CodeExecutionError for an error in the code (a timeout included: the session survives it),
        CodeInterpreterError when the sandbox fails or is lost (the interpreter is then finished).
        """
        if _inside_tool.get() is self._exchange:
            raise CodeInterpreterError("a tool cannot call execute() on the interpreter that is running it")
        with self._lock:
            self._start()
            exchange = self._exchange
            exchange.context = contextvars.copy_context()
            exchange.variables = {
                _check_name(k, "variable"): _jsonable(k, v) for k, v in (variables or {}).items()
            }
            self._sync_tools()
            if exchange.variables:
                self._prepare(f"_mcp_sandbox_inject({list(exchange.variables)!r})")
            exchange.submitted = []
            result = self._run(code)
            exchange.variables = {}
            return self._outcome(result)

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

    def _start(self) -> None:
        if self._ended:
            raise CodeInterpreterError(
                "this interpreter's session has ended (shut down, or its sandbox was lost); create a new one"
            )
        if self._runtime is not None:
            return
        try:
            runtime = _Runtime(Sandbox(settings=self.settings, tools={}))
        except Exception as error:
            raise CodeInterpreterError(f"the sandbox could not start: {error}") from error
        self._runtime = runtime
        self._close = weakref.finalize(self, runtime.close)
        self._sync_tools()  # also starts the session's sandbox, so start() leaves it warm

    def _end(self) -> None:
        self._ended = True
        self._runtime = None
        if self._close is not None:
            self._close()

    def _sync_tools(self) -> None:
        """Give the session the current tools and SUBMIT, when they changed since the last time."""
        wanted = (dict(self._tools), _submit_fields(self.output_fields))
        if wanted == self._synced:
            return
        names = [_check_name(name, "tool") for name in wanted[0]]
        local = {name: _as_local_tool(function, self._exchange) for name, function in wanted[0].items()}
        local[f"{INTERNAL_PREFIX}_submit"] = self._exchange.submit
        local[f"{INTERNAL_PREFIX}_variable"] = self._exchange.variable
        runtime = self._started()
        try:
            runtime.portal.call(runtime.sandbox.set_tools, local)
        except (ValueError, TypeError) as error:  # a callable whose signature cannot be read
            raise CodeInterpreterError(f"the tools cannot be given to the sandbox: {error}") from error
        stale = sorted(set(self._synced[0]) - set(names)) if self._synced is not None else []
        self._prepare(_prelude(names, stale, wanted[1]))
        self._synced = wanted

    def _prepare(self, code: str) -> None:
        """Run the interpreter's own code in the session; it fails only when the sandbox does."""
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
        except (PoolUnavailable, SessionLimitReached, SessionElsewhere, RuntimeError) as error:
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
                f"the sandbox was lost ({result.error_type}: {result.error}); its state is gone, so this "
                "interpreter is finished: create a new one"
            )
        if result.session_restored and result.restored_from_call is not None:
            if result.restored_from_call < self._calls:
                self._end()
                raise CodeInterpreterError(
                    f"the sandbox was lost and its session restored from an earlier checkpoint (after call "
                    f"{result.restored_from_call} of {self._calls}); its later state is gone, so this "
                    "interpreter is finished: create a new one"
                )
            self._calls = result.restored_from_call
            if result.error_type in SANDBOX_DEATHS:
                return
        self._calls += 1

    def _outcome(self, result: ExecutionResult) -> Any:
        self._check_alive(result)
        if self._exchange.submitted:
            return FinalOutput(self._exchange.submitted[-1])
        if not result.success:
            message = result.error or ""
            if result.error_type in SYNTAX_ERRORS:
                raise SyntaxError(f"Invalid Python syntax. message: {message}")
            if str(result.error_type) not in message:
                message = f"{result.error_type}: {message}"
            raise CodeExecutionError(message)
        output = result.stdout + (f"{result.result}\n" if result.result is not None else "")
        return output or None
