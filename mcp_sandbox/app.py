"""The core: `App` owns every sandbox and enforces every limit. The MCP server, the Python API,
the command line and DSPy are thin adapters over `App.execute`."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any

import anyio
import anyio.abc

from mcp_sandbox import tracing
from mcp_sandbox.audit import ExecutionRecord
from mcp_sandbox.backends.base import Backend, ExecutorHooks
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.bridge.check import wrong_calls_message
from mcp_sandbox.bridge.config import BridgeConfig, load_bridge_config
from mcp_sandbox.bridge.local import LocalTools
from mcp_sandbox.bridge.upstreams import ToolBridge
from mcp_sandbox.errors import InvalidRequest
from mcp_sandbox.kept import KeptOutputs
from mcp_sandbox.logs import call_context
from mcp_sandbox.metrics import Metrics, Readings
from mcp_sandbox.policy import policy_violation
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.principals import SOLE, output_folder, scoped
from mcp_sandbox.progress import ProgressReport
from mcp_sandbox.quotas import Limits, Quotas
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.settings import Settings
from mcp_sandbox.stopping import CallStopped, stop_on_cancel
from mcp_sandbox.store import Store, StoreError, open_store
from mcp_sandbox.version import __version__

logger = logging.getLogger(__name__)

#: Letters, digits and _.:- with at least one that is not a dot: a session id names a folder.
SESSION_ID_PATTERN = r"^[A-Za-z0-9_.:-]*[A-Za-z0-9_:-][A-Za-z0-9_.:-]*$"
MAX_SESSION_ID_CHARS = 128
#: How long start-up waits for the upstream servers to list their tools (they keep trying after).
BRIDGE_STARTUP_WAIT = 15.0
#: How long /readyz waits for the store to answer.
STORE_CHECK_WAIT = 2.0
#: What /readyz asks the store for: a record no session can have (a session id has no space).
STORE_PROBE = "readyz probe"


def check_request(settings: Settings, code: str, session_id: str | None, timeout: float | None) -> None:
    """The checks every call gets, whichever adapter it came through. Raises InvalidRequest."""
    if len(code) > settings.max_code_chars:
        raise InvalidRequest(
            f"code is {len(code):,} characters long; the limit is {settings.max_code_chars:,} "
            "(MCP_SANDBOX_MAX_CODE_CHARS)"
        )
    if session_id is not None and (
        len(session_id) > MAX_SESSION_ID_CHARS or not re.fullmatch(SESSION_ID_PATTERN, session_id)
    ):
        raise InvalidRequest(
            f"session_id {session_id[:MAX_SESSION_ID_CHARS]!r}: use 1-{MAX_SESSION_ID_CHARS} of "
            "A-Z a-z 0-9 _ . : - (not only dots)"
        )
    if timeout is not None and not timeout > 0:
        raise InvalidRequest(f"timeout must be a positive number of seconds, not {timeout!r}")


class App:
    """Everything that lives as long as the server: the backend, the ready pool, the sessions,
    the tool bridge and the record.

    Kept apart from the MCP transport so that one App serves every client of an HTTP server
    (the SDK starts its lifespan per connection) and the Python API uses it without MCP.
    """

    def __init__(self, settings: Settings, tools: Mapping[str, Callable[..., Any]] | None = None) -> None:
        """`tools`: host callables code may call as `tools.local.<name>(...)` (the Python API).
        Raises ValueError for a tool name that is not a Python identifier."""
        self.settings = settings
        self._local = LocalTools(tools, settings.bridge_call_timeout) if tools is not None else None
        self._stack = AsyncExitStack()
        self._backend: Backend | None = None
        self._pool: ReadyPool | None = None
        self._sessions: Sessions | None = None
        self._store: Store | None = None
        #: This App's Prometheus metrics (served at /metrics over HTTP).
        self.metrics = Metrics()
        self.bridge: ToolBridge | None = None
        self.record = ExecutionRecord(settings.audit_log, settings.save_code)
        #: Each principal's limits: its running calls and calls a minute here, its sessions and
        #: live sandboxes in Sessions.
        self.quotas = Quotas(Limits.from_settings(settings))
        #: The whole of cut outputs, behind the links results carry.
        self.kept = KeptOutputs(
            int(settings.max_kept_output_mb * 2**20),
            settings.session_ttl,
            lambda session_id: self._sessions is not None and self._sessions.has(session_id),
        )

    @property
    def backend(self) -> Backend:
        assert self._backend is not None, "App is not started"
        return self._backend

    @property
    def sessions(self) -> Sessions:
        assert self._sessions is not None, "App is not started"
        return self._sessions

    async def __aenter__(self) -> App:
        store = await self._stack.enter_async_context(open_store(self.settings))  # first in, last out
        task_group = await self._stack.enter_async_context(anyio.create_task_group())
        self._stack.push_async_callback(self._stop, task_group)
        try:
            if self.settings.bridge_config is not None or self._local is not None:
                config = BridgeConfig()
                if self.settings.bridge_config is not None:
                    config = load_bridge_config(self.settings.bridge_config)
                self.bridge = ToolBridge(config, self.settings.bridge_call_timeout, self._local)
                await self.bridge.start(task_group, wait=BRIDGE_STARTUP_WAIT)
            hooks = ExecutorHooks(tools=self.bridge)
            self._backend = await prepare_backend(self.settings, hooks, task_group)
        except BaseException:
            await self._stack.aclose()
            raise
        self._pool = ReadyPool(
            self._backend.start,
            size=self.settings.pool_size,
            task_group=task_group,
            acquire_timeout=self.settings.acquire_timeout,
            recycle=self.settings.recycle and self._backend.recycles,
            metrics=self.metrics,
        )
        self._pool.fill()
        self._backend.start_background_work()
        sessions = Sessions(
            self.settings,
            self._pool,
            backend=self._backend,
            store=store,
            task_group=task_group,
            quotas=self.quotas,
            metrics=self.metrics,
        )
        self._sessions, self._store = sessions, store
        pool, name = self._pool, self._backend.name
        self.metrics.read(
            Readings(sessions.counts, lambda: len(pool.ready), lambda: pool.waiting, lambda: name)
        )
        task_group.start_soon(sessions.expire_idle)
        task_group.start_soon(sessions.hibernate_idle)
        task_group.start_soon(sessions.move_out)
        task_group.start_soon(sessions.renew_leases)
        task_group.start_soon(sessions.answer_asks)
        logger.info(
            "mcp-sandbox %s: %s backend, %d sandboxes kept ready",
            __version__,
            self._backend.name,
            self.settings.pool_size,
        )
        return self

    @tracing.traced("mcp_sandbox.execute")
    async def execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
        principal: str = SOLE,
    ) -> ExecutionResult:
        """`_execute`, counted in the metrics, its log lines carrying its session and call ids. A
        caller that goes away (its task cancelled: a cancelled MCP request) stops the program as
        its timeout would, and the session settles before the cancel goes on (stopping.py)."""
        with self.metrics.call(self.backend.name) as call, call_context(session_id):
            result = await stop_on_cancel(
                lambda stop: self._execute(
                    code,
                    timeout=timeout,
                    session_id=session_id,
                    progress=progress,
                    principal=principal,
                    stop=stop,
                )
            )
            call.ended(result)
            logger.debug("call ended: %s in %d ms", call.outcome, result.duration_ms)
        return result

    async def _execute(
        self,
        code: str,
        *,
        timeout: float | None = None,
        session_id: str | None = None,
        progress: ProgressReport | None = None,
        principal: str = SOLE,
        stop: anyio.Event | None = None,
    ) -> ExecutionResult:
        """Check the call, run the code (the policy first, when it is on), keep the record and
        copy output files out. The session is `principal`'s own: another principal's session of
        the same name is another session.

        Raises InvalidRequest for arguments over a limit, PoolUnavailable or
        SessionLimitReached when no sandbox can be had, SessionElsewhere when another
        instance sharing the state folder runs the session, and PrincipalLimitReached when
        `principal` is at one of its own limits (MCP_SANDBOX_PRINCIPAL_*).
        """
        settings = self.settings
        check_request(settings, code, session_id, timeout)
        key = scoped(principal, session_id) if session_id is not None else None
        with self.quotas.call(principal):
            if (reason := self.refusal(code)) is not None:
                result = ExecutionResult.failure("Rejected", reason, backend=self.backend.name)
            else:
                try:
                    result = await self.sessions.run(
                        code,
                        timeout=settings.clamp_timeout(timeout),
                        session_id=key,
                        progress=progress,
                        principal=principal,
                        stop=stop,
                    )
                except CallStopped:
                    result = ExecutionResult.failure(
                        "Cancelled",
                        "Cancelled by its caller before it started; nothing ran.",
                        backend=self.backend.name,
                    )
                if notes := self.backend.notes_for(result):
                    result = result.model_copy(update={"notes": [*result.notes, *notes]})
        result = result.model_copy(update={"session_id": session_id})  # the caller's own name for it
        self.kept.keep(result, principal, key)
        if settings.output_dir is not None and result.files:
            folder = output_folder(settings.output_dir, principal, many=settings.many_principals)
            await anyio.to_thread.run_sync(result.save_files, folder)
        await self.record.add(code, result, principal)
        return result

    def refusal(self, code: str) -> str | None:
        """Why `code` is refused before it runs, or None: the strict policy, when it is on, and
        tool calls the catalog says cannot work (a misspelt server, tool or keyword)."""
        if self.settings.policy == "strict" and (reason := policy_violation(code)) is not None:
            return reason
        if self.bridge is not None and (wrong := self.bridge.wrong_calls(code)):
            return wrong_calls_message(wrong)
        return None

    async def readiness(self) -> str | None:
        """Why a call could not be served now, or None: a sandbox cannot be had (the ready pool's
        health), or the store does not answer within STORE_CHECK_WAIT seconds."""
        if self._pool is None or self._store is None:
            return "the server is starting"
        if (problem := self._pool.health()) is not None:
            return problem
        try:
            with anyio.fail_after(STORE_CHECK_WAIT):
                await self._store.read_record(STORE_PROBE)
        except TimeoutError:
            return f"the store did not answer within {STORE_CHECK_WAIT:g} s"
        except StoreError as error:
            return f"the store does not answer: {error}"
        return None

    async def reset_session(self, session_id: str, principal: str = SOLE) -> bool:
        """Drop `principal`'s session and stop its sandbox; False when there was none. Raises
        InvalidRequest."""
        check_request(self.settings, "", session_id, None)
        key = scoped(principal, session_id)
        existed = await self.sessions.reset(key)
        self.kept.forget_session(key)
        return existed

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stack.aclose()

    async def _stop(self, task_group: anyio.abc.TaskGroup) -> None:
        with anyio.CancelScope(shield=True):
            if self._sessions is not None:
                await self._sessions.close()
            if self._pool is not None:
                await self._pool.close()
            if self._backend is not None:
                await self._backend.close()
        task_group.cancel_scope.cancel()
