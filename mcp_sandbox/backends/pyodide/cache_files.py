"""The files the Pyodide backend makes in its cache folder, and their end.

A memory snapshot (25 MB) and a code cache (1 MB) are named by what they were made from: Pyodide,
the runner, the guest runtime, Deno and V8's flags. Each upgrade or change names new ones, and the
old ones would stay forever. So a server that prepares the backend removes those no server has
used for `UNUSED_FOR`; every use refreshes a file's time (`touch`), so a server of another version
that shares the folder keeps its own for as long as it starts sandboxes.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from mcp_sandbox.backends.watch import MB

logger = logging.getLogger(__name__)

#: A snapshot or code cache unused this long is removed.
UNUSED_FOR = 7 * 24 * 3600.0
#: A file in use is marked used again once this long has passed since it last was.
TOUCH_EVERY = 24 * 3600.0
#: A part-made file this old was left by a server that died while making it.
LEFT_FOR = 24 * 3600.0

#: (pattern, age past which a file is removed): the made files, then what making them leaves.
SWEPT = (
    ("pyodide-*.snapshot", UNUSED_FOR),
    ("pyodide-*.jscache", UNUSED_FOR),
    ("pyodide-*.part", LEFT_FOR),
    ("pyodide-*.guest.json", LEFT_FOR),
)


def touch(*paths: Path | None) -> None:
    """Mark these files used now (a missing one is not made): at most once a day, since a new time
    makes running processes read the snapshot whole where its birth time is unknown (worker.ts)."""
    now = time.time()
    for path in paths:
        if path is not None:
            try:
                if now - path.stat().st_mtime > TOUCH_EVERY:
                    os.utime(path)
            except OSError:
                pass  # gone, or read-only: the next prepare makes it again


def sweep(folder: Path, keep: Iterable[Path | None], now: float | None = None) -> list[Path]:
    """Remove the backend's files in `folder` unused past their age, except `keep`; the removed."""
    kept = {path for path in keep if path is not None}
    now = time.time() if now is None else now
    removed: list[Path] = []
    freed = 0
    for pattern, age in SWEPT:
        for path in folder.glob(pattern):
            if path in kept:
                continue
            try:
                status = path.stat()
                if now - status.st_mtime < age:
                    continue
                path.unlink()
            except OSError:
                continue  # another server removed it first, or it cannot be removed
            removed.append(path)
            freed += status.st_size
    if removed:
        logger.info(
            "removed %d old Pyodide snapshot and code cache files (%.0f MB) from %s",
            len(removed),
            freed / MB,
            folder,
        )
    return removed
