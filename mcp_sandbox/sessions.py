"""Sessions: named sandboxes whose variables persist from call to call until they expire."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.bridge.upstreams import ToolBridge
from mcp_sandbox.pool import WarmPool
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

#: How often idle sessions are looked for, at most.
SWEEP_INTERVAL = 5.0


#: Seconds between progress reports of a running call.
PROGRESS_INTERVAL = 1.0

#: Receives (seconds elapsed, latest line of output) while a call runs.
ProgressReport = Callable[[float, str | None], Awaitable[None]]


async def _report_progress(executor: Executor, progress: ProgressReport) -> None:
    started = time.monotonic()
    while True:
        await anyio.sleep(PROGRESS_INTERVAL)
        try:
            await progress(time.monotonic() - started, executor.latest_line)
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
    """Runs code in sessions. Owns every executor that is handed out of the warm pool.

    A call without a session id gets a fresh sandbox from the warm pool, which is discarded
    afterwards, so nothing it did can reach a later call. A session keeps its sandbox; calls in
    one session run one at a time, calls in different sessions run side by side.
    """

    def __init__(
        self, pool: WarmPool, settings: Settings, backend: str, bridge: ToolBridge | None = None
    ) -> None:
        self._pool = pool
        self._settings = settings
        self._backend = backend
        self._bridge = bridge
        self._sessions: dict[str, Session] = {}

    @property
    def session_ids(self) -> list[str]:
        return list(self._sessions)

    async def run(
        self,
        code: str,
        *,
        timeout: float,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
    ) -> ExecutionResult:
        if session_id is None:
            executor = await self._pool.acquire()
            try:
                return await self._run_in(executor, code, timeout, progress)
            finally:
                await executor.close()
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
                    session.executor = await self._pool.acquire()
                result = await self._run_in(session.executor, code, timeout, progress)
                if result.session_lost:
                    await session.executor.close()
                    session.executor = None
                else:
                    await session.executor.warm_up()
                return result.model_copy(update={"session_id": session_id})
            finally:
                session.last_used = time.monotonic()
                if self._sessions.get(session_id) is not session and session.executor is not None:
                    # Reset while this call waited or ran: the sandbox belongs to nobody now.
                    await session.executor.close()

    async def _run_in(
        self, executor: Executor, code: str, timeout: float, progress: ProgressReport | None
    ) -> ExecutionResult:
        if progress is None:
            return await self._run(executor, code, timeout)
        async with anyio.create_task_group() as group:
            group.start_soon(_report_progress, executor, progress)
            result = await self._run(executor, code, timeout)
            group.cancel_scope.cancel()
        return result

    async def _run(self, executor: Executor, code: str, timeout: float) -> ExecutionResult:
        return await executor.run(
            code,
            timeout=timeout,
            grace=self._settings.interrupt_grace,
            max_output_chars=self._settings.max_output_chars,
            bridge=self._bridge,
            max_tool_calls=self._settings.bridge_max_calls,
            output=self._settings.output_limits(),
        )

    async def reset(self, session_id: str) -> bool:
        """Forget a session and stop its sandbox; True if it existed."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        if session.executor is not None:
            # A running call in it ends as a SandboxCrash; that is what resetting means.
            await session.executor.close()
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
        for session_id in list(self._sessions):
            await self.reset(session_id)
