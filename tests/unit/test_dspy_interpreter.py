"""The DSPy integration without a sandbox: optional import, protocol shape, generated code."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from dspy.primitives.code_interpreter import CodeInterpreter, _validate_interpreter_factory

from mcp_sandbox.integrations.dspy import (
    CodeInterpreterError,
    SandboxInterpreter,
    _jsonable,
    _prelude,
    _submit_fields,
)


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


def test_prelude_defines_submit_and_binds_tools() -> None:
    namespace: dict[str, object] = {}

    class Local:
        submitted: list[object] = []

        def _mcp_sandbox_submit(self, value: object) -> None:
            self.submitted.append(value)

        def _mcp_sandbox_variable(self, name: str) -> object:
            return name.upper()

        def search(self) -> str:
            return "found"

    class Tools:
        local = Local()

    namespace["tools"] = Tools()
    namespace["gone"] = "stale tool"
    fields = _submit_fields([{"name": "answer", "type": "int"}, {"name": "note", "type": "Literal['a']"}])
    assert fields == [("answer", "int"), ("note", None)]
    exec(_prelude(["search"], ["gone"], fields), namespace)
    assert "gone" not in namespace
    assert namespace["search"]() == "found"  # type: ignore[operator]
    with pytest.raises(SystemExit) as stopped:
        namespace["SUBMIT"](3, note="n")  # type: ignore[operator]
    assert stopped.value.code == 0
    assert Local.submitted == [{"answer": 3, "note": "n"}]
    namespace["_mcp_sandbox_inject"](["abc"])  # type: ignore[operator]
    assert namespace["abc"] == "ABC"


@pytest.mark.parametrize("name", ["a b", "x); import os #", "SUBMIT", "_mcp_sandbox_x"])
def test_output_field_names_cannot_inject_code(name: str) -> None:
    with pytest.raises(CodeInterpreterError):
        _submit_fields([{"name": name}])


def test_variables_must_be_json_data_of_bounded_size() -> None:
    assert _jsonable("s", {"when": {1, 2}}) == {"when": [1, 2]}  # sets and models become JSON data
    with pytest.raises(CodeInterpreterError, match="'big' is 9,000,002 characters"):
        _jsonable("big", "x" * 9_000_000)
