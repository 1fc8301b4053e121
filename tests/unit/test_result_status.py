"""result.py's status: what happened to a run, apart from the program's exception, from each
constructor; a result whose fields disagree cannot be built; and its readers (metrics, the
model's text) tell a program's own exception named Timeout from a real timeout."""

from __future__ import annotations

from typing import get_args

import pytest
from pydantic import ValidationError

from mcp_sandbox.guest import Interpreter
from mcp_sandbox.metrics import Metrics, outcome_of
from mcp_sandbox.protocol import GuestFile, GuestOutcome, OutputLimits
from mcp_sandbox.result import ExecutionResult, SandboxErrorType, Status
from mcp_sandbox.text import model_text
from tests.unit.test_metrics import samples

OWN_TIMEOUT = "class Timeout(Exception):\n    pass\n\nraise Timeout('my own')"
NO_OUTPUT: OutputLimits = {"max_files": 0, "max_bytes": 0, "max_figures": 0}


def ran(code: str) -> ExecutionResult:
    """`code` run by the real guest runtime, its outcome made a result as every backend makes it."""
    outcome = Interpreter({"max_output_chars": 1000, "max_kept_output_chars": 0, "output": NO_OUTPUT}).run(
        code
    )
    assert isinstance(outcome, dict), "no top-level await here"
    return from_outcome(outcome)


def from_outcome(outcome: GuestOutcome) -> ExecutionResult:
    def read_nothing(file: GuestFile, path: str, limit: int) -> bytes | None:
        return None

    return ExecutionResult.from_outcome(
        outcome,
        backend="inprocess",
        duration_ms=1,
        max_output_chars=1000,
        output=NO_OUTPUT,
        read_file=read_nothing,
    )


def fields(result: ExecutionResult) -> tuple[bool, Status, str | None, str | None]:
    return result.success, result.status, result.exception, result.error_type


@pytest.mark.parametrize(
    ("error_type", "status"),
    [
        ("Timeout", "timeout"),
        ("Cancelled", "cancelled"),
        ("MemoryLimit", "memory_limit"),
        ("SandboxCrash", "crash"),
        ("Rejected", "rejected"),
    ],
)
def test_each_sandbox_outcome_has_its_status(error_type: SandboxErrorType, status: Status) -> None:
    result = ExecutionResult.failure(error_type, "why", backend="subprocess")
    assert fields(result) == (False, status, None, error_type)


def test_every_sandbox_outcome_has_a_status() -> None:
    statuses = {ExecutionResult.failure(name, "", backend="x").status for name in get_args(SandboxErrorType)}
    assert statuses | {"ok", "error"} == set(get_args(Status))


def test_a_run_the_guest_reports_is_ok_or_an_error() -> None:
    assert fields(ran("1 + 1")) == (True, "ok", None, None)
    assert fields(ran("1 / 0")) == (False, "error", "ZeroDivisionError", "ZeroDivisionError")


def test_a_programs_own_timeout_is_an_error_not_a_timeout() -> None:
    own = ran(OWN_TIMEOUT)
    assert fields(own) == (False, "error", "Timeout", "Timeout"), "error_type keeps its word for one release"
    assert outcome_of(own) == "error"
    text = model_text(own)
    assert "raise Timeout('my own')" in text and text.endswith("Timeout: my own"), (
        "a traceback, not an outcome"
    )
    real = ExecutionResult.failure("Timeout", "Execution timed out after 1 s", backend="inprocess")
    assert model_text(real) == "Timeout: Execution timed out after 1 s"
    metrics = Metrics()
    for result in (own, real):
        with metrics.call("inprocess") as call:
            call.ended(result)
    got = samples(metrics)
    assert got["mcp_sandbox_calls_total", (("backend", "inprocess"), ("outcome", "error"))] == 1
    assert got["mcp_sandbox_calls_total", (("backend", "inprocess"), ("outcome", "timeout"))] == 1


def test_a_guest_that_contradicts_itself_gets_a_consistent_result() -> None:
    # The guest is untrusted: `success` decides, and an exception beside a success is dropped.
    base: GuestOutcome = {
        "success": True,
        "stdout": "",
        "stderr": "",
        "result": None,
        "error_type": "Timeout",
        "error": None,
        "truncated": False,
    }
    assert fields(from_outcome(base)) == (True, "ok", None, None)
    assert fields(from_outcome(base | {"success": False, "error_type": None})) == (False, "error", None, None)


@pytest.mark.parametrize(
    "given",
    [
        {"success": False, "error_type": "Timeout"},  # which Timeout: the status must say
        {"status": "ok", "success": False},
        {"status": "timeout", "exception": "Timeout"},
        {"status": "error", "exception": "ValueError", "error_type": "Timeout"},
        {"status": "ok", "error_type": "ValueError"},
        {"status": "finished"},
    ],
)
def test_a_result_whose_fields_disagree_cannot_be_built(given: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ExecutionResult.model_validate({"backend": "x", **given})


def test_a_results_json_reads_back_the_same() -> None:
    for result in (ran(OWN_TIMEOUT), ExecutionResult.failure("MemoryLimit", "", backend="x"), ran("2")):
        assert ExecutionResult.model_validate_json(result.model_dump_json()) == result


def test_the_schema_names_every_status_and_requires_it() -> None:
    schema = ExecutionResult.model_json_schema()
    assert schema["properties"]["status"]["enum"] == list(get_args(Status))
    assert "status" in schema["required"]
    assert "Deprecated" in schema["properties"]["error_type"]["description"]
