"""The DSPy integration without a sandbox: optional import, protocol shape, generated code."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from dspy.primitives.code_interpreter import CodeInterpreter, _validate_interpreter_factory

from mcp_sandbox import guest  # noqa: F401 - in every sandbox, where the DSPy runtime uses it
from mcp_sandbox.integrations.dspy import CodeInterpreterError, SandboxInterpreter
from mcp_sandbox.integrations.dspy.errors import CodeExecutionError
from mcp_sandbox.integrations.dspy.interpreter import GUEST_SOURCE, _awaits, _Exchange
from mcp_sandbox.integrations.dspy.mounts import Mounts
from mcp_sandbox.integrations.dspy.values import check_name, tool_result, variable_json


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_mcp_sandbox_and_its_server_do_not_import_dspy() -> None:
    checked = run_python(
        "import sys, mcp_sandbox, mcp_sandbox.server, mcp_sandbox.sandbox, mcp_sandbox.cli, "
        "mcp_sandbox.integrations\nprint('dspy' in sys.modules)"
    )
    assert checked.stdout.strip() == "False", checked.stderr


def test_without_dspy_the_import_error_says_what_to_install() -> None:
    blocked = run_python("import sys\nsys.modules['dspy'] = None\nimport mcp_sandbox.integrations.dspy")
    assert blocked.returncode != 0
    assert (
        'ImportError: mcp_sandbox.integrations.dspy needs DSPy: pip install "mcp-sandbox[dspy]"'
        in blocked.stderr
    )


def test_the_class_is_a_zero_argument_factory_that_starts_nothing() -> None:
    _validate_interpreter_factory(SandboxInterpreter)  # what dspy.configure(interpreter_factory=...) checks
    threads = threading.active_count()
    interpreter = SandboxInterpreter()
    assert isinstance(interpreter, CodeInterpreter)
    assert interpreter.backend is None and interpreter.tools == {}
    assert threading.active_count() == threads
    interpreter.shutdown()  # before start: nothing to stop, still fine
    with pytest.raises(CodeInterpreterError, match="has ended"):
        interpreter.start()


def test_timeout_raises_the_ceiling_and_sets_the_tool_call_limit() -> None:
    interpreter = SandboxInterpreter(timeout=900, backend="subprocess", memory_mb=256)
    settings = interpreter.settings
    assert (settings.timeout, settings.max_timeout, settings.bridge_call_timeout) == (900, 900, 900)
    assert (settings.backend, settings.memory_mb, settings.pool_size) == ("subprocess", 256, 0)


class FakeLocal:
    """The session's `tools.local`, as the guest runtime calls it, recording each call."""

    def __init__(self, held: dict[str, str] | None = None) -> None:
        self.held = held or {}
        self.reports: list[dict[str, Any]] = []
        self._parts: list[str] = []

    def _mcp_sandbox_report(self, part: str, last: bool) -> None:
        self._parts.append(part)
        if last:
            self.reports.append(json.loads("".join(self._parts)))
            self._parts = []

    def _mcp_sandbox_variable(self, name: str, part: int) -> dict[str, Any]:
        text = self.held[name]
        return {"text": text[part * 4 : part * 4 + 4], "more": part * 4 + 4 < len(text)}

    def search(self, query: str) -> str:
        return f"found {query}"


def guest_session(local: FakeLocal, report_chars: int = 1000) -> dict[str, Any]:
    """A namespace with the guest runtime in it, as SandboxInterpreter installs it in a sandbox."""
    namespace: dict[str, Any] = {"__name__": "__main__", "tools": type("Tools", (), {"local": local})()}
    scope: dict[str, Any] = {"__name__": "mcp_sandbox_dspy_guest"}
    exec(compile(GUEST_SOURCE, "guest.py", "exec"), scope)
    namespace["_mcp_sandbox_dspy"] = scope["Runtime"](namespace, report_chars)
    return namespace


def run(namespace: dict[str, Any], code: str, **variables: str | None) -> None:
    """One execute(); its report joins the tool's, as the host reads it off the run's result."""
    report = namespace["_mcp_sandbox_dspy"].run(json.dumps({"code": code, "variables": variables}))
    if report is not None:
        namespace["tools"].local.reports.append(json.loads(repr(report)))


def test_guest_reports_values_errors_and_submit_as_dspy_does() -> None:
    local = FakeLocal()
    session = guest_session(local)
    session["_mcp_sandbox_dspy"].define_submit([["answer", "int"], ["note", "Literal['a']"]])
    session["_mcp_sandbox_dspy"].bind_tools(["search"], [])
    run(session, "x = (1, 2)\nprint('not returned')\nx")
    run(session, "{3, 1, 2}")
    run(session, "raise ValueError(123)")
    run(session, "import sys\nsys.exit(0)")
    run(session, "SUBMIT(3, note=search(query='q'))")
    run(session, "SUBMIT(3)")
    run(session, "print('only printed')")
    run(session, "def f(:")
    run(session, "object()")
    run(session, "'y' * 2000")  # longer than the result carries: through the tool, in parts
    session["_mcp_sandbox_dspy"].define_submit([["Submitted", "str"]])  # any field name but reserved ones
    run(session, "SUBMIT('named so')")
    results, errors = local.reports[:2], local.reports[2:4]
    assert results == [{"value": [1, 2]}, {"value": [1, 2, 3]}]  # tuples and sets as lists
    assert [(e["error"]["type"], e["error"]["args"]) for e in errors] == [
        ("ValueError", [123]),
        ("SystemExit", [0]),
    ]
    assert local.reports[4] == {"final": {"answer": 3, "note": "found q"}}
    assert "missing 1 required positional argument: 'note'" in local.reports[5]["error"]["args"][0]
    assert local.reports[6] == {}  # nothing to return: the host returns what was printed
    assert local.reports[7]["error"]["type"] == "SyntaxError"
    assert local.reports[8]["value"].startswith("<object object at")  # not data: its repr, as text
    assert local.reports[9] == {"value": "y" * 2000}
    assert local.reports[10] == {"final": {"Submitted": "named so"}}


def test_guest_takes_large_variables_in_parts_and_never_reports_an_interrupt() -> None:
    local = FakeLocal({"big": json.dumps(["a" * 10, {"b": None}])})
    session = guest_session(local)
    run(session, "len(big[0]), big[1]", big=None, small='"s"')
    assert local.reports == [{"value": [10, {"b": None}]}]
    assert session["small"] == "s"
    with pytest.raises(KeyboardInterrupt):  # may be the run's timeout: the host reports it
        run(session, "raise KeyboardInterrupt('stop')")
    assert len(local.reports) == 1


@pytest.mark.parametrize("name", ["a b", "x); import os #", "SUBMIT", "_mcp_sandbox_x", "class"])
def test_output_field_and_variable_names_cannot_inject_code(name: str) -> None:
    with pytest.raises(CodeInterpreterError, match="Invalid output field name"):
        SandboxInterpreter(output_fields=[{"name": name}])._submit_fields()
    with pytest.raises(CodeInterpreterError, match="Invalid variable name"):
        check_name(name, "variable")


def test_variables_and_tool_results_convert_as_dspy_converts_them() -> None:
    @dataclasses.dataclass
    class Box:
        x: float
        lock: Any = None

    class Point(NamedTuple):
        x: int
        y: int

    assert json.loads(variable_json({"s": {2, 1}, "t": (1, "a"), "n": None})) == {
        "s": [1, 2],
        "t": [1, "a"],
        "n": None,
    }
    assert variable_json(float("nan")) == "NaN"
    with pytest.raises(CodeInterpreterError, match="Unsupported value type: object"):
        variable_json(object())
    assert tool_result(None) == "" and tool_result("text") == "text"
    assert tool_result(Point(1, 2)) == {"x": 1, "y": 2}
    assert tool_result(Box(1.5)) == {"x": 1.5, "lock": None}
    assert tool_result(float("nan")) == "nan"  # not JSON: its str()
    assert tool_result(Box(1.0, threading.Lock())).startswith("test_variables_and")  # str() of the dataclass


def test_deno_command_is_refused_with_the_reason() -> None:
    with pytest.raises(TypeError, match="not a dict"):
        SandboxInterpreter(deno_command={"a": "b"})  # type: ignore[arg-type]
    with pytest.raises(CodeInterpreterError, match="starts its own sandbox"):
        SandboxInterpreter(deno_command=["deno", "run"])


def test_mounted_files_need_unique_names(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(CodeInterpreterError, match="unique basenames"):
        SandboxInterpreter(
            enable_read_paths=[tmp_path / "a" / "f.txt"], enable_write_paths=[tmp_path / "b" / "f.txt"]
        )
    same = tmp_path / "a" / "same.txt"
    alias = tmp_path / "b" / "same.txt"
    alias.symlink_to(same)
    SandboxInterpreter(enable_read_paths=[same], enable_write_paths=[alias])  # one file, two names: fine


def test_the_sandbox_names_files_by_index_and_cannot_write_back_a_read_only_one(tmp_path: Path) -> None:
    given, written = tmp_path / "given.txt", tmp_path / "written.txt"
    given.write_text("host data")
    mounts = Mounts([given], [written], sync=True)
    assert [spec["name"] for spec in mounts.load()] == ["given.txt", "written.txt"]
    for index in (0, -1, 2, 10**9):
        with pytest.raises(CodeInterpreterError, match="not one the sandbox writes back"):
            mounts.receive(index, "aGk=", last=True)
    with pytest.raises(CodeInterpreterError, match="there is no part"):
        mounts.part(-1, 0)
    with pytest.raises(CodeInterpreterError, match="base64 text"):
        mounts.receive(1, ["a" * 10] * 3, last=False)  # type: ignore[arg-type]
    mounts.receive(1, "AAAA", last=False)  # a run cut off mid-file: its parts never reach the next
    mounts.begin()
    mounts.receive(1, "aG", last=False)
    mounts.receive(1, "k=", last=True)
    assert written.read_text() == "hi" and given.read_text() == "host data"


def test_what_the_sandbox_sends_the_host_is_checked() -> None:
    exchange = _Exchange()
    with pytest.raises(CodeExecutionError, match="ASCII text"):
        exchange.receive(["x" * 10] * 100, last=True)  # type: ignore[arg-type]
    exchange.receive('{"value": ' + "[" * 100_000 + "]" * 100_000 + "}", last=True)
    assert exchange.report is None  # nested past what the parser takes: no report, not a crash
    assert not _awaits("async def f(): pass\n" + "(" * 100_000 + ")" * 100_000)
