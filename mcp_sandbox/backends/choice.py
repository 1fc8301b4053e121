"""Choosing the backend the settings ask for."""

from __future__ import annotations

import logging

import anyio.abc

from mcp_sandbox.backends.base import Backend, SandboxStartError
from mcp_sandbox.backends.inprocess import InProcessBackend
from mcp_sandbox.backends.pyodide import PyodideBackend, find_deno
from mcp_sandbox.backends.subprocess import SubprocessBackend
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)


def create_backend(settings: Settings, task_group: anyio.abc.TaskGroup) -> Backend:
    """The backend the settings ask for. Raises SandboxStartError when it cannot be had."""
    if settings.backend == "subprocess":
        return SubprocessBackend(settings, task_group)
    if settings.backend == "inprocess":
        return InProcessBackend(settings)
    deno = find_deno(settings)
    if deno is None:
        where = f"at {settings.deno_path}" if settings.deno_path else "(is the `deno` package installed?)"
        raise SandboxStartError(f"the pyodide backend needs Deno, and none was found {where}")
    return PyodideBackend(settings, task_group, deno)


async def prepare_backend(settings: Settings, task_group: anyio.abc.TaskGroup) -> Backend:
    """A prepared backend; `auto` falls back to subprocess, saying why, when pyodide cannot start."""
    try:
        backend = create_backend(settings, task_group)
        await backend.prepare()
    except SandboxStartError as error:
        if settings.backend != "auto":
            raise
        logger.warning("using the subprocess backend: %s", error)
        backend = SubprocessBackend(settings, task_group)
        await backend.prepare()
    return backend
