"""Sessions: named sandboxes whose variables persist from call to call until they expire."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

#: How often idle sessions are looked for, at most.
SWEEP_INTERVAL = 5.0
#: Seconds between progress reports of a running call.
PROGRESS_INTERVAL = 1.0

#: Receives (seconds elapsed, latest line of output) while a call runs.
ProgressReport = Callable[[float, str | None], Awaitable[None]]


class ProgressRelay:
    """Reports a running call's progress every PROGRESS_INTERVAL seconds, with the latest line
    its program printed (pushed by the executor), so a client waiting on a long computation
    hears that it runs, and what it last said, at a steady pace."""

    def __init__(self, report: ProgressReport) -> None:
        self._report = report
        self._line: str | None = None

    def push(self, line: str) -> None:
        self._line = line

    async def report_until_cancelled(self) -> None:
        started = time.monotonic()
        while True:
            await anyio.sleep(PROGRESS_INTERVAL)
            try:
                await self._report(time.monotonic() - started, self._line)
            except Exception as error:  # noqa: BLE001 - a client that cannot take progress still gets its result
                logger.debug("progress report failed: %s", error)
                return


class SessionLimitReached(Exception):
    """Every session slot is taken."""


@dataclass(eq=False)
class Session:
    session_id: str
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    executor: Executor | None = None
    last_used: float = field(default_factory=time.monotonic)


class SessionPool:
    """Runs code in sessions. Owns every executor that is handed out of the ready pool.

    A call without a session id gets a clean sandbox from the ready pool and gives it back
    afterwards, to be recycled (reset in place) or closed, so nothing it did can reach a later
    call. A session keeps its sandbox; calls in one session run one at a time, calls in
    different sessions run side by side. An ended session's sandbox goes back the same way.
    """

    def __init__(self, settings: Settings) -> None:
        self._pool: ReadyPool | None = None
        self._settings = settings
        self._sessions: dict[str, Session] = {}
        #: Where each running executor's output lines go (its call's progress relay).
        self._relays: dict[Executor, ProgressRelay] = {}
        self._closing = False

    def attach(self, pool: ReadyPool) -> None:
        """The pool sandboxes come from (made after the backend, which takes `on_progress`)."""
        self._pool = pool

    def on_progress(self, executor: Executor, line: str) -> None:
        """The executors' progress hook: a line its running program printed."""
        relay = self._relays.get(executor)
        if relay is not None:
            relay.push(line)

    @property
    def _ready_pool(self) -> ReadyPool:
        assert self._pool is not None, "attach a pool first"
        return self._pool

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
    ) -> ExecutionResult:
        if session_id is None:
            executor = await self._ready_pool.acquire(lend=True)
            try:
                return await self._run_in(executor, code, timeout, progress)
            finally:
                await self._ready_pool.release(executor, lent=True)
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
                if session.executor is None or not session.executor.alive:
                    if session.executor is not None:
                        await session.executor.close()
                    session.executor = await self._ready_pool.acquire()
                result = await self._run_in(session.executor, code, timeout, progress)
                if result.session_lost:
                    await session.executor.close()
                    session.executor = None
                else:
                    await session.executor.jit_warm_up()
                return result.model_copy(update={"session_id": session_id})
            finally:
                session.last_used = time.monotonic()
                if self._sessions.get(session_id) is not session and session.executor is not None:
                    # Reset while this call waited or ran: the sandbox belongs to nobody now.
                    await self._ready_pool.release(session.executor)
                    session.executor = None

    async def _run_in(
        self, executor: Executor, code: str, timeout: float, progress: ProgressReport | None
    ) -> ExecutionResult:
        if progress is None:
            return await executor.run(code, timeout)
        relay = self._relays[executor] = ProgressRelay(progress)
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(relay.report_until_cancelled)
                result = await executor.run(code, timeout)
                group.cancel_scope.cancel()
        finally:
            del self._relays[executor]
        return result

    async def reset(self, session_id: str) -> bool:
        """Forget a session and stop its sandbox; True if it existed."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        if session.executor is not None:
            if session.lock.locked() or self._closing:
                # A running call in it ends as a SandboxCrash; that is what resetting means.
                await session.executor.close()
            else:
                await self._ready_pool.release(session.executor)
                session.executor = None
        return True

    async def expire_idle(self) -> None:
        """Close sessions idle for longer than the TTL, forever (run it in a task)."""
        while True:
            await anyio.sleep(min(SWEEP_INTERVAL, self._settings.session_ttl / 2))
            deadline = time.monotonic() - self._settings.session_ttl
            for session in list(self._sessions.values()):
                if not session.lock.locked() and session.last_used < deadline:
                    logger.info(
                        "session %r expired after %g s idle", session.session_id, self._settings.session_ttl
                    )
                    await self.reset(session.session_id)

    async def close(self) -> None:
        self._closing = True
        for session_id in list(self._sessions):
            await self.reset(session_id)
