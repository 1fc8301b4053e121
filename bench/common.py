"""What the benchmarks share: the process tree under a server, and writing a run's results."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import anyio
import anyio.abc


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def wait_for_port(port: int, limit: float = 60.0, process: anyio.abc.Process | None = None) -> None:
    """Once something accepts connections on 127.0.0.1:`port` (at most `limit` seconds); raises
    RuntimeError if `process`, the server meant to listen there, exits first."""
    with anyio.fail_after(limit):
        while True:
            if process is not None and process.returncode is not None:
                raise RuntimeError(f"the server exited with {process.returncode}")
            try:
                stream = await anyio.connect_tcp("127.0.0.1", port)
            except OSError:
                await anyio.sleep(0.1)
            else:
                await stream.aclose()
                return
