"""Sessions: named sandboxes whose variables persist from call to call until they expire."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from mcp_sandbox.backends.base import Backend, Executor, SandboxStartError
from mcp_sandbox.errors import SessionElsewhere, SessionLimitReached
from mcp_sandbox.lifecycle import Resumed, Session, SessionState, Timings, account
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import (
    DirectoryStore,
    LeaseHeld,
    LeaseLost,
    SavedState,
    StateUnusable,
    StoreError,
)

logger = logging.getLogger(__name__)

#: Receives (seconds elapsed, latest line of output) while a call runs.
ProgressReport = Callable[[float, str | None], Awaitable[None]]


class ProgressRelay:
    """Reports a running call's progress every `interval` seconds, with the latest line its
    program printed (pushed by the executor), so a client waiting on a long computation hears
    that it runs, and what it last said, at a steady pace."""

    def __init__(self, report: ProgressReport, interval: float) -> None:
        self._report = report
        self._interval = interval
        self._line: str | None = None

    def push(self, line: str) -> None:
        self._line = line

    async def report_until_cancelled(self) -> None:
        started = time.monotonic()
        while True:
            await anyio.sleep(self._interval)
            try:
                await self._report(time.monotonic() - started, self._line)
            except Exception as error:  # noqa: BLE001 - a client that cannot take progress still gets its result
                logger.debug("progress report failed: %s", error)
                return


class SessionPool:
    """Runs code in sessions. Owns every executor that is handed out of the ready pool.

    A call without a session id gets a clean sandbox from the ready pool and gives it back
    afterwards, to be recycled (reset in place) or closed, so nothing it did can reach a later
    call. A session keeps its sandbox; calls in one session run one at a time, calls in
    different sessions run side by side. An ended session's sandbox goes back the same way.

    With a store, a session's state is checkpointed once it is idle, and a session whose
    sandbox is killed comes back from its last checkpoint in a new sandbox.
    """

    def __init__(
        self, settings: Settings, store: DirectoryStore | None = None, timings: Timings | None = None
    ) -> None:
        self._timings = timings or Timings()
        self._pool: ReadyPool | None = None
        self._backend: Backend | None = None
        self._task_group: anyio.abc.TaskGroup | None = None
        self._settings = settings
        self._store = store
        self._sessions: dict[str, Session] = {}
        #: Where each running executor's output lines go (its call's progress relay).
        self._relays: dict[Executor, ProgressRelay] = {}
        self._closing = False
        #: Checkpoints taken at once: each costs a core for tens of milliseconds (seconds for a
        #: large pickle), and a burst of sessions pausing together must not starve the calls.
        self._checkpoint_slots = anyio.Semaphore(max(1, (os.cpu_count() or 2) // 2))
        #: Names this instance in the leases it takes (and in the errors of other instances).
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

    def attach(
        self, pool: ReadyPool, backend: Backend | None = None, task_group: anyio.abc.TaskGroup | None = None
    ) -> None:
        """The pool sandboxes come from (made after the backend, which takes `on_progress`); the
        backend checkpoints are saved as, and the task group they are taken in (none: no checkpoints)."""
        self._pool, self._backend, self._task_group = pool, backend, task_group

    def on_progress(self, executor: Executor, line: str) -> None:
        """The executors' progress hook: a line its running program printed."""
        relay = self._relays.get(executor)
        if relay is not None:
            relay.push(line)

    @property
    def _ready_pool(self) -> ReadyPool:
        assert self._pool is not None, "attach a pool first"
        return self._pool

    def has(self, session_id: str) -> bool:
        """Whether the session is open here (live or hibernated)."""
        return session_id in self._sessions

    def state(self, session_id: str) -> SessionState | None:
        """The session's state (None: not open here)."""
        session = self._sessions.get(session_id)
        return session.state if session is not None else None

    def saved_call(self, session_id: str) -> int:
        """The call whose state the session's last checkpoint holds (0: none yet)."""
        session = self._sessions.get(session_id)
        return session.saved_call if session is not None else 0

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
    ) -> ExecutionResult:
        if session_id is None:
            for _ in range(2):  # once more if the sandbox turns out to have died while it waited
                executor = await self._ready_pool.acquire(lend=True)
                try:
                    result = await self._run_in(executor, code, timeout, progress)
                finally:
                    await self._ready_pool.release(executor, lent=True)
                if not executor.found_dead:
                    break
            return result
        session = self._sessions.get(session_id)
        if session is None:
            if len(self._sessions) >= self._settings.max_sessions:
                raise SessionLimitReached(
                    f"{len(self._sessions)} sessions are open, the most this server allows; "
                    "call reset_session on one you no longer need, or wait for idle ones to expire "
                    f"({self._settings.session_ttl:g} s)"
                )
            session = self._sessions[session_id] = Session(session_id)
        async with session.lock:
            try:
                await self._hold_lease(session)
                executor, resumed = await self._provide(session)
                result = await self._run_in(executor, code, timeout, progress)
                if result.session_lost and executor.found_dead and resumed.said_nothing:
                    # Died between calls unnoticed until now: the program never started, so it runs
                    # in the sandbox the session gets instead, as if the death had been seen first.
                    await self._lose_sandbox(session)
                    if not session.calls:
                        session.to(SessionState.NEW)  # nothing had run in it: nothing is lost
                    executor, resumed = await self._provide(session)
                    result = await self._run_in(executor, code, timeout, progress)
                if result.session_lost:
                    renewed = await self._lose_sandbox(session, keep_renewed=True)
                    resumed = await self._resume(session, renewed)
                if resumed.lost:
                    await self._start_fresh(session)
                if not result.session_lost:
                    session.calls += 1
                    await executor.jit_warm_up()
                    self._checkpoint_when_idle(session)
                notes = await self._write_record(session)
                update: dict[str, object] = {
                    "session_id": session_id,
                    "notes": [*session.notes, *resumed.notes, *notes, *result.notes],
                }
                session.notes.clear()
                if resumed.from_call is not None:
                    update |= {
                        "session_lost": False,
                        "session_restored": True,
                        "restored_from_call": resumed.from_call,
                    }
                if resumed.lost:
                    update["session_lost"] = True
                return result.model_copy(update=update)
            finally:
                session.last_used = time.monotonic()
                if self._sessions.get(session_id) is not session and session.executor is not None:
                    # Reset while this call waited or ran: the sandbox belongs to nobody now.
                    await self._give_back(session.to(SessionState.NEW))
                if session.executor is None:
                    await self._release_lease(session)

    async def _provide(self, session: Session) -> tuple[Executor, Resumed]:
        """The session's live sandbox: its own, or a new one holding its checkpoint (or a clean
        one), with what the call's result must say about that."""
        if session.executor is not None and not session.executor.alive:
            await self._lose_sandbox(session)  # died between calls
        if session.executor is not None:
            return session.executor, Resumed()
        await self._make_room(session)
        resumed = await self._resume(session)
        if session.executor is None:
            session.to(SessionState.LIVE, await self._ready_pool.acquire())
        assert session.executor is not None
        return session.executor, resumed

    async def _give_back(self, executor: Executor | None) -> None:
        """Give a sandbox a session gave up back to the ready pool."""
        assert executor is not None
        await self._ready_pool.release(executor)

    async def _lose_sandbox(self, session: Session, *, keep_renewed: bool = False) -> Executor | None:
        """The session's sandbox lost its state. One renewed in place (Executor.renew) is clean
        again, for this session only: returned with `keep_renewed`, for the session to go on in;
        else given back, which closes it."""
        executor = session.to(SessionState.LOST)
        assert executor is not None
        if not executor.alive:
            await executor.close()
        elif keep_renewed:
            return executor
        else:
            await self._ready_pool.release(executor)
        return None

    async def _start_fresh(self, session: Session) -> None:
        """The caller is told the session's variables are gone: from now on it has nothing more
        to lose, and no old checkpoint may come back in its place."""
        session.calls = session.saved_call = 0
        if session.state is SessionState.LOST:  # else it is live in the sandbox it was given
            session.to(SessionState.NEW)
        if self._store is not None:
            await anyio.to_thread.run_sync(self._store.delete_checkpoint, session.session_id)

    async def _write_record(self, session: Session) -> list[str]:
        """Record the session's latest call in the store before its result is sent, so that a
        later sandbox or instance knows what a restore cannot bring back; notes for the caller.
        Written when the record does not yet show the session past its checkpoint (the first call
        after each checkpoint, and after a restore or a loss): then any call after the stored
        checkpoint has left a record beyond it, which is all a restore needs to know."""
        store = self._store
        if (
            store is None
            or not self._checkpoints_on()
            or self._sessions.get(session.session_id) is not session
            or session.saved_call < session.recorded <= session.calls
        ):
            return []
        try:
            await anyio.to_thread.run_sync(
                store.write_record, session.session_id, session.calls, self.instance, session.lease
            )
        except LeaseLost:
            return ["another instance of this server took the session over during this call; run it again"]
        except StoreError as error:
            logger.warning("session %r: %s", session.session_id, error)
            return [
                f"{error}; should this server stop before the session's next checkpoint, its next result "
                "may not be able to say what was lost"
            ]
        session.recorded = session.calls
        if self._sessions.get(session.session_id) is not session:
            await anyio.to_thread.run_sync(store.delete, session.session_id)  # reset meanwhile
        return []

    def _leases_on(self) -> bool:
        return self._checkpoints_on()  # without checkpoints no other instance could take a session up

    async def _hold_lease(self, session: Session) -> None:
        """Make sure this instance holds the session's lease (its lock held), waiting up to
        MCP_SANDBOX_LEASE_SECONDS for another instance's to run out. A sandbox kept from before
        another instance ran the session is given back: its state is older than the store's.
        Raises SessionElsewhere."""
        if not self._leases_on():
            return
        assert self._store is not None
        store, seconds = self._store, self._settings.lease_seconds
        held = session.lease
        if held is not None and held.expires - time.time() > seconds / 2:
            return  # renewed in the background; nobody can have taken it
        deadline = time.monotonic() + seconds + 1
        while True:
            try:
                lease = await anyio.to_thread.run_sync(
                    store.acquire_lease, session.session_id, self.instance, seconds
                )
                break
            except LeaseHeld as error:
                if time.monotonic() >= deadline:
                    raise SessionElsewhere(
                        f"session {session.session_id!r} is running on another instance of this server "
                        f"({error}); send each session's calls to one instance (docs/deploy.md: hash on "
                        "Mcp-Param-Session-Id and Mcp-Session-Id), or retry once that instance has stopped"
                    ) from None
                await anyio.sleep(min(1.0, seconds / 10))
            except StoreError as error:
                logger.warning("session %r runs without a lease: %s", session.session_id, error)
                session.lease = None
                return
        session.lease = lease
        if lease.taken_from is not None:
            session.moved_from = lease.taken_from
        taken_meanwhile = held is None or lease.token != held.token
        if taken_meanwhile and session.executor is not None:
            # Another instance may have run it since: the store's state is the one to go on from.
            await self._give_back(session.to(SessionState.MOVED))

    async def _release_lease(self, session: Session) -> None:
        lease, session.lease = session.lease, None
        if lease is not None and self._store is not None:
            await anyio.to_thread.run_sync(self._store.release_lease, lease)

    async def renew_leases(self) -> None:
        """Renew the leases of live sessions every third of MCP_SANDBOX_LEASE_SECONDS, forever (run
        it in a task). A lease found taken (this instance stalled past it) gives its sandbox up."""
        if not self._leases_on():
            return
        assert self._store is not None
        store, seconds = self._store, self._settings.lease_seconds
        while True:
            await anyio.sleep(seconds / 3)
            for session in list(self._sessions.values()):
                lease = session.lease
                if lease is None:
                    continue
                try:
                    renewed = await anyio.to_thread.run_sync(store.renew_lease, lease, seconds)
                except LeaseLost:
                    logger.warning("session %r was taken over by another instance", session.session_id)
                    if session.lease is lease:
                        session.lease = None
                    if not session.lock.locked() and session.executor is not None:
                        await self._give_back(session.to(SessionState.MOVED))
                except StoreError as error:
                    logger.warning("session %r: %s", session.session_id, error)
                else:
                    if session.lease is lease:
                        session.lease = renewed

    async def _resume(self, session: Session, renewed: Executor | None = None) -> Resumed:
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
        if self._store is not None and self._checkpoints_on():
            record = await anyio.to_thread.run_sync(self._store.read_record, session.session_id)
            if record is not None:
                latest = max(latest, record.call)
                if moved_from is None and record.owner != self.instance and state is SessionState.NEW:
                    moved_from = record.owner if record.call > 0 else None
            restored, problem = await self._restore(session, renewed)
        elif state is SessionState.LOST and self._backend is not None and not self._backend.saves_sessions:
            problem = f"the {self._backend.name} backend keeps no checkpoints"
        elif state is SessionState.LOST and not self._settings.checkpoints:
            problem = "checkpoints are off (MCP_SANDBOX_CHECKPOINTS)"
        return account(state, latest, restored, problem, moved_from)

    async def _restore(
        self, session: Session, renewed: Executor | None = None
    ) -> tuple[SavedState | None, str | None]:
        """Put the session's checkpoint into a new sandbox (its executor): the checkpoint, or
        None and why it could not be used (None: there was none)."""
        assert self._store is not None and self._backend is not None
        store, backend = self._store, self._backend
        try:
            state = await anyio.to_thread.run_sync(store.load, session.session_id)
        except StateUnusable as error:
            await anyio.to_thread.run_sync(store.delete_checkpoint, session.session_id)
            session.saved_call = 0
            return None, f"the session's saved state could not be used ({error})"
        if state is None:
            return None, None
        if state.backend != backend.name or state.build != backend.build:
            await anyio.to_thread.run_sync(store.delete_checkpoint, session.session_id)
            session.saved_call = 0
            return None, (
                f"the session's saved state is from another sandbox build ({state.build}; this "
                f"server runs {backend.build})"
            )
        executor = renewed if renewed is not None and renewed.alive else await self._ready_pool.acquire()
        reason = await executor.restore(state.payload)
        if reason is not None:
            await executor.close()  # half restored, perhaps: never reused
            # A pooled sandbox may have been used (recycled) in a way that rules it out: a new one.
            try:
                executor = await backend.start()
                reason = await executor.restore(state.payload)
            except SandboxStartError as error:
                reason = f"{reason}; and a new sandbox did not start: {error}"
            else:
                if reason is not None:
                    await executor.close()
        if reason is not None:
            return None, f"the session's checkpoint could not be restored ({reason})"
        session.to(SessionState.LIVE, executor)
        session.calls = session.saved_call = state.call
        session.saved_lost, session.refused, session.refused_call = state.lost, None, 0
        return state, None

    def _checkpoint_when_idle(self, session: Session) -> None:
        if self._task_group is not None and self._checkpoints_on():
            self._task_group.start_soon(self._checkpoint, session, session.calls)

    async def _checkpoint(self, session: Session, call: int) -> None:
        """Save the session's state after `call`, unless another call came first (which will)."""
        await anyio.sleep(self._timings.checkpoint_quiet)
        if (
            session.lock.locked()
            or session.calls != call
            or self._sessions.get(session.session_id) is not session
        ):
            return
        async with self._checkpoint_slots:
            if session.calls != call or self._sessions.get(session.session_id) is not session:
                return  # ran again while it waited for a slot: that call's checkpoint will follow
            async with session.lock:
                if session.live and session.calls == call and not self._closing:
                    session.to(SessionState.CHECKPOINTING)
                    try:
                        await self._save(session)
                    finally:
                        session.to(SessionState.LIVE)

    async def _save(self, session: Session) -> bool:
        """Checkpoint the session (its lock held) unless the store's copy is current: whether the
        store now holds its whole state. A refusal goes into the session's next result, once."""
        assert self._store is not None and self._backend is not None
        executor, call = session.executor, session.calls
        if session.saved_call == call and session.refused is None:
            return not session.saved_lost
        if session.refused is not None and session.refused_call == call:
            return False  # nothing ran since: asking again would get the same answer
        if executor is None or not executor.alive:
            return False
        lease = session.lease
        if self._leases_on() and lease is None:
            return False  # another instance may run it now: its checkpoint is the one to keep
        saved = await executor.checkpoint()
        if not isinstance(saved, str):
            state = SavedState(self._backend.name, self._backend.build, saved.payload, call, saved.lost)
            try:
                await anyio.to_thread.run_sync(self._store.save, session.session_id, state, lease)
            except StoreError as error:
                saved = str(error)
            else:
                if self._sessions.get(session.session_id) is not session:
                    # Reset while it was being written: what was written belongs to nobody.
                    await anyio.to_thread.run_sync(self._store.delete, session.session_id)
                    return False
                session.saved_call, session.saved_lost, session.refused = call, saved.lost, None
                return not saved.lost
        session.refused_call = call
        if saved != session.refused:
            session.refused = saved
            kept = (
                f" (a restore brings back its state after call {session.saved_call})"
                if session.saved_call
                else ""
            )
            session.notes.append(f"the session's state after call {call} was not checkpointed{kept}: {saved}")
        return False

    async def _hibernate(self, session: Session, *, wait_for_checkpoint: bool = False) -> bool:
        """Write an idle session out and give its sandbox back to the pool: whether it was.
        Never when its state cannot be carried whole (the session then stays live)."""
        if session.executor is None or self._closing:
            return False
        if session.lock.locked() and not (
            wait_for_checkpoint and session.state is SessionState.CHECKPOINTING
        ):
            return False  # in a call: not idle
        async with session.lock:
            if (
                session.executor is None
                or self._sessions.get(session.session_id) is not session
                or not await self._save(session)
            ):
                return False
            await self._give_back(session.to(SessionState.HIBERNATED))
            await self._release_lease(session)
        logger.info("session %r hibernated after call %d", session.session_id, session.saved_call)
        return True

    async def _make_room(self, coming: Session) -> None:
        """Before `coming` takes a sandbox: hibernate the least recently used idle sessions
        while MCP_SANDBOX_MAX_LIVE_SANDBOXES are live."""
        limit = self._settings.max_live_sandboxes
        if not limit or not self._checkpoints_on():
            return

        def live() -> list[Session]:
            return [s for s in self._sessions.values() if s.live and s is not coming]

        for session in sorted(live(), key=lambda s: s.last_used):
            if len(live()) < limit:
                return
            # An idle-time checkpoint holding its lock would otherwise pass it over for a newer one.
            await self._hibernate(session, wait_for_checkpoint=True)

    def _checkpoints_on(self) -> bool:
        backend = self._backend
        return bool(self._store and backend and backend.saves_sessions and self._settings.checkpoints)

    async def hibernate_idle(self) -> None:
        """Hibernate sessions idle for MCP_SANDBOX_HIBERNATE_AFTER seconds, forever (run it in a task)."""
        after = self._settings.hibernate_after
        if not after or not self._checkpoints_on():
            return
        while True:
            await anyio.sleep(min(self._timings.sweep_interval, after / 2))
            deadline = time.monotonic() - after
            for session in list(self._sessions.values()):
                if session.live and session.last_used < deadline:
                    await self._hibernate(session)

    async def _run_in(
        self, executor: Executor, code: str, timeout: float, progress: ProgressReport | None
    ) -> ExecutionResult:
        if progress is None:
            return await executor.run(code, timeout)
        relay = self._relays[executor] = ProgressRelay(progress, self._timings.progress_interval)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(relay.report_until_cancelled)
                result = await executor.run(code, timeout)
                group.cancel_scope.cancel()
        finally:
            del self._relays[executor]
        return result

    async def reset(self, session_id: str) -> bool:
        """Forget a session, stop its sandbox and delete its saved state; True if it existed.
        A checkpoint being written meanwhile deletes what it wrote (see `_save`). Raises
        SessionElsewhere when another instance runs the session."""
        known = self._sessions.get(session_id)
        if self._leases_on() and (known is None or known.lease is None):
            assert self._store is not None
            try:
                lease = await anyio.to_thread.run_sync(
                    self._store.acquire_lease, session_id, self.instance, self._settings.lease_seconds
                )
            except LeaseHeld as error:
                raise SessionElsewhere(
                    f"session {session_id!r} is running on another instance of this server ({error}); "
                    "reset it through that instance, or once it has stopped"
                ) from None
            except StoreError:
                lease = None
            if lease is not None:
                await anyio.to_thread.run_sync(self._store.delete, session_id)
                await anyio.to_thread.run_sync(self._store.release_lease, lease)
        session = self._sessions.pop(session_id, None)
        if session is not None and session.executor is not None:
            if session.lock.locked() or self._closing:
                # A running call in it ends as a SandboxCrash; that is what resetting means.
                await session.executor.close()
            else:
                await self._give_back(session.to(SessionState.NEW))
        if self._store is not None:
            await anyio.to_thread.run_sync(self._store.delete, session_id)
        if session is not None:
            await self._release_lease(session)
        return session is not None

    async def expire_idle(self) -> None:
        """Close sessions idle for longer than the TTL, forever (run it in a task), and delete
        saved states nobody has used for as long (sessions of a server that stopped)."""
        while True:
            await anyio.sleep(min(self._timings.sweep_interval, self._settings.session_ttl / 2))
            if self._store is not None:
                ttl, ours = self._settings.session_ttl, set(self._sessions)
                await anyio.to_thread.run_sync(self._store.delete_older_than, ttl, ours)
            deadline = time.monotonic() - self._settings.session_ttl
            for session in list(self._sessions.values()):
                if not session.lock.locked() and session.last_used < deadline:
                    logger.info(
                        "session %r expired after %g s idle", session.session_id, self._settings.session_ttl
                    )
                    await self.reset(session.session_id)

    async def close(self) -> None:
        if self._checkpoints_on():
            with anyio.move_on_after(self._timings.closing_save):
                for session in list(self._sessions.values()):
                    async with session.lock:  # a checkpoint being taken is waited for, not skipped
                        if session.live and session.calls != session.saved_call:
                            await self._save(session)
        self._closing = True
        for session in list(self._sessions.values()):
            # Stopped, not ended: their saved state stays for the next server on this store.
            self._sessions.pop(session.session_id, None)
            if session.executor is not None:
                await session.executor.close()
            await self._release_lease(session)
