"""One program: compiled as a REPL cell, and what its run comes to (a GuestOutcome), with a
traceback that shows the user's frames only."""

from __future__ import annotations

import ast
import inspect
import linecache
import os
import sys
from traceback import FrameSummary, StackSummary, TracebackException, format_exception_only, walk_tb
from types import CodeType, TracebackType
from typing import Any

from mcp_sandbox.guest.capture import CappedText
from mcp_sandbox.protocol import GuestOutcome, cap_text

CELL_PREFIX = "<cell-"
_HERE: str = globals().get("__file__", "")
#: Where this runtime's own frames come from, so tracebacks can leave them out: a runner loads each
#: of its modules as "<mcp_sandbox.guest...>", the in-process backend imports them from this folder.
RUNTIME_FILES = ("<mcp_sandbox.guest",) + (
    () if _HERE.startswith("<") else (os.path.dirname(_HERE) + os.sep,)
)
#: Frames a traceback shows at most, first and last: reading the source of a million frames of
#: runaway recursion takes longer than the timeout.
TRACEBACK_HEAD_FRAMES, TRACEBACK_TAIL_FRAMES = 30, 30
_ELIDED = "<frames not shown>"
#: A pandas table as a final value shows this many rows (half from its head, half from its tail)
#: and columns at most.
TABLE_ROWS, TABLE_COLUMNS = 10, 20


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


def user_traceback(error: BaseException) -> str:
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
    # The tool bridge's functions are the runtime's; the user's call into them is the frame that matters.
    report.stack = StackSummary.from_list(
        [f for f in report.stack if not f.filename.startswith(RUNTIME_FILES)]
    )
    text = "".join(report.format())
    return text.replace(
        f'  File "{_ELIDED}", line 0, in {elided}\n', f"  ... {elided} frames not shown ...\n"
    )


def value_text(value: Any) -> str:
    """The final value as the caller reads it: repr(), except that a pandas DataFrame or Series
    is a table of its head and tail rows with its shape, unwrapped (repr() folds wide tables into
    blocks, which a model reads worse)."""
    try:
        pandas = sys.modules.get("pandas")
        if pandas is not None and isinstance(value, pandas.DataFrame):
            text: str = value.to_string(
                max_rows=TABLE_ROWS, min_rows=TABLE_ROWS, max_cols=TABLE_COLUMNS, show_dimensions=True
            )
            return text
        if pandas is not None and isinstance(value, pandas.Series):
            text = value.to_string(
                max_rows=TABLE_ROWS, min_rows=TABLE_ROWS, length=True, dtype=True, name=True
            )
            return text
        return repr(value)
    except BaseException as error:  # noqa: BLE001 - a broken __repr__ must not lose the run
        return f"<repr() failed: {type(error).__name__}: {error}>"


def outcome_of(
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
        message, cut = cap_text(user_traceback(error), max_output_chars)
        truncated = truncated or cut
    elif value is not None:
        result, cut = cap_text(value_text(value), max_output_chars)
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
