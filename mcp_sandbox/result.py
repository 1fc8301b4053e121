"""The one result model shared by every backend, the Python API and the MCP server, and every
host-side step of artifacts: from the guest's report, within the caps, to the output folder."""

from __future__ import annotations

import base64
import binascii
import mimetypes
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr, TypeAdapter, model_validator

from mcp_sandbox.protocol import (
    MARKER_SLACK,
    MAX_CELL_CHARS,
    MAX_NOTE_CHARS,
    MAX_NOTES,
    MAX_OUTPUT_PATH_CHARS,
    MAX_TABLE_COLUMNS,
    MAX_TABLE_ROWS,
    MAX_TABLES,
    OUTPUT_DIR,
    GuestFile,
    GuestOutcome,
    GuestTable,
    OutputLimits,
    cap_text,
)

#: Failures that are not a Python exception of the program itself, as `error_type` names them.
SandboxErrorType = Literal["Timeout", "Cancelled", "MemoryLimit", "SandboxCrash", "Rejected"]
#: What happened to a run: it ended (ok), the program raised (error), or the sandbox ended it.
Status = Literal["ok", "error", "timeout", "cancelled", "memory_limit", "crash", "rejected"]
#: The status of each sandbox outcome.
SANDBOX_STATUS: dict[SandboxErrorType, Status] = {
    "Timeout": "timeout",
    "Cancelled": "cancelled",
    "MemoryLimit": "memory_limit",
    "SandboxCrash": "crash",
    "Rejected": "rejected",
}
#: A sandbox outcome's name by its status: the word `error_type` and the model's text give it.
SANDBOX_NAMES: dict[str, SandboxErrorType] = {status: name for name, status in SANDBOX_STATUS.items()}

#: Validates what a guest reports: it is untrusted, and a field the protocol does not name is refused.
GUEST_OUTCOME: TypeAdapter[GuestOutcome] = TypeAdapter(GuestOutcome)

#: Reads output/`path` of one sandbox (the guest's file entry, the checked path), or None.
#: Reads output/`path` (at most the given number of bytes + 1), or None when it cannot.
ReadOutputFile = Callable[[GuestFile, str, int], "bytes | None"]


def cap_outcome(outcome: GuestOutcome, limit: int) -> GuestOutcome:
    """The same outcome with every text field within `limit` and valid UTF-8 (lone surrogates
    replaced, as JSON output cannot carry them), whatever the guest sent."""
    capped = GuestOutcome(**outcome)
    for name in ("stdout", "stderr", "result", "error"):
        value = capped.get(name)
        if not isinstance(value, str):
            continue
        if len(value) > limit + MARKER_SLACK:
            value = cap_text(value, limit)[0]
            capped["truncated"] = True
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            value = value.encode("utf-8", "replace").decode("utf-8")
        capped[name] = value
    return capped


class OutputFile(BaseModel):
    name: str = Field(description="Path under output/, e.g. report.csv.")
    size: int = Field(description="Bytes.")
    mime_type: str
    saved_to: str | None = Field(
        None, description="Where the server copied it, when MCP_SANDBOX_OUTPUT_DIR is set."
    )
    uri: str | None = Field(
        None, description="A resource link to its bytes while the server keeps it (as a cut output's)."
    )


@dataclass(frozen=True)
class KeptOutput:
    """A cut stream's text from its start (within MCP_SANDBOX_MAX_KEPT_OUTPUT_CHARS), and how
    many characters the program wrote to it in all."""

    text: str
    total: int


@dataclass
class Artifacts:
    """What comes with a result but stays out of its JSON: figures, output files, and the whole
    of each cut stream (by name: stdout, stderr), which the App keeps readable through a link."""

    figures: list[bytes] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    kept_output: dict[str, KeptOutput] = field(default_factory=dict)
    #: The DataFrames and Series the run showed, as data for a notebook view (not for the model).
    tables: list[GuestTable] = field(default_factory=list)


def kept_output(reported: object, limit: int) -> KeptOutput | None:
    """A kept stream as the guest reported it, within `limit` and valid UTF-8, or None when the
    report is not one."""
    if not isinstance(reported, dict) or set(reported) != {"text", "total"}:
        return None
    text, total = reported["text"], reported["total"]
    if not isinstance(text, str) or not isinstance(total, int) or isinstance(total, bool):
        return None
    text = text[:limit].encode("utf-8", "replace").decode("utf-8")
    return KeptOutput(text, max(total, len(text)))


def table_within_caps(table: GuestTable) -> GuestTable:
    """A table as the guest reported it (already of the protocol's types), within the caps on
    rows, columns and characters, its text valid UTF-8, whatever the guest sent."""
    columns = min(len(table["columns"]), MAX_TABLE_COLUMNS)
    rows = table["rows"][:MAX_TABLE_ROWS]
    printed = table["printed"]
    return {
        "kind": table["kind"],
        "source": table["source"],
        "shape": [max(0, number) for number in table["shape"][:2]],
        "columns": [_text(label) for label in table["columns"][:columns]],
        "dtypes": [_text(label) for label in table["dtypes"][:columns]],
        "index_name": None if table["index_name"] is None else _text(table["index_name"]),
        "index": [_text(label) for label in table["index"][: len(rows)]],
        "rows": [[_text(cell) if isinstance(cell, str) else cell for cell in row[:columns]] for row in rows],
        "positions": table["positions"][: len(rows)],
        "printed": printed[:2] if printed is not None and len(printed) >= 2 else None,
    }


def _text(text: str) -> str:
    return text[:MAX_CELL_CHARS].encode("utf-8", "replace").decode("utf-8")


def mime_type(name: str) -> str:
    return mimetypes.guess_type(name)[0] or "application/octet-stream"


def decode_base64(data: str) -> bytes | None:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return None


def safe_output_path(path: str) -> str | None:
    """`path` when it names a file inside output/ (relative, no `..`), else None."""
    normal = posixpath.normpath(path)
    if (
        not path
        or len(path) > MAX_OUTPUT_PATH_CHARS
        or normal.startswith(("/", "../"))
        or normal in (".", "..")
        or "\\" in path
        or "\x00" in path
    ):
        return None
    return normal


def read_output_file(workdir: Path, path: str, limit: int) -> bytes | None:
    """output/`path` under `workdir`: at most `limit` + 1 bytes of a regular file really inside
    output/, or None (see read_file_inside)."""
    return read_file_inside(workdir / OUTPUT_DIR, path, limit)


def read_file_inside(root: Path, path: str, limit: int) -> bytes | None:
    """`path` under `root`: at most `limit` + 1 bytes of a regular file really inside `root`, or
    None. The sandbox may still be running and swapping names for links (to a host file, or
    /dev/zero), so each part of the path is opened without following links, from the folder
    opened before it, and the file is read from the descriptor that was checked."""
    parts = path.split("/")
    no_links = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY | no_links)
    except OSError:
        return None
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | no_links, dir_fd=folder)
            os.close(folder)
            folder = inner
        fd = os.open(parts[-1], os.O_RDONLY | no_links, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


class ExecutionResult(BaseModel):
    """The outcome of one `execute_python` call."""

    success: bool = Field(description="True when the program ran to the end without an exception.")
    status: Status = Field(
        description="What happened to the run. error: the program raised `exception`; crash: the sandbox "
        "died; rejected: nothing ran (the policy, or a bridged call to an unknown tool)."
    )
    exception: str | None = Field(
        None, description="With status error: the class name of the program's exception; else null."
    )
    stdout: str = Field("", description="Standard output, capped (head and tail kept).")
    stderr: str = Field("", description="Standard error, capped (head and tail kept).")
    result: str | None = Field(
        None, description="repr() of the program's final expression, like a REPL, or null."
    )
    error_type: str | None = Field(
        None,
        description="Deprecated: read `status` and `exception`.",
    )
    error: str | None = Field(None, description="Error message with a traceback of the program's own frames.")
    truncated: bool = Field(False, description="True when any output field was cut to the size cap.")
    duration_ms: int = Field(0, description="Wall time of the call on the server, in milliseconds.")
    backend: str = Field(description="The sandbox that ran the code, e.g. pyodide.")
    session_id: str | None = Field(
        None, description="The session the code ran in, or null for a one-off run."
    )
    session_lost: bool = Field(
        False,
        description="True when the session's variables are gone (no checkpoint to bring back; notes say "
        "why): it goes on fresh.",
    )
    session_restored: bool = Field(
        False,
        description="True when the sandbox had to be killed (or was hibernated, or the server restarted) "
        "and the session was brought back from its last checkpoint: `restored_from_call` says which.",
    )
    restored_from_call: int | None = Field(
        None,
        description="With session_restored: the session's call whose state was brought back "
        "(1 is its first call); work done after it is gone.",
    )
    files: list[OutputFile] = Field(
        [],
        description="Files the program wrote to output/ in this call; images and small text files "
        "also come as MCP content.",
    )
    figures: int = Field(0, description="matplotlib figures returned as PNG images (MCP image content).")
    stdout_uri: str | None = Field(
        None,
        description="When stdout was cut: a resource with the whole of it (read it with resources/read; "
        "add ?first=N&last=M for lines N to M, negative counting from the end).",
    )
    stderr_uri: str | None = Field(None, description="The same for stderr.")
    notes: list[str] = Field([], description="What the server left out, e.g. files past a cap.")
    _artifacts: Artifacts = PrivateAttr(default_factory=Artifacts)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        """`success` and `error_type` follow from `status` and `exception`, and a success is ok:
        a result is built from what decides it."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if "status" not in data and data.get("success") is True:
            data["status"] = "ok"
        status = data.get("status")
        data.setdefault("success", status == "ok")
        if "error_type" not in data and isinstance(status, str):
            data["error_type"] = data.get("exception") if status == "error" else SANDBOX_NAMES.get(status)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ExecutionResult:
        # A reader of any one of these fields must learn what a reader of the others does.
        error_type = self.exception if self.status == "error" else SANDBOX_NAMES.get(self.status)
        if (
            self.success != (self.status == "ok")
            or (self.exception is not None and self.status != "error")
            or self.error_type != error_type
        ):
            raise ValueError(
                f"status {self.status!r} disagrees with success {self.success}, exception "
                f"{self.exception!r} or error_type {self.error_type!r}"
            )
        return self

    @property
    def artifacts(self) -> Artifacts:
        return self._artifacts

    @classmethod
    def failure(
        cls,
        error_type: SandboxErrorType,
        message: str,
        *,
        backend: str,
        duration_ms: int = 0,
        session_lost: bool = False,
        stdout: str = "",
        stderr: str = "",
    ) -> ExecutionResult:
        """A result for a failure of the sandbox rather than of the program."""
        return cls(
            success=False,
            status=SANDBOX_STATUS[error_type],
            error=message,
            backend=backend,
            duration_ms=duration_ms,
            session_lost=session_lost,
            stdout=stdout,
            stderr=stderr,
        )

    @classmethod
    def from_outcome(
        cls,
        outcome: GuestOutcome,
        *,
        backend: str,
        duration_ms: int,
        max_output_chars: int,
        output: OutputLimits,
        read_file: ReadOutputFile,
        max_kept_output_chars: int = 0,
    ) -> ExecutionResult:
        """The result of a run the guest reported, within every cap whatever the guest sent."""
        capped = cap_outcome(outcome, max_output_chars)
        # Whatever name the program's exception has (even Timeout), it is the program's.
        result = cls(
            success=capped["success"],
            status="ok" if capped["success"] else "error",
            exception=None if capped["success"] else capped["error_type"],
            stdout=capped["stdout"],
            stderr=capped["stderr"],
            result=capped["result"],
            error=capped["error"],
            truncated=capped["truncated"],
            backend=backend,
            duration_ms=duration_ms,
        )
        result._take_artifacts(capped, output, read_file)
        if result.truncated and max_kept_output_chars:
            for stream in ("stdout", "stderr"):
                kept = kept_output(outcome.get(f"kept_{stream}"), max_kept_output_chars)
                if kept is not None:
                    result.artifacts.kept_output[stream] = kept
        return result

    def _take_artifacts(self, outcome: GuestOutcome, limits: OutputLimits, read_file: ReadOutputFile) -> None:
        """Move figures and output files from the guest's report into this result, within the caps
        (the guest applies them too; this is where they hold, whatever it sent)."""
        budget = limits["max_bytes"]
        figures, files = outcome.get("figures", []), outcome.get("files", [])
        notes = [note[:MAX_NOTE_CHARS] for note in outcome.get("notes", [])[:MAX_NOTES]]
        for encoded in figures[: limits["max_figures"]]:
            image = decode_base64(encoded)
            if image is None or len(image) > budget:
                notes.append("a figure was left out: over MCP_SANDBOX_MAX_OUTPUT_MB in all")
                continue
            self.artifacts.figures.append(image)
            budget -= len(image)
        if len(figures) > limits["max_figures"]:
            notes.append(
                f"{len(figures) - limits['max_figures']} figures over MCP_SANDBOX_MAX_FIGURES left out"
            )
        listed: list[OutputFile] = []
        for file in files[: limits["max_files"]]:
            path = safe_output_path(file["path"])
            data = read_file(file, path, budget) if path is not None else None
            if path is None or data is None:
                notes.append(f"output/{file['path'][:200]} could not be read back")
                continue
            if len(data) > budget:
                notes.append(f"output/{path} left out: over MCP_SANDBOX_MAX_OUTPUT_MB in all")
                continue
            budget -= len(data)
            self.artifacts.files[path] = data
            listed.append(OutputFile(name=path, size=len(data), mime_type=mime_type(path)))
        if len(files) > limits["max_files"]:
            notes.append(
                f"{len(files) - limits['max_files']} files over MCP_SANDBOX_MAX_OUTPUT_FILES left out"
            )
        self.files, self.figures, self.notes = listed, len(self.artifacts.figures), notes
        self.artifacts.tables = [table_within_caps(table) for table in outcome.get("tables", [])[:MAX_TABLES]]

    def save_files(self, output_dir: Path) -> None:
        """Copy the output files to `output_dir`/<session or one-off>/, noting any that cannot be."""
        root = output_dir.resolve()
        folder = root / (self.session_id or "one-off")
        for file in self.files:
            target = (folder / file.name).resolve()
            # Names were checked when the guest reported them; this holds whatever they are.
            if not target.is_relative_to(folder.resolve()) or not folder.resolve().is_relative_to(root):
                self.notes.append(f"output/{file.name} was not copied: its path leaves {root}")
                continue
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(self.artifacts.files[file.name])
                file.saved_to = str(target)
            except OSError as error:
                self.notes.append(f"output/{file.name} could not be copied to {folder}: {error.strerror}")
