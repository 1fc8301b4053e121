"""What the benchmarks share: the process tree under a server, and writing a run's results."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def children() -> dict[int, list[int]]:
    """Every process's children, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(parent, []).append(int(entry))
    return tree


def save(results: dict[str, Any], path: Path, table: str) -> None:
    """Print the run's table and write its results as JSON."""
    print(table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {path}")
