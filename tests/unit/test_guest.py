"""The guest runtime, run here in CPython: the same code Pyodide loads."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from mcp_sandbox import protocol
from mcp_sandbox.backends.process import GUEST_MODULES
from mcp_sandbox.guest import (
    CappedText,
    Interpreter,
    interrupted_json,
    interrupted_outcome,
    jit_warm_up,
    run_json,
)
from mcp_sandbox.protocol import GuestOutcome, OutputLimits, cap_text

NO_ARTIFACTS: OutputLimits = {"max_files": 0, "max_bytes": 0, "max_figures": 0}


def interpreter(limit: int = 1000, output: OutputLimits = NO_ARTIFACTS) -> Interpreter:
    return Interpreter({"max_output_chars": limit, "max_kept_output_chars": 0, "output": output})


def run(code: str, session: Interpreter | None = None, limit: int = 1000) -> GuestOutcome:
    outcome = (session or interpreter(limit)).run(code)
    if not isinstance(outcome, dict):
        outcome = asyncio.run(outcome)
    return outcome


def test_capped_text_keeps_everything_under_the_limit() -> None:
    stream = CappedText(10)
    stream.write("abc")
    stream.write("def")
    assert stream.getvalue() == "abcdef" and not stream.truncated


def test_capped_text_keeps_head_and_tail_and_counts_the_cut() -> None:
    stream = CappedText(10)
    for _ in range(1000):
        stream.write("0123456789")
    value = stream.getvalue()
    assert stream.truncated and stream.total == 10_000
    assert value.startswith("01234") and value.endswith("56789")
    assert "[9,990 characters truncated]" in value


def test_capped_text_memory_stays_bounded_under_many_small_writes() -> None:
    stream = CappedText(100)
    tracemalloc.start()
    try:
        for index in range(100_000):
            stream.write(str(index % 10))
        held, _peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 20_000, "100,000 writes kept would hold megabytes"
    assert stream.getvalue().endswith("6789")


def test_capped_text_keeps_the_start_whole_when_cut_up_to_its_keep_limit() -> None:
    stream = CappedText(10, keep=25)
    for _ in range(10):
        stream.write("0123456789")
    assert stream.kept() == {"text": "0123456789012345678901234", "total": 100}
    uncut = CappedText(10, keep=25)
    uncut.write("short")
    assert uncut.kept() is None, "nothing was cut, so the result has it all"
    assert CappedText(10).kept() is None


def test_the_first_line_printed_is_reported_at_once_even_on_a_clock_near_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A new Pyodide worker's monotonic clock starts at its own start: 0.2 s into a fresh sandbox.
    now = [0.2]
    monkeypatch.setattr("mcp_sandbox.guest.capture.monotonic", lambda: now[0])
    lines: list[str] = []
    stream = CappedText(1000, on_line=lines.append)
    stream.write("spinning\n")
    stream.write("too soon\n")
    now[0] += 0.6
    stream.write("later\n")
    assert lines == ["spinning", "later"]


def test_cap_text_short_and_long() -> None:
    assert cap_text("short", 100) == ("short", False)
    capped, cut = cap_text("x" * 1000, 100)
    assert cut and len(capped) < 200


def test_last_expression_is_the_result() -> None:
    assert run("a = 2\na * 21")["result"] == "42"
    assert run("a = 2")["result"] is None
    assert run("None")["result"] is None
    assert run("")["success"] is True


def test_state_persists_within_a_session_only() -> None:
    session = interpreter()
    run("x = 1", session)
    assert run("x + 1", session)["result"] == "2"
    assert run("x")["error_type"] == "NameError"


def test_exception_traceback_shows_only_user_frames() -> None:
    outcome = run("def f():\n    raise ValueError('bad')\nf()")
    assert outcome["success"] is False and outcome["error_type"] == "ValueError"
    error = str(outcome["error"])
    assert error.startswith("Traceback") and "raise ValueError('bad')" in error
    assert "mcp_sandbox" not in error


def test_syntax_error() -> None:
    outcome = run("1 +")
    assert outcome["error_type"] == "SyntaxError" and "Traceback" not in str(outcome["error"])


def test_system_exit_zero_is_success_and_nonzero_is_failure() -> None:
    assert run("import sys\nsys.exit(0)")["success"] is True
    assert run("import sys\nsys.exit(2)")["error_type"] == "SystemExit"


def test_output_is_captured_and_stdout_restored() -> None:
    import sys

    before = sys.stdout
    outcome = run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (outcome["stdout"], outcome["stderr"]) == ("out\n", "err\n")
    assert sys.stdout is before


def test_top_level_await_returns_a_coroutine_with_the_result() -> None:
    outcome = interpreter(100).run("import asyncio\nawait asyncio.sleep(0)\n'done'")
    assert not isinstance(outcome, dict)
    assert asyncio.run(outcome)["result"] == "'done'"


def test_broken_repr_does_not_lose_the_run() -> None:
    outcome = run("class Odd:\n    def __repr__(self):\n        raise RuntimeError('no')\nOdd()")
    assert outcome["success"] is True and "repr() failed" in str(outcome["result"])


def test_output_flood_is_capped_at_the_source() -> None:
    outcome = run("print('z' * 100_000)", limit=1000)
    assert outcome["truncated"] is True and len(str(outcome["stdout"])) < 1100


def test_patching_json_cannot_break_reporting() -> None:
    original = json.dumps
    try:
        reported = run_json(interpreter(100), "import json\njson.dumps = None\n1")
    finally:
        json.dumps = original  # the program patched this very process's json module
    assert json.loads(str(reported))["result"] == "1"


@pytest.mark.parametrize("code", ["raise KeyboardInterrupt", "raise BaseException('x')"])
def test_base_exceptions_are_reported_not_raised(code: str) -> None:
    assert run(code)["success"] is False


LIMITS: OutputLimits = {"max_files": 10, "max_bytes": 1_000_000, "max_figures": 0}


def test_output_files_are_reported_by_the_run_that_wrote_them(tmp_path: Path) -> None:
    # An interpreter reuses the scan after one run as the scan before the next: a file must still be
    # reported exactly by the runs that create or change it.
    session = interpreter(output=LIMITS)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        os.mkdir("output")
        first = session.run("open('output/a.txt', 'w').write('one')")
        second = session.run("1 + 1")
        third = session.run("open('output/a.txt', 'w').write('three!')")
    assert isinstance(first, dict) and isinstance(second, dict) and isinstance(third, dict)
    assert [f["path"] for f in first["files"]] == ["a.txt"]
    assert second["files"] == []
    assert [(f["path"], f["size"]) for f in third["files"]] == [("a.txt", 6)]


def test_jit_warm_up_leaves_the_users_interpreter_untouched() -> None:
    session = interpreter()
    run("x = 41\ndef broken():\n    return 1 / 0", session)
    jit_warm_up(5)
    assert run("x + 1", session)["result"] == "42"
    assert run("'fib' in globals() or 'rows' in globals()", session)["result"] == "False"
    # Tracebacks still quote the user's own lines, not the warm-up program's.
    error = run("broken()", session)["error"]
    assert isinstance(error, str) and "return 1 / 0" in error


#: Loads the guest as a runner does (the CPython worker's load_module), in a Python that cannot
#: import the installed package, then runs a program whose error passes through the tool bridge.
LOAD_AS_A_RUNNER = """
import json, sys, types
sys.modules["mcp_sandbox"] = None  # an import the load order does not satisfy fails
for name, source in json.load(sys.stdin):
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
guest = sys.modules[sys.modules["mcp_sandbox.protocol"].GUEST_RUNTIME_MODULE]
output = {"max_files": 0, "max_bytes": 0, "max_figures": 0}
limits = {"max_output_chars": 1000, "max_kept_output_chars": 0, "output": output}
print(guest.run_json(guest.Interpreter(limits), "print('hi')\\ntools.describe('x')"))
"""


def test_the_guest_loads_from_source_in_the_protocol_order_as_runners_load_it(tmp_path: Path) -> None:
    guest_folder = Path(protocol.__file__).with_name("guest")
    named = {
        name.removeprefix("mcp_sandbox.guest").lstrip(".") or "__init__" for name in protocol.GUEST_MODULES
    }
    assert named == {path.stem for path in guest_folder.glob("*.py")}, "every guest module is sent"
    done = subprocess.run(
        [sys.executable, "-I", "-c", LOAD_AS_A_RUNNER],
        input=json.dumps(GUEST_MODULES),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert outcome["stdout"] == "hi\n" and outcome["error_type"] == "ToolError"
    # The runtime's own frames are left out of the traceback: the user's line is the last one.
    assert "mcp_sandbox" not in outcome["error"] and "tools.describe('x')" in outcome["error"]


#: Installs the Pyodide worker's audit hook in this Python (hooks cannot be removed), rebinds the
#: module's list of watched events as a program could, and prints what the hook reported.
REACHING_PAST = """
import ctypes, gc, json, sys
from mcp_sandbox.guest import pyodide_worker
reported = []
pyodide_worker.report_reaching_past(reported.append)
pyodide_worker.REACHING_PAST = ("nothing",)
open("/dev/null").close()
gc.get_objects()
ctypes.CDLL(None)
sys.settrace(None)
print(json.dumps(sorted({event.split(".")[0] for event in reported})))
"""


def test_the_pyodide_workers_audit_hook_reports_reaching_past_whatever_the_module_holds() -> None:
    done = subprocess.run(
        [sys.executable, "-c", REACHING_PAST], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["ctypes", "gc", "sys"]


def test_an_interrupt_outside_the_program_reads_as_the_cpython_runners_report_it() -> None:
    assert json.loads(interrupted_json()) == interrupted_outcome(KeyboardInterrupt())
    assert json.loads(interrupted_json())["error"] == "KeyboardInterrupt"
