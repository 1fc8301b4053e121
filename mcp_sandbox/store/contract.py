"""The store's contract: what every store of sessions' saved state does, and the types it speaks.

A store holds, per session, its checkpoint (a `SavedState`), its record (its latest call and the
instance that ran it) and the lease an instance takes before it runs the session, so instances
sharing a store never run one session at once. Implementations raise only StoreError, LeaseTaken,
StateUnusable and LeaseHeld, with messages written for the caller; every method is async and
never blocks the event loop.

Fencing: each lease carries a fence, a number that only grows across the session's leases (a new
one whenever the lease is newly acquired or taken from another owner). A write under a lease
(`save`, `write_record`) is refused with LeaseTaken when another lease on the session was
acquired since, or when what it would replace was written under a higher fence, so an instance
paused past its lease can never overwrite a newer state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


class StoreError(Exception):
    """A state could not be saved (disk full, over a cap, the store unreachable); the message says
    which and what to do."""


class LeaseTaken(StoreError):
    """This instance's lease on a session ran out and another instance took it."""


class StateUnusable(Exception):
    """A saved state exists but cannot be used (corrupt, cut short, another version, tampered)."""


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
    #: Higher than every fence of the session's earlier leases; carried by every write under it.
    fence: int
    #: Acquired from this other owner, whose lease ran out: the session ran there (and may have
    #: run calls it never checkpointed).
    taken_from: str | None = None
    #: A renewal found that the store had lost the lease and the session's fence (a Redis
    #: restarted without its data) and nobody took the session since, so it took the lease again:
    #: what the store held of the session (its checkpoint, its record) is gone with them.
    retaken: bool = False

    def same(self, other: Lease | None) -> bool:
        """The same lease, whatever its expiry (renewals move it)."""
        return other is not None and (self.session_id, self.owner, self.token) == (
            other.session_id,
            other.owner,
            other.token,
        )


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


@dataclass(frozen=True)
class SessionRecord:
    """What the store knows of a session besides its checkpoint: its latest call, and where it ran."""

    call: int
    owner: str


#: A record that cannot be read stands for a session that ran, so nothing is lost unsaid.
DAMAGED_RECORD = SessionRecord(1, "an unknown instance")


class Store(Protocol):
    """Sessions' checkpoints, records and leases, shared by the instances that use one store."""

    async def save(self, session_id: str, state: SavedState, lease: Lease | None = None) -> int:
        """Write `state` in place of the session's last one; the bytes stored. Raises StoreError
        (over MCP_SANDBOX_MAX_STATE_MB, the store full or unreachable), and LeaseTaken when
        `lease` is fenced off (another lease was acquired since). A failed write leaves the
        previous state."""
        ...

    async def load(self, session_id: str) -> SavedState | None:
        """The session's saved state, or None when there is none. Raises StateUnusable (damaged,
        of another version, another session's), and StoreError (unreachable)."""
        ...

    async def write_record(self, session_id: str, call: int, owner: str, lease: Lease | None = None) -> None:
        """Record that the session's latest call is `call`, run by `owner`. Raises StoreError,
        and LeaseTaken as `save` does."""
        ...

    async def read_record(self, session_id: str) -> SessionRecord | None:
        """The session's record, or None: it never ran, or was reset or expired. A damaged record
        reads as DAMAGED_RECORD. Raises StoreError (unreachable)."""
        ...

    async def delete(self, session_id: str) -> None:
        """Forget the session: its checkpoint and its record (its fence stays)."""
        ...

    async def delete_checkpoint(self, session_id: str) -> None:
        """Delete the session's checkpoint (unusable, or of another build); its record stays."""
        ...

    async def delete_older_than(self, seconds: float, keep: set[str]) -> int:
        """Delete states not written for `seconds`, except those of the sessions in `keep` and
        those another instance holds a lease on; how many (a store whose states expire on their
        own deletes none)."""
        ...

    async def acquire_lease(self, session_id: str, owner: str, seconds: float) -> Lease:
        """A lease on the session for `seconds`, for `owner`; its token and fence are the ones the
        owner held if nobody took the lease since, and `taken_from` names another owner whose
        lease ran out. Raises LeaseHeld while another owner's lease runs, and StoreError."""
        ...

    async def renew_lease(self, lease: Lease, seconds: float) -> Lease:
        """The same lease, running `seconds` from now. Raises LeaseTaken when it is no longer
        held (it ran out and another instance took it), and StoreError. A store that lost the
        lease and the session's fence altogether (Redis restarted empty) takes it again if nobody
        took the session since, `retaken`; its fence then stays above every later lease's."""
        ...

    async def release_lease(self, lease: Lease) -> None:
        """Give the lease up, if it is still this one, so another instance need not wait it out.
        Never raises: a lease not given up runs out."""
        ...

    async def ask_for(self, session_id: str, holder: str, asker: str) -> None:
        """Ask `holder`, which holds the session's lease, to hand the session over: it hears of it
        through `asks`, checkpoints the session and gives the lease up. Never raises: an ask not
        heard is a lease waited out."""
        ...

    async def asks(self, holder: str) -> list[str]:
        """The sessions other instances asked `holder` for since it last looked, each once (an ask
        left for an instance that stopped runs out on its own). Raises StoreError."""
        ...

    async def lost_data_since(self) -> float | None:
        """When the store was found to have lost its data (a Redis restarted without persistence,
        or flushed), while sessions from before then may still be called (the session TTL); None
        otherwise. A session it has no record of may then be one that ran before and is gone.
        Raises StoreError (unreachable)."""
        ...

    async def aclose(self) -> None:
        """Let go of what the store holds open (connections); its data stays."""
        ...
