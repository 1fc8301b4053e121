"""The Python API: the sandbox without MCP, for programs that embed it.

async with Sandbox(backend="pyodide") as sandbox:
    result = await sandbox.run("x = 21 * 2; x", session_id="s")
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any

from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.server import SESSION_ID_PATTERN, App
from mcp_sandbox.settings import BackendName, Settings


class Sandbox:
    """One `App` (backend, warm pool, sessions, tool bridge) driven from Python.

    Keyword arguments are settings (`timeout=10`, `pool_size=1`, `data_dir=...`), as the
    `MCP_SANDBOX_*` variables name them; they win over the environment and `.env`.
    """

    def __init__(
        self, backend: BackendName | None = None, *, settings: Settings | None = None, **options: Any
    ) -> None:
        if backend is not None:
            options["backend"] = backend
        if settings is not None:
            self.settings = settings.model_copy(update=options) if options else settings
        else:
            self.settings = Settings(**options)
        self._app: App | None = None

    @property
    def backend(self) -> str:
        """The backend in use (`auto` resolved): pyodide, subprocess or inprocess."""
        return self._started().backend.name

    async def __aenter__(self) -> Sandbox:
        app = App(self.settings)
        await app.__aenter__()
        self._app = app
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        app, self._app = self._app, None
        if app is not None:
            await app.__aexit__(exc_type, exc, tb)

    async def run(
        self, code: str, *, session_id: str | None = None, timeout: float | None = None
    ) -> ExecutionResult:
        """Run code, exactly as the `execute_python` tool does: same limits, same result.

        Errors in the code are in the result (`success`, `error_type`), never raised. Raises
        PoolUnavailable or SessionLimitReached when no sandbox can be had.
        """
        if session_id is not None and (len(session_id) > 128 or not re.match(SESSION_ID_PATTERN, session_id)):
            raise ValueError(f"session_id {session_id!r}: use 1-128 of A-Z a-z 0-9 _ . : - (not only dots)")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, not {timeout!r}")
        return await self._started().execute(code, timeout=timeout, session_id=session_id)

    async def reset(self, session_id: str) -> bool:
        """Drop a session and stop its sandbox; False when there was none."""
        return await self._started().sessions.reset(session_id)

    def _started(self) -> App:
        if self._app is None:
            raise RuntimeError("use the Sandbox in `async with Sandbox(...) as sandbox:`")
        return self._app
