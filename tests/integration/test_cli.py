"""The command line, run as real processes of the installed `mcp-sandbox` entry point."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mcp_sandbox.settings import Settings
from tests.helpers import TEST_ENV
from tests.package_index import closed_port_url, serve_index

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINT = Path(sys.executable).with_name("mcp-sandbox")
CALC_ARGS = ["-m", "tests.upstreams.calc_server"]
CALC_UPSTREAM = {"command": sys.executable, "args": CALC_ARGS, "cwd": str(REPO)}


def cli_env(**settings: str) -> dict[str, str]:
    """This environment without any MCP_SANDBOX_* of its own, plus `settings`."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCP_SANDBOX_")}
    return {**env, "PYTHONIOENCODING": "utf-8", "MCP_SANDBOX_INTERRUPT_GRACE": "1", **settings}


def cli(
    *args: str, stdin: str | None = None, cwd: Path, timeout: float = 120, **settings: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ENTRY_POINT), *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=cli_env(**settings),
        timeout=timeout,
    )


def program(tmp_path: Path, code: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(code, encoding="utf-8")
    return str(path)


def test_the_entry_point_is_installed() -> None:
    assert os.access(ENTRY_POINT, os.X_OK), f"run `pip install -e .` first: no {ENTRY_POINT}"


# --- run


def test_run_prints_output_error_output_and_the_final_value_on_pyodide(tmp_path: Path) -> None:
    code = "import sys\nprint('hello')\nprint('to stderr', file=sys.stderr)\nsys.platform, 6 * 7\n"
    done = cli("run", "--backend", "pyodide", program(tmp_path, code), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello\n('emscripten', 42)\n"
    assert done.stderr == "to stderr\n"


def test_run_on_the_subprocess_backend(tmp_path: Path) -> None:
    done = cli("run", "--backend", "subprocess", program(tmp_path, "import sys; sys.platform"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "'linux'\n"), done.stderr


def test_run_reads_the_program_from_stdin(tmp_path: Path) -> None:
    done = cli("run", "--backend", "subprocess", "-", stdin="print(sum(range(10)))\n", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (0, "45\n"), done.stderr


def test_a_failing_program_exits_1_with_its_traceback(tmp_path: Path) -> None:
    code = "print('before')\ndef divide():\n    return 1 / 0\ndivide()\n"
    done = cli("run", "--backend", "subprocess", program(tmp_path, code), cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == "before\n"
    assert "ZeroDivisionError: division by zero" in done.stderr
    assert "return 1 / 0" in done.stderr, "the program's own frames are shown"


def test_a_timeout_exits_1(tmp_path: Path) -> None:
    started = time.monotonic()
    done = cli(
        "run", "--backend", "subprocess", "--timeout", "1", "-", stdin="while True: pass\n", cwd=tmp_path
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Timeout: "), done.stderr
    assert time.monotonic() - started < 20


def test_ctrl_c_exits_quietly(tmp_path: Path) -> None:
    # In the host's /tmp, which a worker with isolation none (under a uid of its own) may write.
    started = Path(tempfile.gettempdir()) / f"mcp-sandbox-ctrl-c-{os.getpid()}"
    started.unlink(missing_ok=True)
    process = subprocess.Popen(
        [str(ENTRY_POINT), "run", "--backend", "subprocess", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        # Isolation none lets the program write a host file (quietly: the warning is below ERROR).
        env=cli_env(MCP_SANDBOX_ISOLATION="none", MCP_SANDBOX_LOG_LEVEL="ERROR"),
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    # The file says the program is running, and which process runs it.
    process.stdin.write(f"import os\nopen({str(started)!r}, 'w').write(str(os.getpid()))\nwhile True: pass\n")
    process.stdin.close()
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert started.exists(), f"the program never started: {process.poll()} {process.stderr.read()}"
    while not started.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    worker = Path(f"/proc/{started.read_text()}")
    process.send_signal(signal.SIGINT)
    started.unlink()
    # At once: the sandbox is closed and the process exits without the interpreter's teardown.
    assert process.wait(timeout=20) == 130
    assert process.stderr.read() == "" and process.stdout.read() == ""
    assert not worker.exists(), "the process that ran the program outlived the command"


# --- the stdio server, stopped by a signal


class StdioWire:
    """A stdio server process spoken to in raw JSON-RPC lines, so the test holds its pid."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            [str(ENTRY_POINT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
        )
        self._ids = iter(range(1, 1000))

    def send(self, method: str, params: dict[str, Any], *, notify: bool = False) -> int:
        assert self.process.stdin is not None
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method, "params": params}
        number = 0 if notify else next(self._ids)
        if not notify:
            message["id"] = number
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()
        return number

    def answer(self, number: int) -> dict[str, Any]:
        """The response to request `number`."""
        return self.until(lambda message: message.get("id") == number)

    def until(self, wanted: Callable[[dict[str, Any]], bool], limit: float = 120) -> dict[str, Any]:
        """The first message from the server that is `wanted`, within `limit` seconds."""
        assert self.process.stdout is not None
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            line = self.process.stdout.readline() if ready else b""
            assert line, f"the server said nothing more: exit {self.process.poll()}"
            message: dict[str, Any] = json.loads(line)
            if wanted(message):
                return message
        raise AssertionError(f"nothing wanted within {limit} s")

    def start(self) -> None:
        hello = {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        self.answer(self.send("initialize", hello))
        self.send("notifications/initialized", {}, notify=True)


@pytest.mark.parametrize(
    ("how", "backend", "running"),
    [
        (None, "pyodide", False),
        (signal.SIGTERM, "pyodide", False),
        (signal.SIGINT, "pyodide", True),
        (signal.SIGTERM, "subprocess", True),
        (signal.SIGTERM, "inprocess", False),
    ],
    ids=[
        "stdin-ends-pyodide",
        "sigterm-pyodide",
        "ctrl-c-pyodide-mid-call",
        "sigterm-subprocess-mid-call",
        "sigterm-inprocess",
    ],
)
def test_the_stdio_server_stops_at_a_signal_and_leaves_nothing_behind(
    tmp_path: Path, how: signal.Signals | None, backend: str, running: bool
) -> None:
    """What Claude Desktop and a terminal's Ctrl-C send: the server stops at once, closes its
    sandboxes, saves its sessions and removes every folder it made (here: everything in its
    TMPDIR). Its stdin's end does the same."""
    temp, state = tmp_path / "tmp", tmp_path / "state"
    temp.mkdir()
    settings = {name: value for name, value in TEST_ENV.items() if name != "MCP_SANDBOX_LOG_LEVEL"}
    env = cli_env(**settings, TMPDIR=str(temp), MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_STATE_DIR=str(state))
    wire = StdioWire(env, tmp_path)
    try:
        wire.start()
        kept = {"name": "execute_python", "arguments": {"code": "x = 41", "session_id": "kept"}}
        assert not wire.answer(wire.send("tools/call", kept))["result"]["isError"]
        if running:
            code = "print('spinning', flush=True)\nwhile True: pass"
            spin = {"name": "execute_python", "arguments": {"code": code}, "_meta": {"progressToken": "spin"}}
            wire.send("tools/call", spin)
            wire.until(lambda message: "spinning" in str(message.get("params", {}).get("message")))
        if how is None:
            assert wire.process.stdin is not None
            wire.process.stdin.close()
        else:
            wire.process.send_signal(how)
        assert wire.process.wait(timeout=60) == 0
    finally:
        if wire.process.poll() is None:
            wire.process.kill()
            wire.process.wait()
    assert wire.process.stderr is not None
    errors = wire.process.stderr.read().decode()
    assert "Traceback" not in errors, errors
    assert sorted(path.name for path in temp.iterdir()) == [], "every folder the server made is gone"
    if backend == "inprocess":
        return  # its sessions live in the server's process only
    restarted = cli_env(
        **settings, TMPDIR=str(temp), MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_STATE_DIR=str(state)
    )
    again = StdioWire(restarted, tmp_path)
    try:
        again.start()
        follow = {"name": "execute_python", "arguments": {"code": "x + 1", "session_id": "kept"}}
        result = again.answer(again.send("tools/call", follow))["result"]
        assert result["structuredContent"]["result"] == "42", result
    finally:
        assert again.process.stdin is not None
        again.process.stdin.close()
        again.process.wait(timeout=60)


# --- errors: one line on stderr, never a traceback


def _bad_bridge_config(tmp_path: Path) -> str:
    path = tmp_path / "upstreams.json"
    path.write_text('{"mcpServers": ', encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing file", "no such file: "),
        ("invalid setting", "invalid setting: MCP_SANDBOX_TIMEOUT: Input should be greater than 0"),
        ("no Deno", "the pyodide backend needs Deno, and none was found at "),
        ("bad bridge config", "is not JSON"),
        ("warmup without Deno", "no Deno found"),
        ("serve with a bad bridge config", "is not JSON"),
    ],
)
def test_errors_are_one_clear_line(tmp_path: Path, case: str, expected: str) -> None:
    hello = program(tmp_path, "print('hello')")
    args, settings = {
        "missing file": (["run", str(tmp_path / "missing.py")], {}),
        "invalid setting": (["run", hello], {"MCP_SANDBOX_TIMEOUT": "-1"}),
        "no Deno": (
            ["run", "--backend", "pyodide", hello],
            {"MCP_SANDBOX_DENO_PATH": str(tmp_path / "deno")},
        ),
        "bad bridge config": (
            ["run", "--backend", "subprocess", hello],
            {"MCP_SANDBOX_BRIDGE_CONFIG": _bad_bridge_config(tmp_path)},
        ),
        "warmup without Deno": (["warmup"], {"MCP_SANDBOX_DENO_PATH": str(tmp_path / "deno")}),
        "serve with a bad bridge config": (
            ["serve", "--bridge-config", _bad_bridge_config(tmp_path)],
            {},
        ),
    }[case]
    done = cli(*args, cwd=tmp_path, **settings)
    assert done.returncode in (1, 2)
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("mcp-sandbox: ") and expected in done.stderr, done.stderr


def test_run_exit_status_2_when_the_program_cannot_run(tmp_path: Path) -> None:
    assert cli("run", str(tmp_path / "missing.py"), cwd=tmp_path).returncode == 2


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([], "With no command, serves MCP over stdio"),
        (["serve"], "streamable HTTP at /mcp"),
        (["run"], "Exit status: 0 when the program succeeded, 1 when it failed"),
        (["doctor"], "a fix for each problem"),
        (["warmup"], "--packages PACKAGES"),
    ],
)
def test_help_of_every_command(tmp_path: Path, command: list[str], expected: str) -> None:
    done = cli(*command, "--help", cwd=tmp_path, timeout=30)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("usage: mcp-sandbox")
    assert expected in " ".join(done.stdout.split()), done.stdout


# --- fetch


def test_fetch_gets_the_default_packages_once_and_refuses_a_tampered_file(tmp_path: Path) -> None:
    (tmp_path / "index").mkdir()
    packages = tmp_path / "packages"
    with serve_index(tmp_path / "index") as index:
        index.add_wheel("sbxdemo", "ANSWER = 42")
        index.add_wheel("sbxtampered", "ANSWER = 0", tampered=True)
        settings = {
            "MCP_SANDBOX_PACKAGES_DIR": str(packages),
            "MCP_SANDBOX_PACKAGE_INDEX_URL": index.url,
            "MCP_SANDBOX_DEFAULT_PACKAGES": "sbxdemo",
        }
        done = cli("fetch", cwd=tmp_path, **settings)
        assert done.returncode == 0, done.stderr
        assert re.search(r"sbxdemo +fetched, .* sha256 checked \(1/1\)", done.stderr), done.stderr
        assert (packages / "sbxdemo-1.0-py3-none-any.whl").is_file()
        fetched = len(index.requests)
        again = cli("warmup", cwd=tmp_path, **settings)
        assert again.returncode == 0 and "sbxdemo                  already here" in again.stderr, again.stderr
        assert len(index.requests) == fetched, "nothing fetched the second time"
        refused = cli("fetch", "--packages", "sbxtampered", cwd=tmp_path, **settings)
    assert refused.returncode == 1 and "does not match the sha256" in refused.stderr, refused.stderr
    assert refused.stderr.splitlines()[-1] == "mcp-sandbox: 1 of 1 package files not fetched: sbxtampered"
    assert sorted(path.name for path in packages.glob("*.whl")) == ["sbxdemo-1.0-py3-none-any.whl"]


def test_fetch_from_an_unreachable_index_names_the_fix(tmp_path: Path) -> None:
    done = cli(
        "fetch",
        "--packages",
        "six",
        "--index-url",
        closed_port_url(),
        cwd=tmp_path,
        MCP_SANDBOX_PACKAGES_DIR=str(tmp_path / "packages"),
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "could not be reached" in done.stderr and "--index-url, MCP_SANDBOX_PACKAGE_INDEX_URL" in done.stderr
    )


# --- doctor


def check_line(output: str, name: str) -> tuple[str, str]:
    """(mark, detail) of the doctor's line for the check `name`."""
    # Names are padded to a column: two spaces end one, so "user" is not "user namespaces".
    match = re.search(rf"^(\S) {re.escape(name)}\s{{2,}}(.*)$", output, re.MULTILINE)
    assert match is not None, f"no line for {name!r} in:\n{output}"
    return match[1], match[2]


def fix_after(output: str, name: str) -> str:
    lines = output.splitlines()
    index = next(i for i, line in enumerate(lines) if re.match(rf"^\S {re.escape(name)}\s{{2,}}", line))
    fix = lines[index + 1].strip()
    assert fix.startswith("fix: "), output
    return fix


def claude_desktop_snippet(output: str) -> dict[str, object]:
    after = output.split("Claude Desktop: add this to claude_desktop_config.json\n", 1)[1]
    snippet: dict[str, object] = json.loads(after.split("\n\n", 1)[0])
    return snippet


async def calc_tool_count() -> int:
    """How many tools the calc upstream lists, asked with the real MCP client."""
    async with Client(StdioServerParameters(command=sys.executable, args=CALC_ARGS, cwd=REPO)) as client:
        return len((await client.list_tools()).tools)


@pytest.mark.anyio
async def test_doctor_checks_everything_and_prints_a_claude_desktop_config(tmp_path: Path) -> None:
    config = tmp_path / "upstreams.json"
    config.write_text(json.dumps({"mcpServers": {"calc": CALC_UPSTREAM}}), encoding="utf-8")
    done = cli("doctor", cwd=tmp_path, MCP_SANDBOX_BRIDGE_CONFIG=str(config))
    output = done.stdout
    assert done.returncode == 0, output
    assert "Traceback" not in done.stderr
    for name in ("settings", "Python", "Deno", "subprocess backend", "inprocess backend", "bridge config"):
        assert check_line(output, name)[0] == "✓", output
    # Warnings at most: a machine may lack the Pyodide cache, or any OS sandbox (isolation none).
    for name in ("Pyodide", "pyodide backend", "isolation", "packages folder"):
        assert check_line(output, name)[0] in "✓!", output
    assert "trusted code only" in check_line(output, "inprocess backend")[1]
    expected = await calc_tool_count()
    assert check_line(output, "upstream calc") == (
        "✓",
        f"reachable, {expected} tools ({sys.executable} -m tests.upstreams.calc_server)",
    )

    entry = claude_desktop_snippet(output)["mcpServers"]["python-sandbox"]  # type: ignore[index]
    assert entry["command"] == str(ENTRY_POINT)
    assert os.access(entry["command"], os.X_OK)
    assert entry["env"] == {"MCP_SANDBOX_BRIDGE_CONFIG": str(config), "MCP_SANDBOX_INTERRUPT_GRACE": "1"}
    http = json.loads(output.split("then give your client\n", 1)[1].split("\n\n", 1)[0])
    assert http["mcpServers"]["python-sandbox"]["url"] == "http://127.0.0.1:8000/mcp"


def test_doctor_shows_a_bad_deno_path_with_its_fix(tmp_path: Path) -> None:
    missing = tmp_path / "no-deno"
    done = cli("doctor", cwd=tmp_path, MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_DENO_PATH=str(missing))
    output = done.stdout
    assert done.returncode == 1, "pyodide is the configured backend, and it cannot start"
    assert check_line(output, "Deno") == ("✗", f"MCP_SANDBOX_DENO_PATH={missing} is not an executable file")
    assert "point MCP_SANDBOX_DENO_PATH at a Deno binary" in fix_after(output, "Deno")
    assert check_line(output, "pyodide backend")[0] == "✗"
    assert output.rstrip().endswith("see the fix under each.")


def test_doctor_without_deno_warns_when_auto_falls_back(tmp_path: Path) -> None:
    done = cli("doctor", cwd=tmp_path, MCP_SANDBOX_DENO_PATH=str(tmp_path / "no-deno"))
    output = done.stdout
    assert done.returncode == 0, output
    assert check_line(output, "Deno")[0] == "!"
    assert check_line(output, "pyodide backend")[1].endswith("(auto falls back to subprocess)")
    assert check_line(output, "subprocess backend")[0] == "✓"


def test_doctor_reports_a_bad_bridge_config_and_an_unreachable_upstream(tmp_path: Path) -> None:
    # One backend, the quickest to start: the bridge's checks do not depend on it.
    done = cli(
        "doctor",
        "--backend",
        "inprocess",
        cwd=tmp_path,
        MCP_SANDBOX_BRIDGE_CONFIG=_bad_bridge_config(tmp_path),
    )
    assert done.returncode == 1
    assert check_line(done.stdout, "bridge config")[0] == "✗"
    assert "unset MCP_SANDBOX_BRIDGE_CONFIG" in fix_after(done.stdout, "bridge config")

    config = tmp_path / "gone.json"
    config.write_text(json.dumps({"mcpServers": {"gone": {"command": str(tmp_path / "nothing")}}}))
    done = cli("doctor", "--backend", "inprocess", cwd=tmp_path, MCP_SANDBOX_BRIDGE_CONFIG=str(config))
    assert done.returncode == 1
    assert "pyodide backend" not in done.stdout and "subprocess backend" not in done.stdout
    mark, detail = check_line(done.stdout, "upstream gone")
    assert mark == "✗" and detail.startswith("unreachable: "), done.stdout


def test_doctor_reports_invalid_settings(tmp_path: Path) -> None:
    done = cli("doctor", cwd=tmp_path, MCP_SANDBOX_DATA_DIR=str(tmp_path / "missing"))
    assert done.returncode == 1
    assert check_line(done.stdout, "settings") == (
        "✗",
        f"MCP_SANDBOX_DATA_DIR: Value error, {tmp_path / 'missing'} is not a folder",
    )


@pytest.mark.parametrize("command", ["serve", "run"])
def test_every_setting_is_a_flag_with_its_help(tmp_path: Path, command: str) -> None:
    done = cli(command, "--help", cwd=tmp_path, timeout=30)
    assert done.returncode == 0, done.stderr
    for name, field in Settings.model_fields.items():
        if name == "auth_token":  # a secret: from the environment only, never a visible flag
            assert not re.search(r"--auth-token(?![\w-])", done.stdout)
            continue
        assert f"--{name.replace('_', '-')} " in done.stdout, f"--{name} is missing"
        words = (field.description or "").split()[:4]
        assert " ".join(words) in " ".join(done.stdout.split()), f"--{name} has no help"
    assert "{auto,pyodide,subprocess,inprocess}" in done.stdout, "choices come from the model"


def test_a_flag_wins_over_the_environment(tmp_path: Path) -> None:
    hello = program(tmp_path, "import sys\nprint(sys.platform)")
    done = cli("run", "--backend", "subprocess", hello, cwd=tmp_path, MCP_SANDBOX_BACKEND="pyodide")
    assert (done.returncode, done.stdout) == (0, "linux\n"), done.stderr
    bad = cli("serve", "--timeout", "-1", cwd=tmp_path, timeout=30)
    assert bad.returncode == 2 and "invalid setting: MCP_SANDBOX_TIMEOUT" in bad.stderr, bad.stderr
    secret = cli("serve", "--auth-token", "x" * 20, cwd=tmp_path, timeout=30)
    assert secret.returncode == 1 and "MCP_SANDBOX_AUTH_TOKEN, not on the command line" in secret.stderr
