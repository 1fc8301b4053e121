"""One wire contract: the runner's TypeScript is generated from mcp_sandbox/protocol.py and
type-checked against it, and the host refuses any message the protocol does not describe."""

from __future__ import annotations

from pathlib import Path

from mcp_sandbox.backends.channel import Malformed, parse
from mcp_sandbox.backends.pyodide import RUNNER_DIR
from mcp_sandbox.backends.pyodide.typescript import TARGET, render
from tests.helpers import runner_deno


def test_protocol_ts_is_generated_from_protocol_py() -> None:
    assert TARGET.read_text(encoding="utf-8") == render(), (
        "protocol.ts is out of date: run python -m mcp_sandbox.backends.pyodide.typescript"
    )


def test_the_generated_file_carries_every_message_and_shared_constant() -> None:
    text = render()
    for name in ("RunMessage", "ToolCallMessage", "WorkerInit", "WorkerPost", "GuestOutcome"):
        assert f"export type {name} = " in text
    assert "export const SYNC_REPLY_MAX_BYTES = 33619968;" in text
    assert "export const MAX_TOOL_REPLY_CHARS = 8388608;" in text


def test_the_runner_type_checks_against_the_generated_protocol() -> None:
    """`deno check`: a field the runner reads or sends that protocol.py lacks fails here."""
    done = runner_deno(
        "check", *(str(RUNNER_DIR / name) for name in ("runner.ts", "worker.ts", "snapshot.ts"))
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_field_the_protocol_does_not_name_is_refused() -> None:
    assert parse({"type": "progress", "line": "hi"}) == {"type": "progress", "line": "hi"}
    assert isinstance(parse({"type": "progress", "line": "hi", "colour": "red"}), Malformed)
    assert isinstance(parse({"type": "ready", "python": "3.11.7"}), Malformed), "missing fields"
    nested = {"success": True, "stdout": "", "stderr": "", "result": None, "error_type": None}
    nested |= {"error": None, "truncated": False, "files": [{"path": "a", "size": 1, "owner": "root"}]}
    refused = parse({"type": "result", "id": 3, "outcome": nested})
    assert refused == Malformed("result", 3)


def test_the_runner_files_ship_inside_the_package() -> None:
    assert RUNNER_DIR == Path(__file__).resolve().parents[2] / "mcp_sandbox" / "backends" / "pyodide"
    assert {"runner.ts", "worker.ts", "protocol.ts", "deno.json"} <= {p.name for p in RUNNER_DIR.iterdir()}
