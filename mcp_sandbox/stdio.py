"""The stdio wire's input, read without a thread, so a signal can stop the server at once.

The SDK reads stdin in a worker thread that no cancel reaches: a server stopped by SIGINT or
SIGTERM would wait for its client's next line before it could close its sessions and sandboxes.
Here the wire's lines come from the event loop, which a cancel interrupts.
"""

from __future__ import annotations

import codecs
import os
import select
import stat
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import anyio

CHUNK = 1 << 16


@contextmanager
def wire_stdin() -> Iterator[AsyncIterator[str] | None]:
    """The lines of fd 0, while fd 0 itself points at the null device (so sandboxes and the
    programs of the in-process backend read EOF, never the wire, as the SDK's own transport does).
    None when fd 0 cannot be polled (a regular file, the null device): the SDK's reader, which
    blocks only briefly on those, serves instead."""
    if not _pollable(0):
        yield None
        return
    wire = os.dup(0)
    os.set_inheritable(wire, False)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
    finally:
        os.close(null)
    try:
        yield _lines(wire)
    finally:
        os.dup2(wire, 0)
        os.close(wire)


def _pollable(fd: int) -> bool:
    """Whether the event loop can wait on `fd`: as epoll says on Linux; elsewhere a pipe or a
    socket only (what MCP clients give), and nothing on Windows, whose loop waits on no pipe."""
    if not hasattr(select, "epoll"):
        mode = os.fstat(fd).st_mode
        return sys.platform != "win32" and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode))
    poller = select.epoll()
    try:
        poller.register(fd, select.EPOLLIN)
    except OSError:
        return False
    finally:
        poller.close()
    return True


async def _lines(fd: int) -> AsyncIterator[str]:
    """Each line with its newline (the last one may lack it), decoded as UTF-8 with replacement."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending: list[str] = []
    while True:
        await anyio.wait_readable(fd)
        data = os.read(fd, CHUNK)  # readable, so this does not block
        *complete, rest = decoder.decode(data, final=not data).split("\n")
        for line in complete:
            yield "".join([*pending, line, "\n"])
            pending = []
        if rest:
            pending.append(rest)
        if not data:
            if pending:
                yield "".join(pending)
            return
