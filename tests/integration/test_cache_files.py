"""The Pyodide backend's cache folder over time (pyodide): a server removes the snapshots and
code caches no server has used for a week, and makes its own again if they were removed under
it. Real Deno runner, real Pyodide, a cache folder of the test's own; no MCP."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.backends.base import ExecutorHooks
from mcp_sandbox.backends.pyodide.cache_files import UNUSED_FOR
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings
from tests.helpers import computes_once, pyodide_in_own_cache

pytestmark = pytest.mark.anyio


def planted(folder: Path, name: str, age: float) -> Path:
    path = folder / name
    path.write_bytes(b"an old server's file")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


async def test_old_files_go_at_prepare_and_a_removed_snapshot_is_made_again(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    settings = await pyodide_in_own_cache(
        cache, Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    )
    old = planted(cache, "pyodide-0.29.5-000000000000.snapshot", UNUSED_FOR + 3600)
    old_cache = planted(cache, "pyodide-0.29.5-000000000000-111-222.jscache", UNUSED_FOR + 3600)
    recent = planted(cache, "pyodide-0.28.0-333333333333.snapshot", 3600)
    caplog.set_level(logging.INFO, logger="mcp_sandbox.backends.pyodide")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        snapshot: Path = backend._snapshot  # type: ignore[attr-defined]
        assert snapshot is not None and snapshot.is_file(), "the backend made no snapshot"
        assert not old.exists() and not old_cache.exists(), sorted(path.name for path in cache.iterdir())
        assert recent.exists(), "a file another server used an hour ago was removed"
        snapshot.unlink()  # as another server's sweep would, after a week without a start here
        await computes_once(backend, task_group)
    assert snapshot.is_file(), "the removed snapshot was not made again"
    said = [record.getMessage() for record in caplog.records]
    assert any("removed 2 old Pyodide" in message for message in said), said
    assert any("was removed: making it again" in message for message in said), said
