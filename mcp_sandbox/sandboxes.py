"""The owner of every sandbox a session holds: it gives a session its sandbox (its own, one its
checkpoint is restored into, or a clean one), takes it back, replaces it, and returns it to the
ready pool. Nothing else hands a sandbox out or takes one back; leases and checkpoints only say
what to do with one."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import anyio

from mcp_sandbox import tracing
from mcp_sandbox.backends.base import Executor, NotDone, SandboxStartError
from mcp_sandbox.checkpointing import Checkpoints
from mcp_sandbox.leases import Leases
from mcp_sandbox.lifecycle import Resumed, Session, SessionState
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import SavedState

logger = logging.getLogger(__name__)


class Sandboxes:
    """The sandboxes of the sessions in `sessions` (a Sessions's registry), from `pool`."""

    def __init__(
        self,
        settings: Settings,
        pool: ReadyPool,
        checkpoints: Checkpoints,
        leases: Leases,
        sessions: Mapping[str, Session],
        metrics: Metrics,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._checkpoints = checkpoints
        self._leases = leases
        self._sessions = sessions
        self._metrics = metrics

    async def lend(self, principal: str) -> Executor:
        """A clean sandbox for one call without a session, to come back through `take_back_lent`.
        Raises PoolUnavailable."""
        return await self._pool.take(lend=True, principal=principal)

    async def take_back_lent(self, executor: Executor) -> None:
        """A lent sandbox is done with: recycled for the next caller, or closed."""
        await self._pool.give_back(executor, lent=True)

    async def own(self, session: Session, dead: Executor | None = None) -> Executor | None:
        """The session's live sandbox, once this instance holds its lease (`Leases.hold`): a
        sandbox older than the store's state (another instance ran the session since) goes
        back, and one found dead between calls is lost. `dead`: found dead as a call was sent,
        before its program started; a session in which nothing ran yet loses nothing by it."""
        stale = await self._leases.hold(session)
        executor = session.executor
        if executor is not None and (stale or executor is dead or not executor.alive):
            unstarted = executor is dead and not session.calls
            gone = SessionState.MOVED if stale else SessionState.NEW if unstarted else SessionState.LOST
            await self._pool.give_back(session.give_up(gone))
        return session.executor

    async def after_call(self, session: Session) -> None:
        """A session reset while its call waited or ran gives its sandbox back (it belongs to
        nobody now); one left without a sandbox gives its lease up."""
        reset = not self._open(session)
        if reset or session.executor is None:
            await self._leases.release(session)
        if reset and session.executor is not None:
            await self._pool.give_back(session.give_up(SessionState.NEW))

    async def provide(self, session: Session) -> Resumed:
        """Give a session without a sandbox one: from the pool, holding its last checkpoint if it
        has one, else clean; and what the call's result must say about that. Idle sessions are
        hibernated first to keep within MCP_SANDBOX_MAX_LIVE_SANDBOXES."""
        await self.make_room()
        resumed = await self._resume(session, None)
        if session.executor is None:
            session.to(SessionState.LIVE, await self._pool.take(principal=session.principal))
        return resumed

    async def replace(self, session: Session) -> Resumed:
        """The session's sandbox died in a call: its last checkpoint goes into the same sandbox
        renewed in place, if it could be, or into one from the pool; with none, the session is
        left without one, to start fresh at its next call. What the result must say."""
        renewed = await self.lose(session, keep_renewed=True)
        try:
            return await self._resume(session, renewed)
        finally:
            if renewed is not None and session.executor is not renewed:
                await self._pool.give_back(renewed)

    async def _resume(self, session: Session, renewed: Executor | None) -> Resumed:
        found = await self._checkpoints.find(session)
        executor = None
        if found.checkpoint is not None:
            executor, found.problem = await self._restore(session, found.checkpoint, renewed)
        restored = found.checkpoint if executor is not None else None
        resumed = await self._checkpoints.said(found, restored)
        if resumed.lost:
            await self._checkpoints.start_fresh(session)
        elif executor is not None and restored is not None:
            session.restored(executor, restored)
        return resumed

    @tracing.traced("mcp_sandbox.restore")
    async def _restore(
        self, session: Session, checkpoint: SavedState, renewed: Executor | None
    ) -> tuple[Executor | None, str | None]:
        """Put `checkpoint` into a sandbox for the session: the sandbox, or None and why not."""
        executor = (
            renewed
            if renewed is not None and renewed.alive
            else await self._pool.take(principal=session.principal)
        )
        refused = await executor.restore(checkpoint.payload)
        if refused is not None:
            await executor.close()  # half restored, perhaps: never reused
            # A pooled sandbox may have been used (recycled) in a way that rules it out: a new one.
            first = refused
            try:
                executor = await self._pool.start_new(session.principal)
                refused = await executor.restore(checkpoint.payload)
            except SandboxStartError as error:
                refused = NotDone(f"{first.reason}; and a new sandbox did not start: {error}")
            else:
                if refused is not None:
                    await executor.close()
        if refused is not None:
            return None, f"the session's checkpoint could not be restored ({refused.reason})"
        return executor, None

    async def take_back(self, session: Session, state: SessionState = SessionState.NEW) -> None:
        """The session gives its sandbox up (reset: new; written out: hibernated; another
        instance took it: moved), back to the pool."""
        await self._pool.give_back(session.give_up(state))

    async def lose(self, session: Session, *, keep_renewed: bool = False) -> Executor | None:
        """The session's sandbox lost its state. One renewed in place (Executor.renew) is clean
        again, for this session only: returned with `keep_renewed`, for the session to go on in;
        else given back, which closes it (a dead one too)."""
        executor = session.give_up(SessionState.LOST)
        if keep_renewed and executor.alive:
            return executor
        await self._pool.give_back(executor)
        return None

    async def close(self, session: Session) -> None:
        """Stop the session's sandbox at once, whatever runs in it (a reset during a call; a stop)."""
        if session.executor is not None:
            await session.executor.close()

    async def hibernate(
        self, session: Session, *, wait_for_checkpoint: bool = False, wait_for_call: bool = False
    ) -> bool:
        """Write an idle session out and give its sandbox back to the pool: whether it was.
        Never when its state cannot be carried whole (the session then stays live), nor when its
        sandbox died: its next call finds it lost and says so, though its checkpoint be current."""
        if session.executor is None or not session.executor.alive or self._checkpoints.closing:
            return False
        if session.lock.locked() and not (
            wait_for_call or (wait_for_checkpoint and session.state is SessionState.CHECKPOINTING)
        ):
            return False  # in a call: not idle
        async with session.lock:
            if session.executor is None or not session.executor.alive or not self._open(session):
                return False
            if not await self._checkpoints.save(session):
                return False
            await self.take_back(session, SessionState.HIBERNATED)
            await self._leases.release(session)
        logger.info("session %r hibernated after call %d", session.session_id, session.saved.call)
        return True

    async def hand_over(self, session: Session) -> None:
        """Another instance asked for the session: once its running call, if any, ends, write it
        out and let it go (hibernated here, its lease given up), so the asker restores it at once.
        A session whose state cannot be carried whole stays; the asker's wait runs out and says so."""
        if await self.hibernate(session, wait_for_call=True):
            self._metrics.handovers.inc()
            logger.info("session %r handed over to the instance that asked for it", session.session_id)
            return
        async with session.lock:
            executor = session.executor
            if executor is None or executor.alive or not self._open(session):
                return
            # Its sandbox died before a checkpoint took what ran since: the store's checkpoint is all
            # there is, and the asker restores it and says what was lost, as this instance would.
            await self.lose(session)
            await self._leases.release(session)
        self._metrics.handovers.inc()
        logger.info(
            "session %r, its sandbox dead, handed over to the instance that asked for it", session.session_id
        )

    async def make_room(self) -> None:
        """Before a session without a sandbox takes one: hibernate the least recently used idle
        sessions while MCP_SANDBOX_MAX_LIVE_SANDBOXES are live."""
        limit = self._settings.max_live_sandboxes
        if not limit or not self._checkpoints.on:
            return

        def live() -> list[Session]:
            return [s for s in self._sessions.values() if s.live]

        for session in sorted(live(), key=lambda s: s.last_used):
            if len(live()) < limit:
                return
            # An idle-time checkpoint holding its lock would otherwise pass it over for a newer one.
            await self.hibernate(session, wait_for_checkpoint=True)

    async def hibernate_idle(self, interval: float) -> None:
        """Hibernate sessions idle for MCP_SANDBOX_HIBERNATE_AFTER seconds, forever (run it in a task)."""
        after = self._settings.hibernate_after
        if not after or not self._checkpoints.on:
            return
        while True:
            await anyio.sleep(min(interval, after / 2))
            deadline = time.monotonic() - after
            for session in list(self._sessions.values()):
                if session.live and session.last_used < deadline:
                    await self.hibernate(session)

    async def move_out(self, interval: float) -> None:
        """Hibernate idle sessions whose sandbox's process is retiring, forever (run it in a task):
        it ends with its last sandbox, and until then what a program left spinning in it, which
        nothing could stop, keeps a core busy. Each session comes back in another sandbox at its
        next call, whole; one whose state cannot be carried whole stays."""
        if not self._checkpoints.on:
            return
        while True:
            await anyio.sleep(interval)
            for session in list(self._sessions.values()):
                if session.executor is not None and session.executor.moving_out:
                    await self.hibernate(session)
            self._pool.fill()  # ready sandboxes in such a process are closed, never handed out

    def _open(self, session: Session) -> bool:
        return self._sessions.get(session.session_id) is session
