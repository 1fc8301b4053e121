"""Checkpoints: a session's state saved into the store once it is idle, found again when it needs
a new sandbox, and what its next result says about that (docs/checkpoints.md). The sandboxes
themselves are the owner's (`sandboxes.Sandboxes`): it hands this module the one to save from or
restore into."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace

import anyio
import anyio.abc

from mcp_sandbox import tracing
from mcp_sandbox.backends.base import Backend, NotDone
from mcp_sandbox.lifecycle import Refusal, Resumed, Saved, Session, SessionState, Timings, account
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import LeaseTaken, SavedState, StateUnusable, Store, StoreError

logger = logging.getLogger(__name__)


def checkpoints_on(settings: Settings, store: Store | None, backend: Backend | None) -> bool:
    """Whether sessions are checkpointed: with a store, a backend that saves sessions, and
    MCP_SANDBOX_CHECKPOINTS."""
    return bool(store and backend and backend.saves_sessions and settings.checkpoints)


@dataclass
class Found:
    """What the store holds for a session about to get a new sandbox: the checkpoint to restore
    (None: none, or `problem` says why it cannot be used), its latest call as far as known, the
    instance it ran on, and its state when it was looked up."""

    state: SessionState
    latest: int
    checkpoint: SavedState | None = None
    problem: str | None = None
    moved_from: str | None = None
    recorded: bool = False


class Checkpoints:
    """Checkpoints and restores of the sessions in `sessions` (a Sessions's registry: a session
    no longer in it was reset, and what is written for it is deleted), when `checkpoints_on`;
    without, a lost session's result still says why it starts fresh. `leased`: instances share
    the store, and only a session whose lease this one holds is saved."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None,
        backend: Backend | None,
        sessions: Mapping[str, Session],
        *,
        leased: bool,
        instance: str,
        timings: Timings,
        task_group: anyio.abc.TaskGroup | None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._backend = backend
        self._sessions = sessions
        self._leased = leased
        self._instance = instance
        self._timings = timings
        self._task_group = task_group
        self._closing = False
        self._metrics = metrics or Metrics()
        #: Checkpoints taken at once: each costs a core for tens of milliseconds (seconds for a
        #: large pickle), and a burst of sessions pausing together must not starve the calls.
        self._checkpoint_slots = anyio.Semaphore(max(1, (os.cpu_count() or 2) // 2))
        #: Sessions told that their checkpoints pause (the store could not be written): told
        #: once, and once more when one lands again.
        self._paused: weakref.WeakSet[Session] = weakref.WeakSet()

    @property
    def on(self) -> bool:
        return checkpoints_on(self._settings, self._store, self._backend)

    @property
    def closing(self) -> bool:
        """The server stops: no checkpoint or hibernation starts any more."""
        return self._closing

    def _open(self, session: Session) -> bool:
        return self._sessions.get(session.session_id) is session

    async def find(self, session: Session) -> Found:
        """What the store holds for a session without a sandbox: its checkpoint, if one can be
        used, its record, and why not."""
        moved_from, session.moved_from = session.moved_from, None
        found = Found(session.state, session.calls, moved_from=moved_from)
        if self._store is None or not self.on:
            found.problem = self._why_none(session.state)
            return found
        try:
            record = await self._store.read_record(session.session_id)
        except StoreError as error:  # what it ran is unknown: said, never taken for a new session
            found.problem = f"the session's saved state could not be read ({error})"
            return found
        if record is not None:
            found.latest, found.recorded = max(found.latest, record.call), True
            if moved_from is None and record.owner != self._instance and session.state is SessionState.NEW:
                found.moved_from = record.owner if record.call > 0 else None
        found.checkpoint, found.problem = await self._load(session)
        return found

    def _why_none(self, state: SessionState) -> str | None:
        """Why a lost session has no checkpoint to come back from, without a store in use."""
        if state is SessionState.LOST and self._backend is not None and not self._backend.saves_sessions:
            return f"the {self._backend.name} backend keeps no checkpoints"
        if state is SessionState.LOST and not self._settings.checkpoints:
            return "checkpoints are off (MCP_SANDBOX_CHECKPOINTS)"
        return None

    async def said(self, found: Found, restored: SavedState | None) -> Resumed:
        """What a session's next result says, once it has a new sandbox holding `restored`
        (None: a clean one) (`account`)."""
        problem = found.problem
        if self._store is not None and self.on:
            if (
                not found.recorded
                and restored is None
                and problem is None
                and found.state is SessionState.NEW
            ):
                problem = await self._lost_with_store()
            self._metrics.count_restore(restored is not None, problem)
        return account(found.state, found.latest, restored, problem, found.moved_from)

    async def _lost_with_store(self) -> str | None:
        """Why a session the store has no record of may be one that ran and is gone: the store
        lost its data lately (None: it did not, or that is not known)."""
        assert self._store is not None
        try:
            since = await self._store.lost_data_since()
        except StoreError:
            return None  # the record was just read: a store that stops now is said at the next write
        if since is None:
            return None
        by = time.strftime("%H:%M:%S", time.localtime(since))
        return (
            f"the store of saved sessions lost its data by {by} "
            "(Redis restarted without persistence, or was flushed): if this session ran before then, "
            "its variables are gone"
        )

    async def _load(self, session: Session) -> tuple[SavedState | None, str | None]:
        """The session's checkpoint, if this sandbox build can restore it, or None and why it
        cannot be used (None: there was none). One that cannot be used is deleted."""
        assert self._store is not None and self._backend is not None
        store, backend = self._store, self._backend
        try:
            state = await store.load(session.session_id)
        except StateUnusable as error:
            await self._drop(session)
            return None, f"the session's saved state could not be used ({error})"
        except StoreError as error:
            return None, f"the session's saved state could not be read ({error})"
        if state is not None and (state.backend != backend.name or state.build != backend.build):
            await self._drop(session)
            return None, (
                f"the session's saved state is from another sandbox build ({state.build}; this "
                f"server runs {backend.build})"
            )
        return state, None

    async def _drop(self, session: Session) -> None:
        assert self._store is not None
        await self._store.delete_checkpoint(session.session_id)
        session.saved = replace(session.saved, call=0)

    async def _forget(self, session_id: str) -> None:
        """Delete a reset session's saved state; what a store cannot delete now, it sweeps or
        expires with the session's TTL."""
        assert self._store is not None
        try:
            await self._store.delete(session_id)
        except StoreError as error:
            logger.warning("session %r was reset, but its saved state stays for now: %s", session_id, error)

    async def start_fresh(self, session: Session) -> None:
        """The caller is told the session's variables are gone: from now on it has nothing more
        to lose, and no old checkpoint may come back in its place."""
        session.calls, session.saved = 0, replace(session.saved, call=0)
        if session.state is SessionState.LOST:  # else it is live in the sandbox it was given
            session.to(SessionState.NEW)
        if self._store is not None:
            try:
                await self._store.delete_checkpoint(session.session_id)
            except StoreError as error:
                logger.warning("session %r: its old checkpoint stays: %s", session.session_id, error)

    async def write_record(self, session: Session) -> list[str]:
        """Record the session's latest call in the store before its result is sent, so that a
        later sandbox or instance knows what a restore cannot bring back; notes for the caller.
        Written when the record does not yet show the session past its checkpoint (the first call
        after each checkpoint, and after a restore or a loss): then any call after the stored
        checkpoint has left a record beyond it, which is all a restore needs to know."""
        store = self._store
        if store is None or not self.on or not self._open(session) or session.record_is_current:
            return []
        try:
            await store.write_record(session.session_id, session.calls, self._instance, session.lease)
        except LeaseTaken:
            return ["another instance of this server took the session over during this call; run it again"]
        except StoreError as error:
            self._metrics.store_errors.labels("write_record").inc()
            logger.warning("session %r: %s", session.session_id, error)
            return self._pause(session, error)
        session.recorded = session.calls
        if not self._open(session):
            await self._forget(session.session_id)  # reset meanwhile
        return []

    def when_idle(self, session: Session) -> None:
        if self._task_group is not None and self.on:
            self._task_group.start_soon(self._checkpoint, session, session.calls)

    async def _checkpoint(self, session: Session, call: int) -> None:
        """Save the session's state after `call`, unless another call came first (which will)."""
        await anyio.sleep(self._timings.checkpoint_quiet)
        if session.lock.locked() or session.calls != call or not self._open(session):
            return
        async with self._checkpoint_slots:
            if session.calls != call or not self._open(session):
                return  # ran again while it waited for a slot: that call's checkpoint will follow
            async with session.lock:
                if session.live and session.calls == call and not self._closing:
                    session.to(SessionState.CHECKPOINTING)
                    try:
                        await self.save(session)
                    finally:
                        session.to(SessionState.LIVE)

    @tracing.traced("mcp_sandbox.checkpoint")
    async def save(self, session: Session) -> bool:
        """Checkpoint the session (its lock held) unless the store's copy is current: whether the
        store now holds its whole state. A refusal goes into the session's next result, once."""
        assert self._store is not None and self._backend is not None
        executor, call = session.executor, session.calls
        if session.saved.call == call and session.refusal is None:
            return not session.saved.lost
        if session.refusal is not None and session.refusal.call == call:
            return False  # nothing ran since: asking again would get the same answer
        if executor is None or not executor.alive:
            return False
        if self._leased and session.lease is None:
            return False  # another instance may run it now: its checkpoint is the one to keep
        saved = await executor.checkpoint()
        if isinstance(saved, NotDone):
            self._refused(session, call, saved)
            return False
        state = SavedState(self._backend.name, self._backend.build, saved.payload, call, saved.lost)
        stored = await self._store_state(session, state)
        if isinstance(stored, NotDone):
            self._refused(session, call, stored)
            return False
        return stored and not saved.lost

    async def _store_state(self, session: Session, state: SavedState) -> NotDone | bool:
        """Write a checkpoint: whether it landed, or a refusal to say (a store that fails says so
        once, `_pause`; a session reset meanwhile is gone)."""
        assert self._store is not None
        try:
            await self._store.save(session.session_id, state, session.lease)
        except LeaseTaken as error:
            self._metrics.store_errors.labels("save").inc()
            return NotDone(str(error))
        except StoreError as error:
            self._metrics.store_errors.labels("save").inc()
            logger.warning("session %r: %s", session.session_id, error)
            session.notes.extend(self._pause(session, error))
            return False
        if not self._open(session):
            # Reset while it was being written: what was written belongs to nobody.
            await self._forget(session.session_id)
            return False
        session.saved, session.refusal = Saved(state.call, state.lost), None
        self._metrics.count_checkpoint(len(state.payload))
        if session in self._paused:
            self._paused.discard(session)
            session.notes.append(
                f"checkpoints resumed: the session's state after call {state.call} is in the store"
            )
        return True

    def _refused(self, session: Session, call: int, refused: NotDone) -> None:
        """Say a refused checkpoint in the session's next result, once for each reason."""
        if session.refusal is None or refused.reason != session.refusal.reason:
            kept = (
                f" (a restore brings back its state after call {session.saved.call})"
                if session.saved.call
                else ""
            )
            session.notes.append(
                f"the session's state after call {call} was not checkpointed{kept}: {refused.reason}"
            )
        session.refusal = Refusal(refused.reason, call)

    def _pause(self, session: Session, error: StoreError) -> list[str]:
        """The store could not be written (unreachable, full): what the session's caller is told,
        once until a checkpoint lands again (then that is said too)."""
        if session in self._paused:
            return []
        self._paused.add(session)
        kept = session.saved.call
        at_risk = (
            f"a restart of this server or a crash of its sandbox would take it back to its checkpoint "
            f"after call {kept}"
            if kept
            else "a restart of this server or a crash of its sandbox would lose it (it has no checkpoint)"
        )
        return [
            f"checkpoints are paused: {error}. The session runs on in its sandbox, whole, but {at_risk}; "
            "the next result that follows a checkpoint landing says they resumed"
        ]

    async def close(self) -> None:
        """Checkpoint the live sessions that ran since their last checkpoint, for at most
        `Timings.closing_save` in all; then start no more checkpoints."""
        if self.on:
            with anyio.move_on_after(self._timings.closing_save):
                for session in list(self._sessions.values()):
                    async with session.lock:  # a checkpoint being taken is waited for, not skipped
                        if session.live and session.calls != session.saved.call:
                            await self.save(session)
        self._closing = True
