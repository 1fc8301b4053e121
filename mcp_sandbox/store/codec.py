"""A saved state and a session's record as the bytes every store keeps.

A saved state is opaque to the host: a Pyodide memory image, or a pickle that only a sandbox
ever unpickles. The host compresses it and adds a SHA-256 of it, which finds damage and
truncation; it is not a signature: whoever can write the store can write a valid state.
"""

from __future__ import annotations

import hashlib
import json
import time

import zstandard
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mcp_sandbox.store.contract import DAMAGED_RECORD, SavedState, SessionRecord, StateUnusable, StoreError

#: The first line of every saved state; a change to the format changes it.
MAGIC = b"mcp-sandbox state 1\n"
#: A state's header line is at most this long.
MAX_HEADER_BYTES = 64 * 1024


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
    #: The fence of the lease it was written under (0: none).
    fence: int = Field(0, ge=0)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    #: The session's latest call that ran to an end (0: none since it started fresh).
    call: int = Field(ge=0)
    #: The instance that ran it.
    owner: str
    #: The fence of the lease it was written under (0: none).
    fence: int = Field(0, ge=0)


def largest_encoded(max_session_bytes: int) -> int:
    """The most bytes a state within the cap can take; zstd never makes a body much larger than its input."""
    return len(MAGIC) + MAX_HEADER_BYTES + max_session_bytes + (1 << 20)


def encode_state(session_id: str, state: SavedState, fence: int, max_session_bytes: int) -> bytes:
    """The state as stored. Raises StoreError when it is over the cap (MCP_SANDBOX_MAX_STATE_MB)."""
    if len(state.payload) > max_session_bytes:
        raise StoreError(
            f"the session's state is {len(state.payload) / 2**20:.1f} MB, over the "
            f"{max_session_bytes / 2**20:.0f} MB a checkpoint may hold (MCP_SANDBOX_MAX_STATE_MB); "
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
        fence=fence,
    )
    return b"".join((MAGIC, header.model_dump_json().encode(), b"\n", compressed))


def _header_end(data: bytes) -> int:
    if not data.startswith(MAGIC):
        raise StateUnusable("it is not a state file of this version of mcp-sandbox")
    end = data.find(b"\n", len(MAGIC), len(MAGIC) + MAX_HEADER_BYTES)
    if end < 0:
        raise StateUnusable("its header is cut short")
    return end


def _header(data: bytes, end: int) -> _Header:
    try:
        return _Header.model_validate(json.loads(data[len(MAGIC) : end]))
    except (ValueError, ValidationError) as error:
        raise StateUnusable("its header is damaged") from error


def decode_state(session_id: str, data: bytes, max_session_bytes: int) -> SavedState:
    """The state `data` holds. Raises StateUnusable, saying why."""
    end = _header_end(data)
    header = _header(data, end)
    if header.session_id != session_id:
        raise StateUnusable("it belongs to another session")
    compressed = data[end + 1 :]
    if len(compressed) != header.compressed:
        raise StateUnusable(f"it is cut short ({len(compressed)} of {header.compressed} bytes)")
    if hashlib.sha256(compressed).hexdigest() != header.sha256:
        raise StateUnusable("its contents do not match their hash (damaged or changed)")
    if header.size > max_session_bytes:
        raise StateUnusable("it is larger than this server allows (MCP_SANDBOX_MAX_STATE_MB)")
    try:
        payload = zstandard.ZstdDecompressor().decompress(compressed, max_output_size=header.size)
    except zstandard.ZstdError as error:
        raise StateUnusable(f"it does not decompress: {error}") from error
    if len(payload) != header.size:
        raise StateUnusable("its contents are not the size its header says")
    return SavedState(header.backend, header.build, payload, header.call, tuple(header.lost))


def state_fence(head: bytes) -> int:
    """The fence a stored state (its first bytes suffice) was written under; 0 when unreadable,
    since a damaged state protects nothing."""
    try:
        return _header(head, _header_end(head)).fence
    except StateUnusable:
        return 0


def encode_record(session_id: str, call: int, owner: str, fence: int) -> bytes:
    return _Record(session_id=session_id, call=call, owner=owner, fence=fence).model_dump_json().encode()


def decode_record(session_id: str, data: bytes) -> tuple[SessionRecord, int]:
    """The record `data` holds and its fence; DAMAGED_RECORD (fence 0) when it cannot be read."""
    try:
        record = _Record.model_validate_json(data[:MAX_HEADER_BYTES])
    except ValueError:
        return DAMAGED_RECORD, 0
    if record.session_id != session_id:
        return DAMAGED_RECORD, 0
    return SessionRecord(record.call, record.owner), record.fence
