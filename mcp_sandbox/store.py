"""Where sessions' saved state lives: checkpoints and hibernated sessions, as files.

A saved state is opaque to the host: a Pyodide memory image, or a pickle that only a sandbox
ever unpickles. The host compresses it, adds a SHA-256 of it (which finds damage and truncation;
it is not a signature: whoever can write the folder can write a valid file) and writes it so that
a crash or a full disk never leaves a half-written file in its place. Files are the owner's alone
(0600 in a 0700 folder), and no sandbox is given the folder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

logger = logging.getLogger(__name__)

#: The first line of every state file; a change to the format changes it.
MAGIC = b"mcp-sandbox state 1\n"
#: A state file's header line is at most this long.
MAX_HEADER_BYTES = 64 * 1024


class StoreError(Exception):
    """A state could not be saved (disk full, over a cap); the message says which and what to do."""


class StateUnusable(Exception):
    """A state file exists but cannot be used (corrupt, cut short, another version, tampered)."""


@dataclass(frozen=True)
class SavedState:
    """One session's state as a backend saved it, with what the caller is told about it."""

    backend: str
    #: Restores only into sandboxes of the same build (runtime version, runner, settings).
    build: str
    payload: bytes
    #: The session's call it is from (1 for its first call).
    call: int
    #: What a restore does not bring back, in words for the caller.
    lost: tuple[str, ...] = ()


class _Header(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    backend: str
    build: str
    call: int = Field(ge=0)
    lost: list[str]
    saved_at: float
    size: int = Field(ge=0)
    compressed: int = Field(ge=0)
    sha256: str


class DirectoryStore:
    """Saved states as files in one folder, one per session.

    `max_session_bytes` caps one state (before compression), `max_total_bytes` all of them
    (as stored). A write is a new file renamed into place, so a reader sees the old state or the
    new one, never a mix.
    """

    def __init__(self, root: Path, *, max_session_bytes: int, max_total_bytes: int) -> None:
        self.root = root
        self._states = root / "sessions"
        self.max_session_bytes = max_session_bytes
        self.max_total_bytes = max_total_bytes
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # the operator's folder keeps its mode
        self._states.mkdir(mode=0o700, exist_ok=True)
        os.chmod(self._states, 0o700)  # mkdir's mode yields to the umask, and the folder may be older

    def _path(self, session_id: str) -> Path:
        # Hashed: a session id never becomes a path, whatever it contains.
        return self._states / f"{hashlib.sha256(session_id.encode()).hexdigest()[:40]}.state"

    def bytes_used(self) -> int:
        total = 0
        for path in self._states.glob("*.state"):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def save(self, session_id: str, state: SavedState) -> int:
        """Write `state` in place of the session's last one; the bytes stored. Raises StoreError."""
        if len(state.payload) > self.max_session_bytes:
            raise StoreError(
                f"the session's state is {len(state.payload) / 2**20:.1f} MB, over the "
                f"{self.max_session_bytes / 2**20:.0f} MB a checkpoint may hold (MCP_SANDBOX_MAX_STATE_MB); "
                "delete large variables you no longer need"
            )
        compressed = zstandard.ZstdCompressor(level=1).compress(state.payload)
        header = _Header(
            session_id=session_id,
            backend=state.backend,
            build=state.build,
            call=state.call,
            lost=list(state.lost),
            saved_at=time.time(),
            size=len(state.payload),
            compressed=len(compressed),
            sha256=hashlib.sha256(compressed).hexdigest(),
        )
        head = header.model_dump_json().encode() + b"\n"
        target = self._path(session_id)
        previous = target.stat().st_size if target.exists() else 0
        stored = len(MAGIC) + len(head) + len(compressed)
        if self.bytes_used() - previous + stored > self.max_total_bytes:
            raise StoreError(
                f"the server's saved sessions would pass {self.max_total_bytes / 2**20:.0f} MB "
                "(MCP_SANDBOX_MAX_STORE_MB); end sessions you no longer need (reset_session)"
            )
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(MAGIC)
                file.write(head)
                file.write(compressed)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, target)
        except OSError as error:
            partial.unlink(missing_ok=True)
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                raise StoreError("the disk that holds saved sessions is full; nothing was written") from error
            raise StoreError(f"the session's state could not be written: {error}") from error
        return stored

    def load(self, session_id: str) -> SavedState | None:
        """The session's saved state, or None when there is none. Raises StateUnusable."""
        path = self._path(session_id)
        try:
            with open(path, "rb") as file:
                # zstd never makes a body much larger than its input: past this it is not ours.
                data = file.read(len(MAGIC) + MAX_HEADER_BYTES + self.max_session_bytes + (1 << 20))
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StateUnusable(f"it could not be read: {error}") from error
        if not data.startswith(MAGIC):
            raise StateUnusable("it is not a state file of this version of mcp-sandbox")
        end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
        if end < 0:
            raise StateUnusable("its header is cut short")
        try:
            header = _Header.model_validate(json.loads(data[len(MAGIC) : end]))
        except (ValueError, ValidationError) as error:
            raise StateUnusable("its header is damaged") from error
        if header.session_id != session_id:
            raise StateUnusable("it belongs to another session")
        compressed = data[end + 1 :]
        if len(compressed) != header.compressed:
            raise StateUnusable(f"it is cut short ({len(compressed)} of {header.compressed} bytes)")
        if hashlib.sha256(compressed).hexdigest() != header.sha256:
            raise StateUnusable("its contents do not match their hash (damaged or changed)")
        if header.size > self.max_session_bytes:
            raise StateUnusable("it is larger than this server allows (MCP_SANDBOX_MAX_STATE_MB)")
        try:
            payload = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=header.size)
        except zstandard.ZstdError as error:
            raise StateUnusable(f"it does not decompress: {error}") from error
        if len(payload) != header.size:
            raise StateUnusable("its contents are not the size its header says")
        return SavedState(header.backend, header.build, payload, header.call, tuple(header.lost))

    def delete_older_than(self, seconds: float, keep: set[str]) -> int:
        """Delete states not written for `seconds`, except those of the sessions in `keep`
        (this server's, which it expires itself); how many. Sessions a stopped server left."""
        kept = {self._path(session_id).name for session_id in keep}
        deadline, deleted = time.time() - seconds, 0
        for path in self._states.glob("*.state"):
            with contextlib.suppress(OSError):
                if path.name not in kept and path.stat().st_mtime < deadline:
                    path.unlink()
                    deleted += 1
        return deleted

    def delete(self, session_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(session_id).unlink()
