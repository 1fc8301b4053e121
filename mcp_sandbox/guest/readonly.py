"""The data/ folder made read-only to Python's file functions, by an audit hook."""

from __future__ import annotations

import os
import sys
from typing import Any

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_CHANGES = {
    "os.remove": 1,
    "os.rmdir": 1,
    "os.mkdir": 1,
    "os.chmod": 1,
    "os.chown": 1,
    "os.truncate": 1,
    "os.utime": 1,
    "os.rename": 2,
    "os.link": 2,
    "os.symlink": 2,
}


def protect_read_only(folder: str) -> None:
    """Refuse, from now on, every write to `folder` made through Python's file functions.

    An audit hook: it stops a program's mistakes and ordinary writes, not a determined one
    (ctypes can make system calls directly). The CPython backends are not walls (see docs/security.md).
    """
    root = os.path.realpath(folder)

    def inside(path: Any) -> bool:
        if isinstance(path, int) or path is None:
            return False
        real = os.path.realpath(os.fsdecode(path))
        return real == root or real.startswith(root + os.sep)

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS
            )
            if writes and inside(path):
                raise PermissionError(f"data/ is read-only: cannot write {os.fsdecode(path)}")
        elif event in _CHANGES and any(inside(arg) for arg in args[: _CHANGES[event]]):
            raise PermissionError(f"data/ is read-only: {event} refused")

    sys.addaudithook(hook)
