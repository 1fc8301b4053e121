"""A call's progress, reported at a steady pace: what it waits for until its program runs, then
how long it has run and the latest line the program printed."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)

#: Receives (seconds since the call came, what it is doing) while a call waits or runs.
ProgressReport = Callable[[float, str], Awaitable[None]]


class ProgressRelay:
    """Reports a call's progress every `interval` seconds, so a client waiting on it hears that
    it is alive and what it is doing: what it waits for (a sandbox, the session's running call)
    until its program runs, then how long that has run, with the latest line it printed (pushed
    by the executor)."""

    def __init__(self, report: ProgressReport, interval: float) -> None:
        self._report = report
        self._interval = interval
        self._came = time.monotonic()
        self._waiting_for = "a sandbox"
        self._running_since: float | None = None
        self._line: str | None = None

    def waiting(self, what: str) -> None:
        """The call waits for `what` (words after "waiting for")."""
        self._waiting_for, self._running_since = what, None

    def running(self) -> None:
        """The program starts: from now on its time and output are the news."""
        self._running_since, self._line = time.monotonic(), None

    def push(self, line: str) -> None:
        self._line = line

    def message(self) -> str:
        now = time.monotonic()
        if self._running_since is None:
            return f"waiting for {self._waiting_for} ({now - self._came:.0f} s)"
        said = f"running for {now - self._running_since:.0f} s"
        return said + (f"; last output: {self._line}" if self._line else "")

    async def report_until_cancelled(self, stop: anyio.Event) -> None:
        while True:
            await anyio.sleep(self._interval)
            if stop.is_set():
                return  # the caller went away: nobody to tell
            try:
                await self._report(time.monotonic() - self._came, self.message())
            except Exception as error:  # noqa: BLE001 - a client that cannot take progress still gets its result
                logger.debug("progress report failed: %s", error)
                return
