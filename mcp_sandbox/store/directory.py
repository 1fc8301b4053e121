"""Sessions' saved state as files in one folder (`MCP_SANDBOX_STATE_DIR`), one per session.

A write goes to a new file renamed into place, so a crash or a full disk never leaves a
half-written file in its place. Files are the owner's alone (0600 in a 0700 folder), and no
sandbox is given the folder. Instances that share the folder (a volume several servers mount)
take leases in it: files whose read-decide-write runs under one flock. The file work runs in a
worker thread; the contract is `contract.Store`'s.
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
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import ParamSpec, TypeVar

import anyio.to_thread
from pydantic import BaseModel, ConfigDict, Field

from mcp_sandbox.store.codec import (
    MAX_HEADER_BYTES,
    decode_record,
    decode_state,
    encode_record,
    encode_state,
    largest_encoded,
    state_fence,
)
from mcp_sandbox.store.contract import (
    DAMAGED_RECORD,
    Lease,
    LeaseHeld,
    LeaseTaken,
    SavedState,
    SessionRecord,
    StateUnusable,
    StoreError,
)

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


class _LeaseFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    owner: str
    token: str
    expires: float
    fence: int = Field(0, ge=0)
    #: Given up: no lease, but its fence stays for the next one to pass.
    released: bool = False


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
        self._asks = root / "asks"
        self._thread_lock = threading.Lock()
        self.max_session_bytes = max_session_bytes
        self.max_total_bytes = max_total_bytes
        root.mkdir(mode=0o700, parents=True, exist_ok=True)  # the operator's folder keeps its mode
        for folder in (self._states, self._leases, self._records, self._asks):
            folder.mkdir(mode=0o700, exist_ok=True)
            os.chmod(folder, 0o700)  # mkdir's mode yields to the umask, and the folder may be older

    @staticmethod
    async def _in_thread(work: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return await anyio.to_thread.run_sync(partial(work, *args, **kwargs))

    # The contract (contract.Store), each method its file work in a worker thread.

    async def save(self, session_id: str, state: SavedState, lease: Lease | None = None) -> int:
        return await self._in_thread(self._save, session_id, state, lease)

    async def load(self, session_id: str) -> SavedState | None:
        return await self._in_thread(self._load, session_id)

    async def write_record(self, session_id: str, call: int, owner: str, lease: Lease | None = None) -> None:
        await self._in_thread(self._write_record, session_id, call, owner, lease)

    async def read_record(self, session_id: str) -> SessionRecord | None:
        return await self._in_thread(self._read_record, session_id)

    async def delete(self, session_id: str) -> None:
        await self._in_thread(self._delete, session_id)

    async def delete_checkpoint(self, session_id: str) -> None:
        await self._in_thread(self._delete_checkpoint, session_id)

    async def delete_older_than(self, seconds: float, keep: set[str]) -> int:
        return await self._in_thread(self._delete_older_than, seconds, keep)

    async def acquire_lease(self, session_id: str, owner: str, seconds: float) -> Lease:
        return await self._in_thread(self._acquire_lease, session_id, owner, seconds)

    async def renew_lease(self, lease: Lease, seconds: float) -> Lease:
        return await self._in_thread(self._renew_lease, lease, seconds)

    async def release_lease(self, lease: Lease) -> None:
        await self._in_thread(self._release_lease, lease)

    async def ask_for(self, session_id: str, holder: str, asker: str) -> None:
        try:
            await self._in_thread(self._ask_for, session_id, holder, asker)
        except OSError as error:
            logger.warning("session %r: asking %s for it failed: %s", session_id, holder, error)

    async def asks(self, holder: str) -> list[str]:
        try:
            return await self._in_thread(self._take_asks, holder)
        except OSError as error:
            raise StoreError(f"the asks for this instance's sessions could not be read: {error}") from error

    async def lost_data_since(self) -> float | None:
        return None  # a folder keeps what it was given; one emptied by hand is not looked for

    async def aclose(self) -> None:
        return None

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

    def _save(self, session_id: str, state: SavedState, lease: Lease | None) -> int:
        data = encode_state(
            session_id, state, lease.fence if lease is not None else 0, self.max_session_bytes
        )
        target = self._path(session_id)
        previous = target.stat().st_size if target.exists() else 0
        if self.bytes_used() - previous + len(data) > self.max_total_bytes:
            raise StoreError(
                f"the server's saved sessions would pass {self.max_total_bytes / 2**20:.0f} MB "
                "(MCP_SANDBOX_MAX_STORE_MB); end sessions you no longer need (reset_session)"
            )
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(data)
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
        return len(data)

    def _load(self, session_id: str) -> SavedState | None:
        path = self._path(session_id)
        try:
            with open(path, "rb") as file:
                data = file.read(largest_encoded(self.max_session_bytes))
        except FileNotFoundError:
            return None
        except OSError as error:
            raise StateUnusable(f"it could not be read: {error}") from error
        return decode_state(session_id, data, self.max_session_bytes)

    def _write_record(self, session_id: str, call: int, owner: str, lease: Lease | None) -> None:
        """Not synced to disk: it is there for the next process even when this one is killed (a
        power cut can lose it)."""
        target = self._record_path(session_id)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        record = encode_record(session_id, call, owner, lease.fence if lease is not None else 0)
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
        """Rename a written file over the session's, while `lease` (if any) is still held and
        what it replaces was not written under a higher fence."""
        if lease is None:
            os.replace(partial, target)
            return
        with self._lease_lock():
            if not lease.same(self._read_lease(session_id)) or lease.fence < self._stored_fence(
                session_id, target
            ):
                raise LeaseTaken(f"session {session_id!r} is run by another instance now")
            os.replace(partial, target)

    def _stored_fence(self, session_id: str, path: Path) -> int:
        """The fence the state or record file at `path` was written under (0: none, or unreadable)."""
        try:
            with open(path, "rb") as file:
                head = file.read(MAX_HEADER_BYTES)
        except OSError:
            return 0
        if path.suffix == ".record":
            return decode_record(session_id, head)[1]
        return state_fence(head)

    def _read_record(self, session_id: str) -> SessionRecord | None:
        path = self._record_path(session_id)
        try:
            data = path.read_bytes()[:MAX_HEADER_BYTES]
        except FileNotFoundError:
            return None
        except OSError:
            return DAMAGED_RECORD
        return decode_record(session_id, data)[0]

    def _delete_older_than(self, seconds: float, keep: set[str]) -> int:
        """Sessions a stopped server left, and leases long run out."""
        kept = {_file_name(session_id) for session_id in keep}
        now = time.time()
        deadline, deleted = now - seconds, 0
        for path in [*self._leases.glob("*.lease"), *self._asks.glob("*.ask")]:
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < deadline:
                    path.unlink()  # an ask this old was left for an instance that stopped
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

    def _ask_for(self, session_id: str, holder: str, asker: str) -> None:
        # One file per (holder, session): asking twice is one ask.
        target = self._asks / f"{_file_name(holder)}.{_file_name(session_id)}.ask"
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(json.dumps({"session_id": session_id, "asker": asker}).encode())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def _take_asks(self, holder: str) -> list[str]:
        asked = []
        for path in self._asks.glob(f"{_file_name(holder)}.*.ask"):
            try:
                data = path.read_bytes()[:MAX_HEADER_BYTES]
                path.unlink()
            except FileNotFoundError:
                continue
            try:
                session_id = json.loads(data)["session_id"]
            except (ValueError, KeyError, TypeError):
                continue  # not an ask this store wrote: nobody is waiting on it
            if isinstance(session_id, str):
                asked.append(session_id)
        return asked

    def _delete(self, session_id: str) -> None:
        for path in (self._path(session_id), self._record_path(session_id)):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _delete_checkpoint(self, session_id: str) -> None:
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

    def _lease_file(self, session_id: str) -> _LeaseFile | None:
        """The lease file's contents, or None (none, or unreadable: a lease nobody can prove is no lease)."""
        try:
            data = self._lease_path(session_id).read_bytes()[:MAX_HEADER_BYTES]
            record = _LeaseFile.model_validate_json(data)
        except (OSError, ValueError):
            return None
        return record if record.session_id == session_id else None

    def _read_lease(self, session_id: str) -> Lease | None:
        """The lease on record, or None (none, given up, or unreadable)."""
        record = self._lease_file(session_id)
        if record is None or record.released:
            return None
        return Lease(record.session_id, record.owner, record.token, record.expires, record.fence)

    def _write_lease(self, lease: Lease, *, released: bool = False) -> None:
        target = self._lease_path(lease.session_id)
        partial = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part")
        record = _LeaseFile(
            session_id=lease.session_id,
            owner=lease.owner,
            token=lease.token,
            expires=lease.expires,
            fence=lease.fence,
            released=released,
        )
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(record.model_dump_json().encode())
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)

    def _next_fence(self, session_id: str) -> int:
        """Past every fence the session's lease file (held or given up), state and record show
        (a lease file can be damaged or swept; what was written under it carries its fence)."""
        last = self._lease_file(session_id)
        return 1 + max(
            last.fence if last is not None else 0,
            self._stored_fence(session_id, self._path(session_id)),
            self._stored_fence(session_id, self._record_path(session_id)),
        )

    def _acquire_lease(self, session_id: str, owner: str, seconds: float) -> Lease:
        try:
            with self._lease_lock():
                held = self._read_lease(session_id)
                now = time.time()
                if held is not None and held.owner != owner and held.expires > now:
                    raise LeaseHeld(held.owner, held.expires)
                # The owner's own record keeps its token and fence, even run out: nobody took it since.
                if held is not None and held.owner == owner:
                    lease = Lease(session_id, owner, held.token, now + seconds, held.fence)
                else:
                    fence = self._next_fence(session_id)
                    taken_from = held.owner if held is not None else None
                    lease = Lease(session_id, owner, secrets.token_hex(8), now + seconds, fence, taken_from)
                self._write_lease(lease)
                return lease
        except OSError as error:
            raise StoreError(f"the session's lease could not be taken: {error}") from error

    def _renew_lease(self, lease: Lease, seconds: float) -> Lease:
        try:
            with self._lease_lock():
                if not lease.same(self._read_lease(lease.session_id)):
                    raise LeaseTaken(f"session {lease.session_id!r} is run by another instance now")
                renewed = Lease(
                    lease.session_id, lease.owner, lease.token, time.time() + seconds, lease.fence
                )
                self._write_lease(renewed)
                return renewed
        except OSError as error:
            raise StoreError(f"the session's lease could not be renewed: {error}") from error

    def _release_lease(self, lease: Lease) -> None:
        with contextlib.suppress(OSError), self._lease_lock():
            if lease.same(self._read_lease(lease.session_id)):
                self._write_lease(lease, released=True)


def _file_name(session_id: str) -> str:
    # Hashed: a session id never becomes a path, whatever it contains.
    return hashlib.sha256(session_id.encode()).hexdigest()[:40]
