"""The record of executions: an audit log of JSON lines, and optionally each program as a file."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from pathlib import Path

import anyio

from mcp_sandbox.result import ExecutionResult

#: Owner read/write only: the log holds every program run, which may include secrets.
PRIVATE = 0o600


def _append_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, PRIVATE)
    try:
        os.fchmod(fd, PRIVATE)
        # One write of an O_APPEND file: lines from concurrent calls never interleave.
        os.write(fd, data)
    finally:
        os.close(fd)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


class ExecutionRecord:
    """Writes one audit line per execution (MCP_SANDBOX_AUDIT_LOG), and saves each program as a
    runnable .py file (MCP_SANDBOX_SAVE_CODE); either may be off."""

    def __init__(self, audit_log: Path | None, save_code: Path | None) -> None:
        self._audit_log = audit_log
        self._save_code = save_code
        self._lock = anyio.Lock()

    @property
    def enabled(self) -> bool:
        return self._audit_log is not None or self._save_code is not None

    async def add(self, code: str, result: ExecutionResult, principal: str = "") -> None:
        """Record one execution by `principal` ("": the server's sole principal)."""
        if not self.enabled:
            return
        now = datetime.datetime.now(datetime.UTC)
        digest = hashlib.sha256(code.encode()).hexdigest()
        async with self._lock:
            await anyio.to_thread.run_sync(self._write, now, digest, code, result, principal)

    def _write(
        self, now: datetime.datetime, digest: str, code: str, result: ExecutionResult, principal: str
    ) -> None:
        if self._audit_log is not None:
            line = {
                "time": now.isoformat(timespec="milliseconds"),
                "principal": principal or None,
                "session_id": result.session_id,
                "backend": result.backend,
                "sha256": digest,
                "code": code,
                "success": result.success,
                "status": result.status,
                "exception": result.exception,
                "error_type": result.error_type,
                "duration_ms": result.duration_ms,
                "output_bytes": len(result.stdout.encode()) + len(result.stderr.encode()),
                "truncated": result.truncated,
                "files": [file.name for file in result.files],
                "figures": result.figures,
            }
            self._audit_log.parent.mkdir(parents=True, exist_ok=True)
            _append_private(self._audit_log, (json.dumps(line, ensure_ascii=False) + "\n").encode())
        if self._save_code is not None:
            self._save_code.mkdir(parents=True, exist_ok=True)
            session = re.sub(r"[^A-Za-z0-9_.-]", "_", result.session_id or "one-off")
            name = f"{now:%Y%m%dT%H%M%S.%f}Z-{session}-{digest[:12]}.py"
            header = (
                f"# mcp-sandbox: executed {now.isoformat(timespec='seconds')} on {result.backend}, "
                f"session {result.session_id or '(none)'}, sha256 {digest}\n"
                f"# outcome: {result.status}{f' ({result.exception})' if result.exception else ''}, "
                f"{result.duration_ms} ms\n"
                "# Replay: run it again with execute_python (same session_id for the same state), or\n"
                "# `python this_file.py` when it has no top-level await and needs no earlier cells.\n\n"
            )
            _write_private(self._save_code / name, header + code + ("" if code.endswith("\n") else "\n"))
