"""The Pyodide backend's files in its cache folder: those unused for a week, or left part-made for
a day, are removed; the server's own, and any another server still uses, stay."""

from __future__ import annotations

import os
import time
from pathlib import Path

from mcp_sandbox.backends.pyodide.cache_files import LEFT_FOR, TOUCH_EVERY, UNUSED_FOR, sweep, touch

NOW = 2_000_000_000.0


def made(folder: Path, name: str, age: float) -> Path:
    path = folder / name
    path.write_bytes(b"x" * 10)
    os.utime(path, (NOW - age, NOW - age))
    return path


def test_files_unused_for_a_week_go_and_the_servers_own_stay(tmp_path: Path) -> None:
    own = made(tmp_path, "pyodide-0.29.5-aaaaaaaaaaaa.snapshot", UNUSED_FOR * 3)
    own_cache = made(tmp_path, "pyodide-0.29.5-aaaaaaaaaaaa-bbb-ccc.jscache", UNUSED_FOR * 3)
    stale = made(tmp_path, "pyodide-0.29.5-dddddddddddd.snapshot", UNUSED_FOR + 60)
    stale_cache = made(tmp_path, "pyodide-0.28.0-eeeeeeeeeeee-fff-000.jscache", UNUSED_FOR + 60)
    in_use = made(tmp_path, "pyodide-0.29.5-111111111111.snapshot", UNUSED_FOR - 60)
    left = made(tmp_path, "pyodide-0.29.5-222222222222.123-abcd.part", LEFT_FOR + 60)
    left_sources = made(tmp_path, "pyodide-0.29.5-222222222222.123-abcd.guest.json", LEFT_FOR + 60)
    being_made = made(tmp_path, "pyodide-0.29.5-333333333333.456-ef01.part", 60)
    other = made(tmp_path, "notes.snapshot", UNUSED_FOR * 3)

    removed = sweep(tmp_path, keep=[own, own_cache, None], now=NOW)

    assert sorted(removed) == sorted([stale, stale_cache, left, left_sources])
    assert all(not path.exists() for path in removed)
    assert all(path.exists() for path in (own, own_cache, in_use, being_made, other))


def aged(path: Path, age: float) -> Path:
    path.write_bytes(b"x")
    os.utime(path, (time.time() - age, time.time() - age))
    return path


def test_a_use_makes_a_file_new_again_at_most_once_a_day(tmp_path: Path) -> None:
    used = aged(tmp_path / "pyodide-0.29.5-aaaaaaaaaaaa.snapshot", UNUSED_FOR * 2)
    recent = aged(tmp_path / "pyodide-0.29.5-aaaaaaaaaaaa-bbb-ccc.jscache", TOUCH_EVERY / 2)
    before = recent.stat().st_mtime
    touch(used, recent, None, tmp_path / "pyodide-gone.jscache")  # a missing one is not made
    assert time.time() - used.stat().st_mtime < 60
    assert recent.stat().st_mtime == before, "a file used within the day was marked again"
    assert not (tmp_path / "pyodide-gone.jscache").exists()
    assert sweep(tmp_path, keep=[]) == []
