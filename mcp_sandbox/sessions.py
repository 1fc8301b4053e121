"""Sessions: named sandboxes whose variables persist from call to call until they expire. The
path of one call, as its steps: hold the session's lease, get its sandbox, run, settle, say."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.abc

from mcp_sandbox.backends.base import Backend, Executor
from mcp_sandbox.calls import Call, reporting
from mcp_sandbox.checkpointing import Checkpoints, checkpoints_on
from mcp_sandbox.errors import SessionLimitReached
from mcp_sandbox.leases import ASKS_INTERVAL_S, Leases, Renewal
from mcp_sandbox.lifecycle import Resumed, Session, SessionState, Timings, said
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.principals import SOLE
from mcp_sandbox.progress import ProgressRelay, ProgressReport
from mcp_sandbox.quotas import Limits, Quotas
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sandboxes import Sandboxes
from mcp_sandbox.settings import Settings
from mcp_sandbox.stopping import stopped_by
from mcp_sandbox.store import Store, StoreError

logger = logging.getLogger(__name__)


class Sessions:
    """Runs code in sessions.

    A call without a session id gets a clean sandbox lent from the ready pool, given back
    afterwards to be recycled (reset in place) or closed, so nothing it did can reach a later
    call. A session keeps its sandbox; calls in one session run one at a time, calls in
    different sessions run side by side. `Sandboxes` owns every sandbox a session holds.

    With a store, a session's state is checkpointed once it is idle, and a session whose
    sandbox is killed comes back from its last checkpoint in a new sandbox (`Checkpoints`); a
    session runs only while this instance holds its lease (`Leases`). Its state changes only
    through the moves of `lifecycle.TRANSITIONS`.
    """

    def __init__(
        self,
        settings: Settings,
        pool: ReadyPool,
        *,
        backend: Backend | None = None,
        store: Store | None = None,
        task_group: anyio.abc.TaskGroup | None = None,
        timings: Timings | None = None,
        quotas: Quotas | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`backend`: what checkpoints are saved as; `task_group`: where (None: no checkpoints)."""
        self._timings = timings or Timings()
        self._metrics = metrics or Metrics()
        #: Each principal's limits on sessions and live sandboxes.
        self._quotas = quotas or Quotas(Limits.from_settings(settings))
        self._settings = settings
        self._store = store
        self._sessions: dict[str, Session] = {}
        #: Names this instance in the leases it takes (and in the errors of other instances).
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        # Without checkpoints no other instance could take a session up: nothing to lease.
        leased = store if checkpoints_on(settings, store, backend) else None
        self._leases = Leases(leased, settings, self.instance, self._sessions)
        self._checkpoints = Checkpoints(
            settings,
            store,
            backend,
            self._sessions,
            leased=self._leases.on,
            instance=self.instance,
            timings=self._timings,
            task_group=task_group,
            metrics=self._metrics,
        )
        self._sandboxes = Sandboxes(
            settings, pool, self._checkpoints, self._leases, self._sessions, self._metrics
        )

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
        own = [session for session in self._sessions.values() if session.principal == principal]
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
        relay = ProgressRelay(progress, self._timings.progress_interval) if progress is not None else None
        call = Call(code, timeout, stop, relay)
        async with reporting(call):
            if session_id is None:
                return await self._run_alone(call, principal)
            return await self._run_in_session(call, session_id, principal)

    async def _run_alone(self, call: Call, principal: str) -> ExecutionResult:
        """A call without a session, in a clean sandbox lent for it; once more in another if that
        one turns out to have died while it waited (the program never started)."""
        for _ in range(2):
            async with stopped_by(call.stop):
                executor = await self._sandboxes.lend(principal)
            try:
                result = await call.run_in(executor, self._metrics)
            finally:
                await self._sandboxes.take_back_lent(executor)
            if not executor.found_dead:
                break
        return result

    async def _run_in_session(self, call: Call, session_id: str, principal: str) -> ExecutionResult:
        """A call in a session: hold it, get its sandbox, run (once more in a new sandbox if its own
        turns out to have died between calls, unnoticed until the call was sent: as if the death
        had been seen first), settle, say."""
        session = self._open(session_id, principal)
        async with self._holding(session, call):
            dead: Executor | None = None
            for _ in range(2):
                executor, resumed = await self._get_sandbox(session, principal, call.stop, dead)
                result = await call.run_in(executor, self._metrics)
                if not (executor.found_dead and result.session_lost and resumed.said_nothing):
                    break
                dead = executor
            resumed = await self._settle(session, executor, result, resumed)
            return said(result, session, resumed, await self._checkpoints.write_record(session))

    def _open(self, session_id: str, principal: str) -> Session:
        """The session, made if it is new, once the principal's and the server's limits allow."""
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
            session = self._sessions[session_id] = Session(session_id, principal)
        return session

    @asynccontextmanager
    async def _holding(self, session: Session, call: Call) -> AsyncIterator[None]:
        """The session's lock for one call; after it, the owner settles what a reset meanwhile or
        a sandbox lost left behind."""
        if session.lock.locked():
            call.waiting("the session's running call to end")
        async with stopped_by(call.stop):
            await session.lock.acquire()
        call.waiting("a sandbox")
        try:
            yield
        finally:
            try:
                session.last_used = time.monotonic()
                await self._sandboxes.after_call(session)
            finally:
                session.lock.release()
            # Once the lock is free: a checkpoint due sooner would find it held and pass.
            if session.live:
                self._checkpoints.when_idle(session)

    async def _get_sandbox(
        self, session: Session, principal: str, stop: anyio.Event, dead: Executor | None = None
    ) -> tuple[Executor, Resumed]:
        """This instance's lease on the session, then its sandbox: its own (unless it is `dead`),
        or a new one holding its checkpoint (or a clean one), with what the call's result must
        say about that. Raises SessionElsewhere, StoreUnavailable, and PrincipalLimitReached when
        `principal` holds as many sandboxes as it may."""
        async with stopped_by(stop):
            executor = await self._sandboxes.own(session, dead)
            if executor is not None:
                return executor, Resumed()
            with self._quotas.taking_sandbox(principal, self._held_by(principal)[1]):
                resumed = await self._sandboxes.provide(session)
        assert session.executor is not None
        return session.executor, resumed

    async def _settle(
        self, session: Session, executor: Executor, result: ExecutionResult, resumed: Resumed
    ) -> Resumed:
        """After the run: a session whose sandbox died comes back from its checkpoint (what that
        says replaces what its getting a sandbox said); else the call counts (a checkpoint follows
        once the session is idle: `_holding`)."""
        if result.session_lost:
            return await self._sandboxes.replace(session)
        session.calls += 1
        await executor.jit_warm_up()
        return resumed

    async def hibernate_idle(self) -> None:
        """Hibernate sessions idle for MCP_SANDBOX_HIBERNATE_AFTER seconds, forever (run it in a task)."""
        await self._sandboxes.hibernate_idle(self._timings.sweep_interval)

    async def move_out(self) -> None:
        """Move idle sessions out of processes that are retiring, forever (run it in a task)."""
        await self._sandboxes.move_out(self._timings.sweep_interval)

    async def renew_leases(self) -> None:
        """Renew the leases of live sessions, forever (run it in a task)."""
        if not self._leases.on:
            return
        while True:
            await anyio.sleep(self._leases.renew_interval)
            for session in list(self._sessions.values()):
                renewal = await self._leases.renew(session)
                if renewal is Renewal.TAKEN and session.executor is not None:
                    await self._sandboxes.take_back(session, SessionState.MOVED)
                elif renewal is Renewal.RETAKEN:
                    self._checkpoints.when_idle(session)

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
                        handing_over.start_soon(self._sandboxes.hand_over, session)

    async def reset(self, session_id: str) -> bool:
        """Forget a session, stop its sandbox and delete its saved state; True if it existed.
        A checkpoint being written meanwhile deletes what it wrote (`Checkpoints`). Raises
        SessionElsewhere when another instance runs the session."""
        await self._leases.take_for_reset(session_id)
        session = self._sessions.pop(session_id, None)
        if session is not None and session.executor is not None:
            if session.lock.locked() or self._checkpoints.closing:
                # A running call in it ends as a SandboxCrash; that is what resetting means.
                await self._sandboxes.close(session)
            else:
                await self._sandboxes.take_back(session)
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
            await self._sandboxes.close(session)
            await self._leases.release(session)
