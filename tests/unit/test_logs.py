"""logs.py: JSON lines carrying the session and call of the call that logged them."""

from __future__ import annotations

import json
import logging

from mcp_sandbox.logs import CallFilter, JsonFormatter, call_context


def formatted(message: str) -> dict[str, object]:
    record = logging.LogRecord("mcp_sandbox.test", logging.INFO, __file__, 1, message, (), None)
    CallFilter().filter(record)
    line: dict[str, object] = json.loads(JsonFormatter().format(record))
    return line


def test_a_line_in_a_call_carries_its_session_and_call_ids() -> None:
    with call_context("my-session") as call:
        line = formatted("in a call: ü")
    assert line["session_id"] == "my-session" and line["call_id"] == call
    assert (
        line["message"] == "in a call: ü" and line["level"] == "INFO" and line["logger"] == "mcp_sandbox.test"
    )
    with call_context(None) as other:
        assert other != call
        assert "session_id" not in formatted("no session") and formatted("x")["call_id"] == other


def test_a_line_outside_a_call_has_neither() -> None:
    line = formatted("outside")
    assert "session_id" not in line and "call_id" not in line
