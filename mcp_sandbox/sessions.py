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

from mcp_sandbox.backends.base import Backend, Executor
from mcp_sandbox.checkpointing import Checkpoints, checkpoints_on
from mcp_sandbox.errors import SessionLimitReached
from mcp_sandbox.leases import ASKS_INTERVAL_S, Leases
from mcp_sandbox.lifecycle import Resumed, Session, SessionState, Timings
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.principals import SOLE, owner
from mcp_sandbox.quotas import Limits, Quotas
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings
from mcp_sandbox.stopping import stopped_by
from mcp_sandbox.store import Store, StoreError

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

    async def report_until_cancelled(self, stop: anyio.Event) -> None:
        started = time.monotonic()
        while True:
            await anyio.sleep(self._interval)
            if stop.is_set():
                return  # the caller went away: nobody to tell
            try:
                await self._report(time.monotonic() - started, self._line)
            except Exception as error:  # noqa: BLE001 - a client that cannot take progress still gets its result
                logger.debug("progress report failed: %s", error)
                return


class Sessions:
    """Runs code in sessions. Owns every executor that is handed out of the ready pool.

    A call without a session id gets a clean sandbox from the ready pool and gives it back
    afterwards, to be recycled (reset in place) or closed, so nothing it did can reach a later
    call. A session keeps its sandbox; calls in one session run one at a time, calls in
    different sessions run side by side. An ended session's sandbox goes back the same way.

    With a store, a session's state is checkpointed once it is idle, and a session whose
    sandbox is killed comes back from its last checkpoint in a new sandbox (`Checkpoints`); a
    session runs only while this instance holds its lease (`Leases`). Its state changes only
    through the moves of `lifecycle.TRANSITIONS`.
    """

    def __init__(
        self,
        settings: Settings,
        store: Store | None = None,
        timings: Timings | None = None,
        quotas: Quotas | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._timings = timings or Timings()
        self._metrics = metrics or Metrics()
        #: Each principal's limits on sessions and live sandboxes.
        self._quotas = quotas or Quotas(Limits.from_settings(settings))
        self._pool: ReadyPool | None = None
        self._attached: tuple[Checkpoints, Leases] | None = None
        self._settings = settings
        self._store = store
        self._sessions: dict[str, Session] = {}
        #: Names this instance in the leases it takes (and in the errors of other instances).
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"

    def attach(
        self, pool: ReadyPool, backend: Backend | None = None, task_group: anyio.abc.TaskGroup | None = None
    ) -> None:
        """The pool sandboxes come from (made after the backend, which takes `on_progress`); the
        backend checkpoints are saved as, and the task group they are taken in (none: no checkpoints)."""
        self._pool = pool
        # Without checkpoints no other instance could take a session up: nothing to lease.
        leased = self._store if checkpoints_on(self._settings, self._store, backend) else None
        leases = Leases(
            leased,
            self._settings.lease_seconds,
            self.instance,
            self._sessions,
            pool,
            renew_each_call=self._settings.redis_url is not None,
        )
        checkpoints = Checkpoints(
            self._settings,
            self._store,
            backend,
            self._sessions,
            pool,
            leases,
            instance=self.instance,
            timings=self._timings,
            task_group=task_group,
            metrics=self._metrics,
        )
        leases.on_retaken = checkpoints.when_idle
        self._attached = checkpoints, leases

    @property
    def _ready_pool(self) -> ReadyPool:
        assert self._pool is not None, "attach a pool first"
        return self._pool

    @property
    def _checkpoints(self) -> Checkpoints:
        assert self._attached is not None, "attach a pool first"
        return self._attached[0]

    @property
    def _leases(self) -> Leases:
        assert self._attached is not None, "attach a pool first"
        return self._attached[1]

    def has(self, session_id: str) -> bool:
        """Whether the session is open here (live or hibernated)."""
        return session_id in self._sessions

    def state(self, session_id: str) -> SessionState | None:
        """The session's state (None: not open here)."""
        session = self._sessions.get(session_id)
        return session.state if session is not None else None

    def counts(self) -> dict[str, int]:
        """How many sessions are open here in each state (every state, 0 included)."""
        counts = dict.fromkeys((state.value for state in SessionState), 0)
        for session in self._sessions.values():
            counts[session.state.value] += 1
        return counts

    def saved_call(self, session_id: str) -> int:
        """The call whose state the session's last checkpoint holds (0: none yet)."""
        session = self._sessions.get(session_id)
        return session.saved.call if session is not None else 0

    def _held_by(self, principal: str) -> tuple[int, int]:
        """How many sessions `principal` has open here, and how many of them hold a sandbox."""
        own = [session for key, session in self._sessions.items() if owner(key) == principal]
        return len(own), sum(session.live for session in own)

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
        principal: str = SOLE,
        stop: anyio.Event | None = None,
    ) -> ExecutionResult:
        """Run `code` on its own (no session) or in session `session_id` (a scoped name, which
        `principal` owns), until `stop` is set (the caller went away: the program is stopped as at
        its timeout). Raises PoolUnavailable, SessionLimitReached, SessionElsewhere,
        PrincipalLimitReached when the principal is at one of its limits, and CallStopped when
        `stop` came before the program started."""
        stop = stop or anyio.Event()
        if session_id is None:
            for _ in range(2):  # once more if the sandbox turns out to have died while it waited
                async with stopped_by(stop):
                    executor = await self._ready_pool.acquire(lend=True, principal=principal)
                try:
                    result = await self._run_in(executor, code, timeout, progress, stop)
                finally:
                    await self._ready_pool.release(executor, lent=True)
                if not executor.found_dead:
                    break
            return result
        session = self._sessions.get(session_id)
        opened, live = self._held_by(principal)
        if session is None:
            self._quotas.check_new_session(principal, opened, self._settings.session_ttl)
        if session is None or not (session.live or session.lock.locked()):
            # Checked again as it takes one (under its lock); here so no session is made for nothing.
            self._quotas.check_new_sandbox(principal, live)
        if session is None:
            if len(self._sessions) >= self._settings.max_sessions:
                raise SessionLimitReached(
                    f"{len(self._sessions)} sessions are open, the most this server allows; "
                    "call reset_session on one you no longer need, or wait for idle ones to expire "
                    f"({self._settings.session_ttl:g} s)"
                )
            session = self._sessions[session_id] = Session(session_id)
        async with stopped_by(stop):
            await session.lock.acquire()
        try:
            try:
                async with stopped_by(stop):
                    await self._leases.hold(session)
                    executor, resumed = await self._provide(session, principal)
                result = await self._run_in(executor, code, timeout, progress, stop)
                if result.session_lost and executor.found_dead and resumed.said_nothing:
                    # Died between calls unnoticed until now: the program never started, so it runs
                    # in the sandbox the session gets instead, as if the death had been seen first.
                    await self._lose_sandbox(session)
                    if not session.calls:
                        session.to(SessionState.NEW)  # nothing had run in it: nothing is lost
                    async with stopped_by(stop):
                        executor, resumed = await self._provide(session, principal)
                    result = await self._run_in(executor, code, timeout, progress, stop)
                if result.session_lost:
                    renewed = await self._lose_sandbox(session, keep_renewed=True)
                    resumed = await self._checkpoints.resume(session, renewed)
                if resumed.lost:
                    await self._checkpoints.start_fresh(session)
                if not result.session_lost:
                    session.calls += 1
                    await executor.jit_warm_up()
                    self._checkpoints.when_idle(session)
                notes = await self._checkpoints.write_record(session)
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
                    await self._leases.release(session)
        finally:
            session.lock.release()

    async def _provide(self, session: Session, principal: str) -> tuple[Executor, Resumed]:
        """The session's live sandbox: its own, or a new one holding its checkpoint (or a clean
        one), with what the call's result must say about that. Raises PrincipalLimitReached when
        `principal` holds as many sandboxes as it may."""
        if session.executor is not None and not session.executor.alive:
            await self._lose_sandbox(session)  # died between calls
        if session.executor is not None:
            return session.executor, Resumed()
        with self._quotas.taking_sandbox(principal, self._held_by(principal)[1]):
            await self._checkpoints.make_room(session)
            resumed = await self._checkpoints.resume(session)
            if session.executor is None:
                session.to(SessionState.LIVE, await self._ready_pool.acquire(principal=principal))
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

    async def hibernate_idle(self) -> None:
        """Hibernate sessions idle for MCP_SANDBOX_HIBERNATE_AFTER seconds, forever (run it in a task)."""
        await self._checkpoints.hibernate_idle()

    async def renew_leases(self) -> None:
        """Renew the leases of live sessions, forever (run it in a task)."""
        await self._leases.renew_forever()

    async def answer_asks(self) -> None:
        """Hand over the sessions other instances ask for, forever (run it in a task): a call that
        reaches another instance, after a routing change, costs a restore, not a wait and an error."""
        if not self._leases.on or (self._settings.state_dir is None and self._settings.redis_url is None):
            return  # a private folder of this server's own: no other instance can ask
        async with anyio.create_task_group() as handing_over:
            while True:
                await anyio.sleep(ASKS_INTERVAL_S)
                for session_id in await self._leases.asked():
                    session = self._sessions.get(session_id)
                    if session is not None and session.lease is not None:
                        handing_over.start_soon(self._checkpoints.hand_over, session)

    async def _run_in(
        self,
        executor: Executor,
        code: str,
        timeout: float,
        progress: ProgressReport | None,
        stop: anyio.Event,
    ) -> ExecutionResult:
        if progress is None:
            result = await executor.run(code, timeout, stop)
            self._metrics.count_lost(result)
            return result
        relay = ProgressRelay(progress, self._timings.progress_interval)
        async with anyio.create_task_group() as group:
            group.start_soon(relay.report_until_cancelled, stop)
            result = await executor.run(code, timeout, stop, on_output=relay.push)
            group.cancel_scope.cancel()
        self._metrics.count_lost(result)
        return result

    async def reset(self, session_id: str) -> bool:
        """Forget a session, stop its sandbox and delete its saved state; True if it existed.
        A checkpoint being written meanwhile deletes what it wrote (`Checkpoints`). Raises
        SessionElsewhere when another instance runs the session."""
        await self._leases.take_for_reset(session_id)
        session = self._sessions.pop(session_id, None)
        if session is not None and session.executor is not None:
            if session.lock.locked() or self._checkpoints.closing:
                # A running call in it ends as a SandboxCrash; that is what resetting means.
                await session.executor.close()
            else:
                await self._give_back(session.to(SessionState.NEW))
        if self._store is not None:
            try:
                await self._store.delete(session_id)
            except StoreError as error:  # swept, or expired with the session's TTL, later
                logger.warning(
                    "session %r was reset, but its saved state stays for now: %s", session_id, error
                )
        if session is not None:
            await self._leases.release(session)
        return session is not None

    async def expire_idle(self) -> None:
        """Close sessions idle for longer than the TTL, forever (run it in a task), and delete
        saved states nobody has used for as long (sessions of a server that stopped)."""
        while True:
            await anyio.sleep(min(self._timings.sweep_interval, self._settings.session_ttl / 2))
            if self._store is not None:
                ttl, ours = self._settings.session_ttl, set(self._sessions)
                await self._store.delete_older_than(ttl, ours)
            deadline = time.monotonic() - self._settings.session_ttl
            for session in list(self._sessions.values()):
                if not session.lock.locked() and session.last_used < deadline:
                    logger.info(
                        "session %r expired after %g s idle", session.session_id, self._settings.session_ttl
                    )
                    await self.reset(session.session_id)

    async def close(self) -> None:
        await self._checkpoints.close()
        for session in list(self._sessions.values()):
            # Stopped, not ended: their saved state stays for the next server on this store.
            self._sessions.pop(session.session_id, None)
            if session.executor is not None:
                await session.executor.close()
            await self._leases.release(session)
