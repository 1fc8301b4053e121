"""Checkpoints and hibernation: a session's state saved into the store once it is idle, put
back into a new sandbox when it needs one, and written out to free a sandbox (docs/checkpoints.md)."""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Mapping
from dataclasses import replace

import anyio
import anyio.abc

from mcp_sandbox import tracing
from mcp_sandbox.backends.base import Backend, Executor, NotDone, SandboxStartError
from mcp_sandbox.leases import Leases
from mcp_sandbox.lifecycle import Refusal, Resumed, Saved, Session, SessionState, Timings, account
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.principals import owner
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import LeaseTaken, SavedState, StateUnusable, Store, StoreError

logger = logging.getLogger(__name__)


def checkpoints_on(settings: Settings, store: Store | None, backend: Backend | None) -> bool:
    """Whether sessions are checkpointed: with a store, a backend that saves sessions, and
    MCP_SANDBOX_CHECKPOINTS."""
    return bool(store and backend and backend.saves_sessions and settings.checkpoints)


class Checkpoints:
    """Checkpoints, restores and hibernation of the sessions in `sessions` (a Sessions's
    registry: a session no longer in it was reset, and what is written for it is deleted), when
    `checkpoints_on`; without, a lost session's result still says why it starts fresh."""

    def __init__(
        self,
        settings: Settings,
        store: Store | None,
        backend: Backend | None,
        sessions: Mapping[str, Session],
        ready_pool: ReadyPool,
        leases: Leases,
        *,
        instance: str,
        timings: Timings,
        task_group: anyio.abc.TaskGroup | None,
        metrics: Metrics | None = None,
    ) -> None:
        self._settings = settings
        self._store = store
        self._backend = backend
        self._sessions = sessions
        self._ready_pool = ready_pool
        self._leases = leases
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

    async def resume(self, session: Session, renewed: Executor | None = None) -> Resumed:
        """Give a session without a sandbox a new one holding its last checkpoint, if it has
        one, and say what that means for its caller (`account`). `renewed`: a clean sandbox to
        restore into first (its own, renewed in place); with nothing to restore, it is given back
        (closed: a renewed sandbox serves no other caller)."""
        try:
            return await self._resume_in(session, renewed)
        finally:
            if renewed is not None and session.executor is not renewed:
                await self._ready_pool.release(renewed)

    async def _resume_in(self, session: Session, renewed: Executor | None) -> Resumed:
        state = session.state
        moved_from, session.moved_from = session.moved_from, None
        latest, restored, problem = session.calls, None, None
        if self._store is not None and self.on:
            try:
                record = await self._store.read_record(session.session_id)
            except StoreError as error:  # what it ran is unknown: said, never taken for a new session
                record, problem = None, f"the session's saved state could not be read ({error})"
            if record is not None:
                latest = max(latest, record.call)
                if moved_from is None and record.owner != self._instance and state is SessionState.NEW:
                    moved_from = record.owner if record.call > 0 else None
            if problem is None:
                restored, problem = await self._restore(session, renewed)
            if record is None and restored is None and problem is None and state is SessionState.NEW:
                problem = await self._lost_with_store()
            self._metrics.count_restore(restored is not None, problem)
        elif state is SessionState.LOST and self._backend is not None and not self._backend.saves_sessions:
            problem = f"the {self._backend.name} backend keeps no checkpoints"
        elif state is SessionState.LOST and not self._settings.checkpoints:
            problem = "checkpoints are off (MCP_SANDBOX_CHECKPOINTS)"
        return account(state, latest, restored, problem, moved_from)

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

    @tracing.traced("mcp_sandbox.restore")
    async def _restore(
        self, session: Session, renewed: Executor | None = None
    ) -> tuple[SavedState | None, str | None]:
        """Put the session's checkpoint into a new sandbox (its executor): the checkpoint, or
        None and why it could not be used (None: there was none)."""
        assert self._store is not None and self._backend is not None
        store, backend = self._store, self._backend
        try:
            state = await store.load(session.session_id)
        except StateUnusable as error:
            await store.delete_checkpoint(session.session_id)
            session.saved = replace(session.saved, call=0)
            return None, f"the session's saved state could not be used ({error})"
        except StoreError as error:
            return None, f"the session's saved state could not be read ({error})"
        if state is None:
            return None, None
        if state.backend != backend.name or state.build != backend.build:
            await store.delete_checkpoint(session.session_id)
            session.saved = replace(session.saved, call=0)
            return None, (
                f"the session's saved state is from another sandbox build ({state.build}; this "
                f"server runs {backend.build})"
            )
        executor = (
            renewed
            if renewed is not None and renewed.alive
            else await self._ready_pool.acquire(principal=owner(session.session_id))
        )
        refused = await executor.restore(state.payload)
        if refused is not None:
            await executor.close()  # half restored, perhaps: never reused
            # A pooled sandbox may have been used (recycled) in a way that rules it out: a new one.
            first = refused
            try:
                executor = await backend.start()
                refused = await executor.restore(state.payload)
            except SandboxStartError as error:
                refused = NotDone(f"{first.reason}; and a new sandbox did not start: {error}")
            else:
                if refused is not None:
                    await executor.close()
        if refused is not None:
            return None, f"the session's checkpoint could not be restored ({refused.reason})"
        session.to(SessionState.LIVE, executor)
        session.calls, session.saved, session.refusal = state.call, Saved(state.call, state.lost), None
        return state, None

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
        if (
            store is None
            or not self.on
            or not self._open(session)
            or session.saved.call < session.recorded <= session.calls
        ):
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
                        await self._save(session)
                    finally:
                        session.to(SessionState.LIVE)

    @tracing.traced("mcp_sandbox.checkpoint")
    async def _save(self, session: Session) -> bool:
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
        lease = session.lease
        if self._leases.on and lease is None:
            return False  # another instance may run it now: its checkpoint is the one to keep
        saved = await executor.checkpoint()
        if not isinstance(saved, NotDone):
            state = SavedState(self._backend.name, self._backend.build, saved.payload, call, saved.lost)
            try:
                await self._store.save(session.session_id, state, lease)
            except LeaseTaken as error:
                saved = NotDone(str(error))
                self._metrics.store_errors.labels("save").inc()
            except StoreError as error:
                self._metrics.store_errors.labels("save").inc()
                logger.warning("session %r: %s", session.session_id, error)
                session.notes.extend(self._pause(session, error))
                return False
            else:
                if not self._open(session):
                    # Reset while it was being written: what was written belongs to nobody.
                    await self._forget(session.session_id)
                    return False
                session.saved, session.refusal = Saved(call, saved.lost), None
                self._metrics.count_checkpoint(len(state.payload))
                if session in self._paused:
                    self._paused.discard(session)
                    session.notes.append(
                        f"checkpoints resumed: the session's state after call {call} is in the store"
                    )
                return not saved.lost
        if session.refusal is None or saved.reason != session.refusal.reason:
            kept = (
                f" (a restore brings back its state after call {session.saved.call})"
                if session.saved.call
                else ""
            )
            session.notes.append(
                f"the session's state after call {call} was not checkpointed{kept}: {saved.reason}"
            )
        session.refusal = Refusal(saved.reason, call)
        return False

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

    async def hand_over(self, session: Session) -> None:
        """Another instance asked for the session: once its running call, if any, ends, write it
        out and let it go (hibernated here, its lease given up), so the asker restores it at once.
        A session whose state cannot be carried whole stays; the asker's wait runs out and says so."""
        if await self._hibernate(session, wait_for_call=True):
            self._metrics.handovers.inc()
            logger.info("session %r handed over to the instance that asked for it", session.session_id)
            return
        async with session.lock:
            executor = session.executor
            if executor is None or executor.alive or not self._open(session):
                return
            # Its sandbox died before a checkpoint took what ran since: the store's checkpoint is all
            # there is, and the asker restores it and says what was lost, as this instance would.
            session.to(SessionState.LOST)
            await executor.close()
            await self._leases.release(session)
        self._metrics.handovers.inc()
        logger.info(
            "session %r, its sandbox dead, handed over to the instance that asked for it", session.session_id
        )

    async def _hibernate(
        self, session: Session, *, wait_for_checkpoint: bool = False, wait_for_call: bool = False
    ) -> bool:
        """Write an idle session out and give its sandbox back to the pool: whether it was.
        Never when its state cannot be carried whole (the session then stays live)."""
        if session.executor is None or self._closing:
            return False
        if session.lock.locked() and not (
            wait_for_call or (wait_for_checkpoint and session.state is SessionState.CHECKPOINTING)
        ):
            return False  # in a call: not idle
        async with session.lock:
            if session.executor is None or not self._open(session) or not await self._save(session):
                return False
            executor = session.to(SessionState.HIBERNATED)
            assert executor is not None
            await self._ready_pool.release(executor)
            await self._leases.release(session)
        logger.info("session %r hibernated after call %d", session.session_id, session.saved.call)
        return True

    async def make_room(self, coming: Session) -> None:
        """Before `coming` takes a sandbox: hibernate the least recently used idle sessions
        while MCP_SANDBOX_MAX_LIVE_SANDBOXES are live."""
        limit = self._settings.max_live_sandboxes
        if not limit or not self.on:
            return

        def live() -> list[Session]:
            return [s for s in self._sessions.values() if s.live and s is not coming]

        for session in sorted(live(), key=lambda s: s.last_used):
            if len(live()) < limit:
                return
            # An idle-time checkpoint holding its lock would otherwise pass it over for a newer one.
            await self._hibernate(session, wait_for_checkpoint=True)

    async def hibernate_idle(self) -> None:
        """Hibernate sessions idle for MCP_SANDBOX_HIBERNATE_AFTER seconds, forever (run it in a task)."""
        after = self._settings.hibernate_after
        if not after or not self.on:
            return
        while True:
            await anyio.sleep(min(self._timings.sweep_interval, after / 2))
            deadline = time.monotonic() - after
            for session in list(self._sessions.values()):
                if session.live and session.last_used < deadline:
                    await self._hibernate(session)

    async def close(self) -> None:
        """Checkpoint the live sessions that ran since their last checkpoint, for at most
        `Timings.closing_save` in all; then start no more checkpoints."""
        if self.on:
            with anyio.move_on_after(self._timings.closing_save):
                for session in list(self._sessions.values()):
                    async with session.lock:  # a checkpoint being taken is waited for, not skipped
                        if session.live and session.calls != session.saved.call:
                            await self._save(session)
        self._closing = True
