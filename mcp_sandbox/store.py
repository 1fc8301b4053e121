"""Where sessions' saved state lives: checkpoints and hibernated sessions, as files.

A saved state is opaque to the host: a Pyodide memory image, or a pickle that only a sandbox
ever unpickles. The host compresses it, adds a SHA-256 of it (which finds damage and truncation;
it is not a signature: whoever can write the folder can write a valid file) and writes it so that
a crash or a full disk never leaves a half-written file in its place. Files are the owner's alone
(0600 in a 0700 folder), and no sandbox is given the folder.

Instances that share the folder (a volume several servers mount) take a lease on a session
before they run it, so two never run one session at once; a lease not renewed runs out, so a
dead instance's sessions move to the next instance that is asked for them.

Beside its checkpoint, every session that ran has a record: the number of its latest call, written
before that call's result is sent. A checkpoint older than the record, or a record with no
checkpoint, is state a caller saw and a restore cannot bring back, so the next result says so.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator
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


class LeaseTaken(StoreError):
    """This instance's lease on a session ran out and another instance took it."""


class StateUnusable(Exception):
    """A state file exists but cannot be used (corrupt, cut short, another version, tampered)."""


class LeaseHeld(Exception):
    """Another instance runs the session; its lease runs out at `expires` unless it is renewed."""

    def __init__(self, owner: str, expires: float) -> None:
        super().__init__(f"held by {owner} until {time.strftime('%H:%M:%S', time.localtime(expires))}")
        self.owner, self.expires = owner, expires


@dataclass(frozen=True)
class Lease:
    """The right to run one session, until `expires` (wall clock: instances share no other)."""

    session_id: str
    owner: str
    #: Unique per acquisition: a lease taken over and taken back is not the same lease.
    token: str
    expires: float
    #: Acquired from this other owner, whose lease ran out: the session ran there (and may have
    #: run calls it never checkpointed).
    taken_from: str | None = None

    def same(self, other: Lease | None) -> bool:
        """The same lease, whatever its expiry (renewals move it)."""
        return other is not None and (self.session_id, self.owner, self.token) == (
            other.session_id,
            other.owner,
            other.token,
        )


class _LeaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    owner: str
    token: str
    expires: float


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


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    #: The session's latest call that ran to an end (0: none since it started fresh).
    call: int = Field(ge=0)
    #: The instance that ran it.
    owner: str


@dataclass(frozen=True)
class SessionRecord:
    """What the store knows of a session besides its checkpoint: its latest call, and where it ran."""

    call: int
    owner: str


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
        self._leases = root / "leases"
        self._records = root / "records"
        self._thread_lock = threading.Lock()
        self.max_session_bytes = max_session_bytes
        self.max_total_bytes = max_total_bytes
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # the operator's folder keeps its mode
        for folder in (self._states, self._leases, self._records):
            folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)  # mkdir's mode yields to the umask, and the folder may be older

    def _path(self, session_id: str) -> Path:
        return self._states / f"{_file_name(session_id)}.state"

    def _lease_path(self, session_id: str) -> Path:
        return self._leases / f"{_file_name(session_id)}.lease"

    def _record_path(self, session_id: str) -> Path:
        return self._records / f"{_file_name(session_id)}.record"

    def bytes_used(self) -> int:
        total = 0
        for path in self._states.glob("*.state"):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def save(self, session_id: str, state: SavedState, lease: Lease | None = None) -> int:
        """Write `state` in place of the session's last one; the bytes stored. Raises StoreError,
        and LeaseTaken when `lease` is no longer held (another instance runs the session now)."""
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
            self._put_in_place(partial, target, session_id, lease)
        except LeaseTaken:
            partial.unlink(missing_ok=True)
            raise
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

    def write_record(self, session_id: str, call: int, owner: str, lease: Lease | None = None) -> None:
        """Record that the session's latest call is `call`, run by `owner`. Not synced to disk:
        it is there for the next process even when this one is killed (a power cut can lose it).
        Raises StoreError, and LeaseTaken when `lease` is no longer held."""
        target = self._record_path(session_id)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        record = _Record(session_id=session_id, call=call, owner=owner).model_dump_json().encode()
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(record)
            self._put_in_place(partial, target, session_id, lease)
        except OSError as error:
            raise StoreError(f"the session's record could not be written: {error}") from error
        finally:
            partial.unlink(missing_ok=True)

    def _put_in_place(self, partial: Path, target: Path, session_id: str, lease: Lease | None) -> None:
        """Rename a written file over the session's, while `lease` (if any) is still held."""
        if lease is None:
            os.replace(partial, target)
            return
        with self._lease_lock():
            if not lease.same(self._read_lease(session_id)):
                raise LeaseTaken(f"session {session_id!r} is run by another instance now")
            os.replace(partial, target)

    def read_record(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None: it never ran, or was reset or expired. A damaged record
        reads as a session that ran (call 1) on an unknown instance, so nothing is lost unsaid."""
        path = self._record_path(session_id)
        try:
            data = path.read_bytes()[:MAX_HEADER_BYTES]
        except FileNotFoundError:
            return None
        except OSError:
            return SessionRecord(1, "an unknown instance")
        try:
            record = _Record.model_validate_json(data)
        except ValueError:
            return SessionRecord(1, "an unknown instance")
        if record.session_id != session_id:
            return SessionRecord(1, "an unknown instance")
        return SessionRecord(record.call, record.owner)

    def delete_older_than(self, seconds: float, keep: set[str]) -> int:
        """Delete states not written for `seconds`, except those of the sessions in `keep`
        (this server's, which it expires itself) and those another instance holds a lease on;
        how many. Sessions a stopped server left, and leases long run out."""
        kept = {_file_name(session_id) for session_id in keep}
        now = time.time()
        deadline, deleted = now - seconds, 0
        for path in self._leases.glob("*.lease"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < deadline:
                    path.unlink()
        for path in [*self._states.glob("*.state"), *self._records.glob("*.record")]:
            with contextlib.suppress(OSError):
                name = path.name.rsplit(".", 1)[0]
                if name in kept or path.stat().st_mtime >= deadline:
                    continue
                lease = self._leases / f"{name}.lease"
                if lease.exists() and lease.stat().st_mtime >= now - seconds:
                    continue  # a live instance may hold it (its lease file is renewed)
                path.unlink()
                deleted += path.suffix == ".state"
        return deleted

    def delete(self, session_id: str) -> None:
        """Forget the session: its checkpoint and its record."""
        for path in (self._path(session_id), self._record_path(session_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def delete_checkpoint(self, session_id: str) -> None:
        """Delete the session's checkpoint (unusable, or of another build); its record stays."""
        with contextlib.suppress(FileNotFoundError):
            self._path(session_id).unlink()

    # Leases. The read-decide-write of each runs under one lock on leases/.lock (held for
    # microseconds; a volume shared between machines must support file locks, as NFSv4, CephFS
    # and EFS do), so two instances never both take one. One lock file: none is ever deleted.

    @contextlib.contextmanager
    def _lease_lock(self) -> Iterator[None]:
        # flock belongs to the open file (two stores in one process exclude each other); where a
        # network file system turns it into a lock of the whole process, the thread lock still holds.
        with self._thread_lock:
            fd = os.open(self._leases / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the lock

    def _read_lease(self, session_id: str) -> Lease | None:
        """The lease on record, or None (none, or unreadable: a lease nobody can prove is no lease)."""
        try:
            data = self._lease_path(session_id).read_bytes()[:MAX_HEADER_BYTES]
            record = _LeaseFile.model_validate_json(data)
        except (OSError, ValueError):
            return None
        if record.session_id != session_id:
            return None
        return Lease(record.session_id, record.owner, record.token, record.expires)

    def _write_lease(self, lease: Lease) -> None:
        target = self._lease_path(lease.session_id)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        record = _LeaseFile(
            session_id=lease.session_id, owner=lease.owner, token=lease.token, expires=lease.expires
        )
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(record.model_dump_json().encode())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def acquire_lease(self, session_id: str, owner: str, seconds: float) -> Lease:
        """A lease on the session for `seconds`, for `owner`; its token is the one the owner held
        if nobody took the lease since, and `taken_from` names another owner whose lease ran out.
        Raises LeaseHeld while another owner's lease runs, and StoreError when the folder cannot
        be written."""
        try:
            with self._lease_lock():
                held = self._read_lease(session_id)
                now = time.time()
                if held is not None and held.owner != owner and held.expires > now:
                    raise LeaseHeld(held.owner, held.expires)
                # The owner's own record keeps its token, even run out: nobody took the lease since.
                ours = held is not None and held.owner == owner
                token = held.token if held is not None and ours else secrets.token_hex(8)
                taken_from = held.owner if held is not None and not ours else None
                lease = Lease(session_id, owner, token, now + seconds, taken_from)
                self._write_lease(lease)
                return lease
        except OSError as error:
            raise StoreError(f"the session's lease could not be taken: {error}") from error

    def renew_lease(self, lease: Lease, seconds: float) -> Lease:
        """The same lease, running `seconds` from now. Raises LeaseTaken when it is no longer
        held (it ran out and another instance took it), and StoreError."""
        try:
            with self._lease_lock():
                if not lease.same(self._read_lease(lease.session_id)):
                    raise LeaseTaken(f"session {lease.session_id!r} is run by another instance now")
                renewed = Lease(lease.session_id, lease.owner, lease.token, time.time() + seconds)
                self._write_lease(renewed)
                return renewed
        except OSError as error:
            raise StoreError(f"the session's lease could not be renewed: {error}") from error

    def release_lease(self, lease: Lease) -> None:
        """Give the lease up, if it is still this one, so another instance need not wait it out."""
        with contextlib.suppress(OSError), self._lease_lock():
            if lease.same(self._read_lease(lease.session_id)):
                self._lease_path(lease.session_id).unlink()


def _file_name(session_id: str) -> str:
    # Hashed: a session id never becomes a path, whatever it contains.
    return hashlib.sha256(session_id.encode()).hexdigest()[:40]
