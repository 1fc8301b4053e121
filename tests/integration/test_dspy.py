"""DSPy on mcp-sandbox: the real SandboxInterpreter on the real backends, and real DSPy modules
(ProgramOfThought, RLM) driven by DSPy's own DummyLM, offline."""

from __future__ import annotations

import contextlib
import functools
import gc
import http.server
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dspy
import pytest
from dspy.utils import DummyLM
from dspy.utils.callback import ACTIVE_CALL_ID, BaseCallback

from mcp_sandbox.integrations.dspy import (
    CodeExecutionError,
    CodeInterpreterError,
    FinalOutput,
    SandboxInterpreter,
)

BACKENDS = ["pyodide", "subprocess"]


def children() -> set[int]:
    """Live child processes of this test process (from /proc), zombies left out."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.add(int(entry.name))
    return found


def wait_until_gone(pids: set[int], limit: float = 10) -> set[int]:
    deadline = time.monotonic() + limit
    while (left := pids & children()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def wait_for_the_checkpoint_of_the_last_call(state: Path, limit: float = 30) -> None:
    """Until the one session's checkpoint (taken in idle time) is of its latest call: an execute is
    several runs, and on a loaded machine one may be checkpointed before the next. The record names
    the first call after each checkpoint, so a checkpoint older than the last call is behind it."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        states, records = (
            list((state / "sessions").glob("*.state")),
            list((state / "records").glob("*.record")),
        )
        if len(states) == 1 and len(records) == 1:
            with contextlib.suppress(OSError, ValueError, IndexError):
                header = json.loads(states[0].read_bytes()[:65536].split(b"\n")[1])
                if header["call"] >= json.loads(records[0].read_bytes())["call"]:
                    return
        time.sleep(0.1)
    raise AssertionError(f"no checkpoint of the session's latest call within {limit} s")


def kill_every_sandbox_since(before: set[int]) -> None:
    """SIGKILL the sandbox processes started since `before` was taken, from outside, and wait."""
    started = children() - before
    for pid in started:
        os.kill(pid, signal.SIGKILL)
    assert wait_until_gone(started) == set()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def interpreter(backend: str) -> Iterator[SandboxInterpreter]:
    with SandboxInterpreter(backend=backend, timeout=20, interrupt_grace=1) as started:
        yield started


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # ProgramOfThought is deprecated in DSPy 3.4
def test_program_of_thought_runs_its_code_in_the_sandbox(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The class itself is the factory, as in dspy.configure(interpreter_factory=SandboxInterpreter);
    # the backend comes from the environment like any mcp-sandbox setting.
    monkeypatch.setenv("MCP_SANDBOX_BACKEND", backend)
    code = (
        "```python\nimport math, os, sys\n"
        "SUBMIT({'answer': math.factorial(10), 'where': f'{sys.platform}:{os.getpid()}'})\n```"
    )
    # The LM never states 3628800: it answers so only when the code's output holds it.
    lm = DummyLM(
        {
            '"answer": 3628800': {"reasoning": "the program computed it", "answer": "3628800"},
            "What is 10 factorial?": {"reasoning": "compute it", "generated_code": code},
        }
    )
    before = children()
    with dspy.context(lm=lm, interpreter_factory=SandboxInterpreter):
        prediction = dspy.ProgramOfThought("question -> answer")(question="What is 10 factorial?")
    assert prediction.answer == "3628800"
    final_prompt = lm.history[-1]["messages"][-1]["content"]
    where = json.loads(final_prompt.split("[[ ## code_output ## ]]")[1].split("\n\n")[0].strip())
    platform, pid = where["output"]["where"].split(":")
    if backend == "pyodide":
        assert platform == "emscripten"
    else:
        assert int(pid) != os.getpid()
    # ProgramOfThought shut its interpreter down: no sandbox process is left.
    assert wait_until_gone(children() - before) == set()


def factorial(n: int) -> int:
    return 1 if n <= 1 else n * factorial(n - 1)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # CodeAct is deprecated in DSPy 3.4
def test_code_act_defines_its_tools_in_the_sandbox(backend: str) -> None:
    code = "```python\nimport sys\nprint(factorial(12), sys.platform)\n```"
    lm = DummyLM([{"generated_code": code, "finished": True}, {"reasoning": "r", "factorial": "479001600"}])
    factory = functools.partial(SandboxInterpreter, backend=backend)
    with dspy.context(lm=lm, interpreter_factory=factory):
        result = dspy.CodeAct("n -> factorial", tools=[factorial])(n=12)
    platform = "emscripten" if backend == "pyodide" else "linux"
    assert result.trajectory["code_output_0"] == json.dumps(f"479001600 {platform}\n")


def test_rlm_uses_tools_variables_and_typed_submit(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCP_SANDBOX_BACKEND", backend)
    looked_up: list[str] = []

    def lookup(key: str) -> str:
        """Look a key up on the host."""
        looked_up.append(key)
        return {"x": "forty-two"}[key]

    lm = DummyLM(
        [
            {"reasoning": "look", "code": "```python\nv = lookup(key='x')\nprint(len(context), v)\n```"},
            {"reasoning": "done", "code": "```python\nSUBMIT(answer=v.upper() + str(len(context)))\n```"},
        ]
    )
    with dspy.context(lm=lm, interpreter_factory=SandboxInterpreter):
        result = dspy.RLM("context -> answer", tools=[lookup], max_iters=4)(context="abcdefg")
    assert result.answer == "FORTY-TWO7"
    assert looked_up == ["x"]
    assert result.trajectory[0]["output"] == "7 forty-two\n"


def test_state_persists_and_values_come_back_as_dspy_returns_them(interpreter: SandboxInterpreter) -> None:
    assert interpreter.execute("x = 41\nprint('set')") == "set\n"
    assert interpreter.execute("x + 1") == 42
    assert interpreter.execute("print('a')\nx") == 41  # a value wins over what was printed, as in DSPy
    assert interpreter.execute("y = 1") == ""
    assert interpreter.execute("print('z' * 40_000, end='')") == "z" * 40_000  # all of it, as DSPy
    assert interpreter.execute("(x, {3, 1}, 'text', None)") == [41, [1, 3], "text", None]
    assert interpreter.execute("float('nan')") != interpreter.execute("float('nan')")  # NaN itself
    assert interpreter.execute("object()").startswith("<object object at")  # not data: its repr
    assert interpreter(code="import asyncio\nawait asyncio.sleep(0)\nx") == 41  # __call__, top-level await
    assert interpreter.execute("import asyncio\nasync def f():\n    return 2\nasyncio.run(f())") == 2


def test_variables_cross_as_data_never_as_code(interpreter: SandboxInterpreter) -> None:
    hostile = '\'); import os; os._exit(1) #"""\n{x}'
    values = {
        "text": hostile,
        "table": {"a": [1, 2.5, None, True], "nested": {"k": "v"}},
        "empty": None,
        "count": 3,
    }
    returned = interpreter.execute("SUBMIT([text, table, empty, count])", variables=values)
    assert returned == FinalOutput({"output": [hostile, values["table"], None, 3]})
    # Injected names are ordinary globals afterwards, and a second injection replaces them.
    assert interpreter.execute("count * 2", variables={"count": 5}) == 10
    assert interpreter.execute("text == t", variables={"t": hostile}) is True
    # A variable too large for one message travels in parts (DSPy passes large ones through files).
    big = "é" * 4_000_000
    assert interpreter.execute("len(big), big[-2:]", variables={"big": big, "pairs": {(1, 2)}}) == [
        len(big),
        "éé",
    ]


def test_a_program_that_replaces_the_runtime_gets_an_error_not_a_crash(
    interpreter: SandboxInterpreter,
) -> None:
    forged = "class Forged:\n    def __repr__(self):\n        return '{\"error\": 1}'\n"
    interpreter.execute(forged + "_mcp_sandbox_dspy.run = lambda request: Forged()")
    with pytest.raises(CodeExecutionError, match="report is malformed"):
        interpreter.execute("1")


def test_bad_variables_are_refused_before_running(interpreter: SandboxInterpreter) -> None:
    with pytest.raises(CodeInterpreterError, match="Unsupported value type: object"):
        interpreter.execute("1", variables={"thing": object()})
    for name in ["1x", "class", "SUBMIT", "tools"]:
        with pytest.raises(CodeInterpreterError, match=f"Invalid variable name: {re.escape(repr(name))}"):
            interpreter.execute("1", variables={name: 1})
    assert interpreter.execute("'still fine'") == "still fine"


def test_submit_returns_final_output_and_stops_the_program(interpreter: SandboxInterpreter) -> None:
    assert interpreter.execute("SUBMIT({'answer': 6 * 7})\nafter = True") == FinalOutput(
        {"output": {"answer": 42}}
    )
    with pytest.raises(CodeExecutionError, match="NameError"):
        interpreter.execute("after")
    # RLM's typed form: the output fields become SUBMIT's parameters.
    interpreter.output_fields = [{"name": "answer", "type": "int"}, {"name": "why"}]
    assert interpreter.execute("SUBMIT(7, why='because')") == FinalOutput({"answer": 7, "why": "because"})
    with pytest.raises(CodeExecutionError, match="missing 1 required positional argument: 'why'"):
        interpreter.execute("SUBMIT(7)")


def test_tools_reach_host_callables(backend: str) -> None:
    calls: list[dict[str, Any]] = []
    host_thread = threading.get_ident()

    def search(query: str, limit: int = 2) -> list[str]:
        """Search the host's index."""
        calls.append({"query": query, "limit": limit})
        return [f"{query}-{i}" for i in range(limit)]

    async def weather(city: str) -> dict[str, Any]:
        return {"city": city, "celsius": 21.5}

    def settings_seen() -> bool:
        # A tool runs in the caller's context, so dspy.context(...) holds in it, as in DSPy's interpreter.
        return bool(dspy.settings.get("sandbox_marker") == "seen") and threading.get_ident() != host_thread

    tools = {"search": search, "weather": weather, "settings_seen": settings_seen}
    with SandboxInterpreter(tools=tools, backend=backend) as interpreter:
        out = interpreter.execute("found = search(query='abc')\nprint(len(found), found[-1])")
        assert out == "2 abc-1\n"
        assert calls == [{"query": "abc", "limit": 2}]  # the default applied on the host
        assert interpreter.execute("weather(city='Oslo')['celsius'] * 2") == 43.0
        with dspy.context(sandbox_marker="seen"):
            assert interpreter.execute("settings_seen()") is True
        # Tools added later (as RLM does) reach the session at the next execute.
        interpreter.tools["shout"] = lambda text: text.upper()
        assert interpreter.execute("shout('hey')") == "HEY"
        del interpreter.tools["shout"]
        with pytest.raises(CodeExecutionError, match="NameError"):
            interpreter.execute("shout")


def test_a_failing_tool_raises_tool_error_in_the_code(backend: str) -> None:
    def fragile(n: int) -> int:
        raise ValueError(f"cannot take {n}")

    with SandboxInterpreter(tools={"fragile": fragile}, backend=backend) as interpreter:
        caught = (
            "try:\n    fragile(n=3)\nexcept RuntimeError as error:\n    print(type(error).__name__, error)"
        )
        assert interpreter.execute(caught) == "ToolError ValueError: cannot take 3\n"
        with pytest.raises(CodeExecutionError, match="ValueError: cannot take 4"):
            interpreter.execute("fragile(n=4)")


def test_a_tool_cannot_reenter_its_interpreter(backend: str) -> None:
    interpreter = SandboxInterpreter(backend=backend)
    interpreter.tools["again"] = lambda: interpreter.execute("1")
    with interpreter, pytest.raises(CodeExecutionError, match="cannot execute recursively"):
        interpreter.execute("again()")


def test_errors_in_the_code(interpreter: SandboxInterpreter) -> None:
    interpreter.execute("kept = 'yes'")
    with pytest.raises(CodeExecutionError) as failed:
        interpreter.execute("def f():\n    return 1 / 0\nf()")
    assert str(failed.value) == "ZeroDivisionError: ['division by zero']"  # DSPy's form: type and args
    with pytest.raises(CodeExecutionError) as failed:
        interpreter.execute("raise KeyError")
    assert "KeyError" in str(failed.value) and "Traceback" in str(failed.value)  # no args: the traceback
    with pytest.raises(SyntaxError, match="Invalid Python syntax"):
        interpreter.execute("def broken(:\n    pass")
    with pytest.raises(SyntaxError):
        interpreter.execute("if True:\nprint('not indented')")
    for code, kind in [
        ("import sys\nsys.exit(0)", "SystemExit"),
        ("raise KeyboardInterrupt('stop')", "KeyboardInterrupt"),
    ]:
        with pytest.raises(CodeExecutionError, match=kind):  # errors, as in DSPy, and the session goes on
            interpreter.execute(code)
    assert interpreter.execute("kept") == "yes"  # errors in the code leave the session healthy


def test_a_timeout_is_an_error_and_the_session_survives(backend: str) -> None:
    # A grace of 5 s: on a loaded machine an interrupt can take over 1 s to land (a CI run saw it).
    with SandboxInterpreter(backend=backend, timeout=1, interrupt_grace=5) as interpreter:
        interpreter.execute("kept = 7")
        started = time.monotonic()
        with pytest.raises(CodeExecutionError, match="Timeout: Execution timed out after 1 s"):
            interpreter.execute("while True: pass")
        assert time.monotonic() - started < 10
        assert interpreter.execute("kept") == 7


def test_shutdown_is_idempotent_and_leaves_no_process(backend: str) -> None:
    before = children()
    interpreter = SandboxInterpreter(backend=backend)
    interpreter.start()
    interpreter.start()  # idempotent
    assert interpreter.backend == backend
    started = children() - before
    assert started, "the sandbox runs in a child process"
    assert interpreter.execute("1 + 1") == 2
    interpreter.shutdown()
    interpreter.shutdown()
    assert wait_until_gone(started) == set()
    with pytest.raises(CodeInterpreterError, match="has ended"):
        interpreter.execute("1")
    with pytest.raises(CodeInterpreterError, match="has ended"):
        interpreter.start()


def test_a_forgotten_interpreter_is_closed_when_collected() -> None:
    before = children()
    interpreter = SandboxInterpreter(backend="subprocess")
    interpreter.start()
    started = children() - before
    assert started
    del interpreter
    gc.collect()
    assert wait_until_gone(started) == set()


def test_a_dead_sandbox_is_a_terminal_interpreter_error() -> None:
    before = children()
    with SandboxInterpreter(backend="subprocess") as interpreter:
        interpreter.execute("state = 1")
        with pytest.raises(CodeInterpreterError, match="sandbox was lost"):
            interpreter.execute("import os; os._exit(1)")
        # The state is gone, so the interpreter does not quietly start a fresh session.
        with pytest.raises(CodeInterpreterError, match="has ended"):
            interpreter.execute("state")
    assert wait_until_gone(children() - before) == set()


def test_a_sandbox_killed_between_calls_is_a_terminal_interpreter_error(backend: str) -> None:
    # DSPy's own test_process_death_ends_stateful_session: state that is gone is never a silent
    # fresh session. The kill comes before the first checkpoint (2 s after a call).
    before = children()
    with SandboxInterpreter(backend=backend) as interpreter:
        interpreter.execute("state = 1")
        kill_every_sandbox_since(before)
        with pytest.raises(CodeInterpreterError, match="sandbox was lost"):
            interpreter.execute("state")
        with pytest.raises(CodeInterpreterError, match="has ended"):
            interpreter.execute("1")
    assert wait_until_gone(children() - before) == set()


def test_a_session_rolled_back_to_an_earlier_checkpoint_is_a_terminal_interpreter_error(
    tmp_path: Path,
) -> None:
    before = children()
    state = tmp_path / "state"
    with SandboxInterpreter(backend="subprocess", state_dir=state) as interpreter:
        interpreter.execute("state = 1")
        wait_for_the_checkpoint_of_the_last_call(state)
        interpreter.execute("state = 2")  # killed before this call's checkpoint
        kill_every_sandbox_since(before)
        with pytest.raises(CodeInterpreterError, match="restored from an earlier checkpoint"):
            interpreter.execute("state")


def test_interpreters_from_many_threads() -> None:
    results: dict[int, Any] = {}
    shared = SandboxInterpreter(backend="subprocess")
    shared.execute("total = 0")

    def work(n: int) -> None:
        # Its own interpreter (DSPy may call the factory concurrently) and a shared one.
        with SandboxInterpreter(backend="subprocess") as own:
            results[n] = own.execute("SUBMIT(n * n)", variables={"n": n})
        for _ in range(10):
            shared.execute("total += 1")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert results == {n: FinalOutput({"output": n * n}) for n in range(4)}
        assert shared.execute("total") == 40
    finally:
        shared.shutdown()


def test_host_files_and_environment_reach_the_code_as_in_dspy(backend: str, tmp_path: Path) -> None:
    (tmp_path / "real.txt").write_text("read me")
    given = tmp_path / "given.txt"
    given.symlink_to(tmp_path / "real.txt")  # a link is followed, and keeps its own name inside
    synced, unsynced = tmp_path / "synced.txt", tmp_path / "unsynced.txt"
    unsynced.write_text("original")
    os.environ["MCP_SANDBOX_DSPY_GIVEN"] = "given value"
    os.environ.pop("X", None)
    options: dict[str, Any] = {"backend": backend, "enable_env_vars": ["MCP_SANDBOX_DSPY_GIVEN"]}
    with SandboxInterpreter(enable_read_paths=[given], enable_write_paths=[synced], **options) as interpreter:
        code = "import os\nopen('/sandbox/given.txt').read(), os.getenv('MCP_SANDBOX_DSPY_GIVEN'), "
        code += "os.getenv('X')"
        assert interpreter.execute(code) == ["read me", "given value", None]
        assert synced.read_text() == ""  # a missing writable file is made, empty, as DSPy does
        interpreter.execute(
            "with open('/sandbox/synced.txt', 'w') as out:\n    out.write('from the sandbox')"
        )
        assert synced.read_text() == "from the sandbox"  # written back after the execute
    with SandboxInterpreter(enable_write_paths=[unsynced], sync_files=False, **options) as interpreter:
        assert interpreter.execute("open('/sandbox/unsynced.txt', 'w').write('changed')") == 7
    assert unsynced.read_text() == "original"
    with SandboxInterpreter(backend=backend) as interpreter:  # nothing given: nothing there
        assert interpreter.execute(
            "import os\nos.path.exists('/sandbox/given.txt'), os.getenv('MCP_SANDBOX_DSPY_GIVEN')"
        ) == [False, None]


def test_network_hosts_are_reachable_only_when_given() -> None:
    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Access-Control-Allow-Origin", "*")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    fetch = f"import js\nresponse = await js.fetch({url!r})\nresponse.status, await response.text()"
    try:
        with SandboxInterpreter(
            backend="pyodide", enable_network_access=[f"127.0.0.1:{server.server_address[1]}"]
        ) as given:
            assert given.execute(fetch) == [200, "ok"]
        with (
            SandboxInterpreter(backend="pyodide") as refused,
            pytest.raises(CodeExecutionError, match="net access"),
        ):
            refused.execute(fetch)
        offline = SandboxInterpreter(backend="subprocess", enable_network_access=["127.0.0.1"])
        with pytest.raises(CodeInterpreterError, match="enable_network_access needs the pyodide backend"):
            offline.start()
    finally:
        server.shutdown()


def test_callbacks_see_startup_execute_tools_and_shutdown() -> None:
    events: list[tuple[str, str | None]] = []

    class Recorder(BaseCallback):  # type: ignore[misc]
        def on_interpreter_execute_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            events.append(("execute", ACTIVE_CALL_ID.get()))

        def on_interpreter_startup_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            events.append(("startup", ACTIVE_CALL_ID.get()))

        def on_interpreter_tool_call_start(self, call_id: str, instance: Any, inputs: dict[str, Any]) -> None:
            events.append(("tool " + inputs["tool_name"], ACTIVE_CALL_ID.get()))

        def on_interpreter_shutdown_end(
            self, call_id: str, outputs: Any, exception: Exception | None
        ) -> None:
            events.append(("shutdown", None))

    with SandboxInterpreter(
        backend="pyodide", tools={"echo": lambda value: value}, callbacks=[Recorder()]
    ) as interpreter:
        assert interpreter.execute("echo(value=payload)", variables={"payload": "first"}) == "first"
    assert [name for name, _ in events] == ["execute", "startup", "tool echo", "shutdown"]
    assert events[1][1] == events[2][1] is not None  # startup and the tool call nest inside the execute


def test_a_session_restored_from_its_last_checkpoint_keeps_its_tools_and_submit(
    backend: str, tmp_path: Path
) -> None:
    before = children()
    state = tmp_path / "state"
    options: dict[str, Any] = {"backend": backend, "state_dir": state, "output_fields": [{"name": "answer"}]}
    with SandboxInterpreter(tools={"double": lambda n: 2 * n}, **options) as interpreter:
        interpreter.execute("state = double(21)")
        wait_for_the_checkpoint_of_the_last_call(state)
        kill_every_sandbox_since(before)
        # Nothing was lost, so the interpreter goes on in the new sandbox, with its tools and SUBMIT,
        # a variable too large to travel inside the program, and a tool given since (as RLM does).
        interpreter.tools["triple"] = lambda n: 3 * n
        big = "b" * 20_000
        assert interpreter.execute("double(state) + triple(len(big))", variables={"big": big}) == 60_084
        assert interpreter.execute("SUBMIT(double(state))") == FinalOutput({"answer": 84})
