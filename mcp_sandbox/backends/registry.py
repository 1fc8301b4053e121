"""The one table of backends. A backend is its module and one `Entry` here: its name, how it is
made from the settings, its one-line summary and its doctor checks. The server, the doctor, the
settings' check of `backend` and DSPy read this table.

Each entry imports its module only when used, so choosing one backend imports no other; this
module imports nothing of them at load, which lets `settings.py` read the names.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mcp_sandbox.checks import Check

if TYPE_CHECKING:
    import anyio.abc

    from mcp_sandbox.backends.base import Backend, ExecutorHooks
    from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)

#: Makes the backend the settings describe and prepares it; raises SandboxStartError when it cannot be had.
Prepare = Callable[["Settings", "ExecutorHooks", "anyio.abc.TaskGroup"], Awaitable["Backend"]]
#: What the doctor checks on this machine for one backend, besides trying it.
DoctorChecks = Callable[["Settings"], Awaitable[Sequence[Check]]]
#: Why the doctor should not try a backend here (None: try it).
Untried = Callable[["Settings"], "str | None"]

#: The name that is no backend: the first of AUTO_ORDER that prepares.
AUTO = "auto"


async def no_checks(settings: Settings) -> Sequence[Check]:
    return ()


def always_tried(settings: Settings) -> str | None:
    return None


@dataclass(frozen=True)
class Entry:
    name: str
    #: One line for `--help`, the docs and the doctor: what runs the code, and how it is kept apart.
    summary: str
    prepare: Prepare
    #: What the doctor tells a user whose machine cannot start it.
    fix: str
    checks: DoctorChecks = no_checks
    untried: Untried = always_tried
    #: False: code runs in the server's own process, on the host, for trusted code only.
    isolated: bool = True
    #: Whether code can reach the hosts MCP_SANDBOX_ALLOW_NET names.
    network: bool = False


#: Every backend by name, in the order the doctor tries them.
BACKENDS: dict[str, Entry] = {}


def register(entry: Entry) -> None:
    """Add a backend to the table; its name must be new."""
    if entry.name == AUTO or entry.name in BACKENDS:
        raise ValueError(f"a backend named {entry.name!r} exists already")
    BACKENDS[entry.name] = entry


def backend_names() -> tuple[str, ...]:
    """Every value MCP_SANDBOX_BACKEND may take."""
    return (AUTO, *BACKENDS)


async def prepare_backend(
    settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup
) -> Backend:
    """The prepared backend the settings name; `auto` tries AUTO_ORDER in turn, saying why it passed
    one over. Raises SandboxStartError when none can be had."""
    from mcp_sandbox.backends.base import SandboxStartError

    if settings.backend != AUTO:
        return await BACKENDS[settings.backend].prepare(settings, hooks, task_group)
    *earlier, last = AUTO_ORDER
    for name, after in zip(earlier, AUTO_ORDER[1:], strict=True):
        try:
            return await BACKENDS[name].prepare(settings, hooks, task_group)
        except SandboxStartError as error:
            logger.warning("using the %s backend: %s", after, error)
    return await BACKENDS[last].prepare(settings, hooks, task_group)


async def _pyodide(settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> Backend:
    from mcp_sandbox.backends.base import SandboxStartError
    from mcp_sandbox.backends.pyodide import PyodideBackend, find_deno

    deno = find_deno(settings)
    if deno is None:
        where = f"at {settings.deno_path}" if settings.deno_path else "(is the `deno` package installed?)"
        raise SandboxStartError(f"the pyodide backend needs Deno, and none was found {where}")
    backend = PyodideBackend(settings, hooks, task_group, deno)
    await backend.prepare()
    return backend


async def _pyodide_checks(settings: Settings) -> Sequence[Check]:
    from mcp_sandbox.backends.pyodide.doctor import checks

    return await checks(settings)


def _pyodide_untried(settings: Settings) -> str | None:
    from mcp_sandbox.backends.pyodide.doctor import untried

    return untried(settings)


async def _subprocess(settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> Backend:
    from mcp_sandbox.backends.subprocess import SubprocessBackend

    backend = SubprocessBackend(settings, hooks, task_group)
    await backend.prepare()
    return backend


async def _subprocess_checks(settings: Settings) -> Sequence[Check]:
    from mcp_sandbox.backends.subprocess.doctor import checks

    return await checks(settings)


async def _inprocess(settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> Backend:
    from mcp_sandbox.backends.inprocess import InProcessBackend

    backend = InProcessBackend(settings, hooks)
    await backend.prepare()
    return backend


for _entry in (
    Entry(
        "pyodide",
        "CPython in WebAssembly (Pyodide) in a Deno process: no host files, no network unless allowed",
        _pyodide,
        "fix the Deno and Pyodide problems above; `mcp-sandbox fetch` shows Deno's own error",
        checks=_pyodide_checks,
        untried=_pyodide_untried,
        network=True,
    ),
    Entry(
        "subprocess",
        "a CPython worker process, in bubblewrap or under Landlock where the machine allows",
        _subprocess,
        f"check that `{sys.executable} -I -c 1` runs and MCP_SANDBOX_MEMORY_MB is not too low",
        checks=_subprocess_checks,
    ),
    Entry(
        "inprocess",
        "a thread in the server's own process, for trusted code only: no isolation",
        _inprocess,
        "reinstall mcp-sandbox; this backend needs nothing but Python",
        isolated=False,
    ),
):
    register(_entry)

#: What `auto` tries, in order: the first that prepares is used.
AUTO_ORDER: tuple[str, ...] = ("pyodide", "subprocess")
