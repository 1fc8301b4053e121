"""The Python API: the sandbox without MCP, for programs that embed it.

async with Sandbox(backend="pyodide") as sandbox:
    result = await sandbox.run("x = 21 * 2; x", session_id="s")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from mcp_sandbox.app import App
from mcp_sandbox.bridge.local import LocalTools
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.settings import BackendName, Settings


class Sandbox:
    """One `App` (backend, ready pool, sessions, tool bridge) driven from Python.

    Keyword arguments are settings (`timeout=10`, `pool_size=1`, `data_dir=...`), as the
    `MCP_SANDBOX_*` variables name them; they win over the environment and `.env`.
    """

    def __init__(
        self,
        backend: BackendName | None = None,
        *,
        settings: Settings | None = None,
        tools: Mapping[str, Callable[..., Any]] | None = None,
        **options: Any,
    ) -> None:
        """`tools` maps names to host callables (sync or async) that code calls as
        `tools.local.<name>(**arguments)`, with JSON data in and out, under the bridge's per-call
        timeout and call limit; a callable that raises gives the code a ToolError."""
        if backend is not None:
            options["backend"] = backend
        if settings is not None:
            self.settings = settings.model_copy(update=options) if options else settings
        else:
            self.settings = Settings(**options)
        self._tools = tools
        self._app: App | None = None

    @property
    def backend(self) -> str:
        """The backend in use (`auto` resolved): pyodide, subprocess or inprocess."""
        return self._started().backend.name

    async def __aenter__(self) -> Sandbox:
        app = App(self.settings, self._tools)
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

        Errors in the code are in the result (`success`, `error_type`), never raised. A call the
        server will not run raises a `Refused` (mcp_sandbox.errors), with the tool's message:
        InvalidRequest (also a ValueError) for code, a session id or a timeout over a limit,
        PoolUnavailable or SessionLimitReached when no sandbox can be had, and SessionElsewhere
        when another instance sharing the state store runs the session.
        """
        return await self._started().execute(code, timeout=timeout, session_id=session_id)

    def set_tools(self, tools: Mapping[str, Callable[..., Any]]) -> None:
        """Replace the local tools (the Sandbox must have been made with `tools=`, even `{}`);
        every session sees the new set from its next run. Call it from the Sandbox's event loop."""
        bridge = self._started().bridge
        if bridge is None or bridge.local is None:
            raise RuntimeError("make the Sandbox with tools=... (even {}) to use local tools")
        bridge.set_local_tools(LocalTools(tools, self.settings.bridge_call_timeout))

    def read_output(self, uri: str) -> str:
        """The whole of a cut stdout or stderr from the link a result carries (`stdout_uri`), or
        lines of it (`?first=N&last=M`). Raises KeptOutputMissing, or ValueError for a bad link."""
        return self._started().kept.read_uri(uri)

    async def reset(self, session_id: str) -> bool:
        """Drop a session and stop its sandbox; False when there was none."""
        return await self._started().reset_session(session_id)

    def _started(self) -> App:
        if self._app is None:
            raise RuntimeError("use the Sandbox in `async with Sandbox(...) as sandbox:`")
        return self._app
