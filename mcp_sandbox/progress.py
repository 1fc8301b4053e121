"""A running call's progress: reported at a steady pace with the latest line its program printed."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import anyio

logger = logging.getLogger(__name__)

#: Receives (seconds elapsed, latest line of output) while a call runs.
ProgressReport = Callable[[float, str | None], Awaitable[None]]


class ProgressRelay:
    """Reports a running call's progress every `interval` seconds, with the latest line its
    program printed (pushed by the executor), so a client waiting on a long computation hears
    that it runs, and what it last said, at a steady pace."""

    def __init__(self, report: ProgressReport, interval: float) -> None:
        self._report = report
        self._interval = interval
        self._line: str | None = None

    def push(self, line: str) -> None:
        self._line = line

    async def report_until_cancelled(self, stop: anyio.Event) -> None:
        started = time.monotonic()
        while True:
            await anyio.sleep(self._interval)
            if stop.is_set():
                return  # the caller went away: nobody to tell
            try:
                await self._report(time.monotonic() - started, self._line)
            except Exception as error:  # noqa: BLE001 - a client that cannot take progress still gets its result
                logger.debug("progress report failed: %s", error)
                return
