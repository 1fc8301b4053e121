"""DSPy's execute() inside the sandbox: runs in the session, next to the program's variables.

The host (interpreter.py) runs this file's source once per sandbox, which binds `Runtime` to the
session global `_mcp_sandbox_dspy`; each execute() is then one run of
`_mcp_sandbox_dspy.run(request)` (or `await ...run_async(request)` for code that awaits). The
runtime binds the variables, runs the code as a REPL cell and gives the host one report: the
final value as JSON, SUBMIT's fields, or the error's type and args, which is what DSPy's own
runner reports. The report is the run's value (its repr is the JSON text), or, when longer than
the result can carry, goes through the local tool `_mcp_sandbox_report` in parts. Only the standard library is
used: this file is the same on every backend. A KeyboardInterrupt is not reported: it may be the
run's own timeout, which the host reports instead.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

#: The largest piece of a report or a file one tool call carries (JSON text or base64).
PART_CHARS = 1_000_000
#: SUBMIT's annotations, by the type name the host sends (DSPy's SIMPLE_TYPES).
SUBMIT_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list": list,
    "dict": dict,
    "NoneType": None,
}
#: Where DSPy puts the files it is given (enable_read_paths, enable_write_paths).
MOUNT_FOLDER = "/sandbox"
FILENAME = "<dspy-cell-{}>"
#: The sandbox's guest runtime (the package mcp_sandbox/guest/), loaded in every sandbox.
GUEST_RUNTIME = "mcp_sandbox.guest"


class Report:
    """A run's report, as its value: the result shows the JSON text as it is."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class Submitted(BaseException):
    """SUBMIT's way out of the program: not an error, and past any `except Exception`."""


def _plain(value: Any) -> Any:
    """JSON's stand-in for what json.dumps cannot write: a set as a (sorted) list."""
    if isinstance(value, (set, frozenset)):
        try:
            return sorted(value)
        except TypeError:
            return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON data")


def _json(value: Any) -> str:
    """`value` as JSON text; a value that is not JSON data becomes its repr, as text."""
    try:
        return json.dumps(value, default=_plain)
    except (TypeError, ValueError, RecursionError):
        try:
            return json.dumps(repr(value))
        except Exception as error:  # noqa: BLE001 - a broken __repr__ must not lose the run
            return json.dumps(f"<repr() failed: {type(error).__name__}: {error}>")


def _args(error: BaseException) -> list[Any]:
    try:
        return list(json.loads(json.dumps(list(error.args), default=_plain)))
    except (TypeError, ValueError, RecursionError):
        return [repr(arg) for arg in error.args]


class Runtime:
    """One session's DSPy runtime. A checkpoint leaves it out (with the tools bound to globals):
    it belongs to its sandbox, and the host installs it again in the sandbox a session is
    restored into."""

    def __reduce__(self) -> Any:
        raise TypeError("the DSPy runtime is installed again after a restore, not saved")

    def __init__(self, namespace: dict[str, Any], report_chars: int) -> None:
        self.namespace = namespace
        #: The longest report the run's result carries whole (the sandbox's max_output_chars).
        self.report_chars = report_chars
        self.cells = 0
        #: Writable mounted files: their index on the host, and the digest of what it last had.
        self.writable: dict[str, tuple[int, str]] = {}

    def _local(self, name: str) -> Callable[..., Any]:
        # Looked up at each call: the session's `tools` are rebuilt in every sandbox it lives in.
        return getattr(self.namespace["tools"].local, name)  # type: ignore[no-any-return]

    def define_submit(self, fields: list[list[str]]) -> None:
        """Bind SUBMIT with one parameter per output field ([name, type name or ""]), each checked
        as an identifier by the host; with no fields, SUBMIT(output)."""
        pairs = fields or [["output", ""]]
        params = ", ".join(f"{name}: {kind}" if kind in SUBMIT_TYPES else name for name, kind in pairs)
        value = "{" + ", ".join(f"{name!r}: {name}" for name, _ in pairs) + "}"
        # Output fields may take any name but the reserved ones, so the exception goes by one.
        scope: dict[str, Any] = {"_mcp_sandbox_Submitted": Submitted}
        scope.update({k: v for k, v in SUBMIT_TYPES.items() if v})
        scope["NoneType"] = None
        exec(f"def SUBMIT({params}):\n    raise _mcp_sandbox_Submitted({value})\n", scope)
        submit = scope["SUBMIT"]
        submit.__doc__ = "Submit the final output: the program stops here and execute() returns it."
        self.namespace["SUBMIT"] = submit

    def bind_tools(self, names: list[str], stale: list[str]) -> None:
        """Make each local tool a global of its own name, and drop the ones no longer given."""
        for name in stale:
            self.namespace.pop(name, None)
        for name in names:
            self.namespace[name] = self._local(name)

    def set_environment(self, variables: dict[str, str]) -> None:
        os.environ.update(variables)

    def mount(self, files_json: str) -> None:
        """Copy the host's files into MOUNT_FOLDER: JSON [{name, parts, sync}], index = position;
        the ones with `sync` go back to the host when a run changes them."""
        files = json.loads(files_json)
        if files:
            os.makedirs(MOUNT_FOLDER, exist_ok=True)
        for index, spec in enumerate(files):
            data = b"".join(
                base64.b64decode(self._local("_mcp_sandbox_file")(index=index, part=part))
                for part in range(spec["parts"])
            )
            path = os.path.join(MOUNT_FOLDER, spec["name"])
            with open(path, "wb") as out:
                out.write(data)
            if spec["sync"]:
                self.writable[path] = (index, hashlib.sha256(data).hexdigest())

    def run(self, request: str | None) -> Report | None:
        """execute(): `request` is JSON text {code, variables: {name: JSON text}}, or None when
        the host holds it for the taking (too large to send as code). The report, as the run's
        value when it fits the result, else None (sent through the tool)."""
        program, refused = self._prepare(request)
        if program is None:
            return refused
        if program.is_async:
            # Code only a newer Python than the host's can parse, which also awaits.
            from pyodide.ffi import run_sync  # type: ignore[import-not-found, unused-ignore]

            return self._finish(program, lambda: run_sync(program.run_async(self.namespace)))
        return self._finish(program, lambda: program.run(self.namespace))

    async def run_async(self, request: str | None) -> Report | None:
        """run() for code that awaits at its top level."""
        program, refused = self._prepare(request)
        if program is None:
            return refused
        pending: Coroutine[Any, Any, Any] = program.run_async(self.namespace)
        try:
            value = await pending
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - the program's failure is reported, not raised
            return self._failed(error, program)
        return self._succeeded(value)

    def _prepare(self, request: str | None) -> tuple[Any, Report | None]:
        """The request's variables bound and its code compiled (the guest runtime's Program), or
        no program and the report of its SyntaxError."""
        if request is None:
            request = self._pull("_mcp_sandbox_request")
        data = json.loads(request)
        for name, text in data["variables"].items():
            self.namespace[name] = json.loads(
                text if text is not None else self._pull("_mcp_sandbox_variable", name)
            )
        self.cells += 1
        try:
            return sys.modules[GUEST_RUNTIME].Program(data["code"], FILENAME.format(self.cells)), None
        except (SyntaxError, ValueError, RecursionError, MemoryError) as error:  # null bytes, deep nesting
            return None, self._report_error(error, "")

    def _finish(self, program: Any, run: Callable[[], Any]) -> Report | None:
        try:
            value = run()
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # noqa: BLE001 - the program's failure is reported, not raised
            return self._failed(error, program)
        return self._succeeded(value)

    def _failed(self, error: BaseException, program: Any) -> Report | None:
        if isinstance(error, Submitted):
            self._sync_files()
            return self._report({"final": error.args[0] if error.args else None})
        return self._report_error(error, program.filename)

    def _succeeded(self, value: Any) -> Report | None:
        self._sync_files()
        return self._report_text("{}" if value is None else '{"value": ' + _json(value) + "}")

    def _report_error(self, error: BaseException, filename: str) -> Report | None:
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != filename:
            tb = tb.tb_next
        message = "".join(traceback.format_exception(type(error), error, tb)).strip()
        return self._report(
            {"error": {"type": type(error).__name__, "args": _args(error), "message": message}}
        )

    def _sync_files(self) -> None:
        """Send the host each writable mounted file this run changed."""
        for path, (index, digest) in list(self.writable.items()):
            try:
                with open(path, "rb") as source:
                    data = source.read()
            except OSError:
                continue
            now = hashlib.sha256(data).hexdigest()
            if now == digest:
                continue
            self._send("_mcp_sandbox_sync", base64.b64encode(data).decode(), index=index)
            self.writable[path] = (index, now)

    def _report(self, report: dict[str, Any]) -> Report | None:
        return self._report_text(json.dumps(report, default=_plain))

    def _report_text(self, text: str) -> Report | None:
        """The report as the run's value when the result can carry it whole, else through the tool."""
        if len(text) <= self.report_chars:
            return Report(text)
        self._send("_mcp_sandbox_report", text)
        return None

    def _send(self, tool: str, text: str, **arguments: Any) -> None:
        """`text` to the host through `tool`, in parts (one, empty, for an empty text)."""
        starts = range(0, max(len(text), 1), PART_CHARS)
        for start in starts:
            self._local(tool)(**arguments, part=text[start : start + PART_CHARS], last=start == starts[-1])

    def _pull(self, tool: str, *name: str) -> str:
        """A text the host holds, in parts: each call answers {text, more}."""
        parts: list[str] = []
        while True:
            piece = self._local(tool)(*name, part=len(parts))
            parts.append(piece["text"])
            if not piece["more"]:
                return "".join(parts)
