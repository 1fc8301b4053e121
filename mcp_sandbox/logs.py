"""The server's log lines: text by default, or one JSON object a line (MCP_SANDBOX_LOG_FORMAT=json)
carrying the session and call of the call that logged it. `App.execute` sets both around each
call (`call_context`); tasks started during a call (its checkpoint) inherit them."""

from __future__ import annotations

import json
import logging
import secrets
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime

#: The caller's session id of the call being served (None: a call without a session, or none).
session_id: ContextVar[str | None] = ContextVar("mcp_sandbox_session_id", default=None)
#: A random id for each call, in every line it logs (it names nothing else).
call_id: ContextVar[str | None] = ContextVar("mcp_sandbox_call_id", default=None)


@contextmanager
def call_context(session: str | None) -> Iterator[str]:
    """Lines logged in the block carry `session` and a new call id (yielded)."""
    call = secrets.token_hex(6)
    tokens = session_id.set(session), call_id.set(call)
    try:
        yield call
    finally:
        session_id.reset(tokens[0])
        call_id.reset(tokens[1])


class CallFilter(logging.Filter):
    """Puts the current session and call ids on every record (None outside a call)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.session_id = session_id.get()
        record.call_id = call_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the session and
    call ids when there are any, and the exception's traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in ("session_id", "call_id"):
            if (value := getattr(record, name, None)) is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, layout: str, json_lines: bool) -> None:
    """The root logger on stderr: `layout` as text, or JSON lines."""
    logging.basicConfig(level=level, stream=sys.stderr, format=layout)
    if json_lines:
        for handler in logging.getLogger().handlers:
            handler.setFormatter(JsonFormatter())
            handler.addFilter(CallFilter())
