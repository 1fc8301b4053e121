"""What the server logs about a client's own tool call, sent to that client as MCP log messages.

While a tool call runs (`forwarding`), the records the `mcp_sandbox` loggers emit in the task
serving it (a sandbox killed after ignoring its interrupt, a store that refused the call's record)
go to its client as `notifications/message` on the call's own stream, with the logger's name,
when at or above the level the client asked for:

- protocol 2025-11-25 and before: the level its MCP session set with `logging/setLevel`
  (`set_level`), kept with that session alone; until it sets one, it gets none;
- 2026-07-28: `logging/setLevel` is gone (SEP-2577; the SDK answers -32601) and each request opts
  in with `_meta["io.modelcontextprotocol/logLevel"]`, read by the SDK's `allowed_log_levels`.

A record goes to a call only when emitted in the task that serves it: never one from another
call, another client, a worker thread, or a task started along the way (the ready pool, a
checkpoint, a lease renewal), which inherits the call's context but not its task. Only what the
server logs at all is seen (MCP_SANDBOX_LOG_LEVEL). A logging handler cannot await, so records
pass through a bounded queue to a sender task the call owns; one that finds the queue full is
dropped and counted in the call's last message, so a slow client never holds a call up. At its
end a call waits at most FLUSH_S for what is queued to go out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, get_args

import anyio
from mcp.server.connection import Connection, allowed_log_levels
from mcp.server.context import ServerRequestContext
from mcp.types import (
    EmptyResult,
    LoggingLevel,
    LoggingMessageNotification,
    LoggingMessageNotificationParams,
    SetLevelRequestParams,
)
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

#: MCP's levels, least severe first (RFC 5424's order, as the SDK's literal declares them).
LEVELS: tuple[LoggingLevel, ...] = get_args(LoggingLevel)
#: Records one call may have waiting to be sent; more are dropped, and counted.
QUEUE_SIZE = 100
#: Seconds a call's end waits for its queued records to reach the client.
FLUSH_S = 0.5
#: Where a session's level is kept in the SDK's per-connection state.
LEVEL_KEY = "mcp_sandbox.client_log.level"
#: The loggers whose records are forwarded: this package's.
ROOT_LOGGER = __name__.partition(".")[0]


@dataclass(frozen=True)
class LogEntry:
    """One log message for the client: its MCP level, the logger that wrote it, and its text."""

    level: LoggingLevel
    logger: str
    message: str


#: Sends one entry to the call's client.
Send = Callable[[LogEntry], Awaitable[None]]


#: Python's logging levels as MCP's, most severe first; below INFO is debug.
_MCP_LEVEL_FROM: tuple[tuple[int, LoggingLevel], ...] = (
    (logging.CRITICAL, "critical"),
    (logging.ERROR, "error"),
    (logging.WARNING, "warning"),
    (logging.INFO, "info"),
)


def mcp_level(levelno: int) -> LoggingLevel:
    return next((level for floor, level in _MCP_LEVEL_FROM if levelno >= floor), "debug")


def at_least(level: LoggingLevel, threshold: LoggingLevel) -> bool:
    return LEVELS.index(level) >= LEVELS.index(threshold)


async def set_level(ctx: ServerRequestContext[Any], params: SetLevelRequestParams) -> EmptyResult:
    """`logging/setLevel`: the least severe level this MCP session's later calls are told of."""
    _session_state(ctx)[LEVEL_KEY] = params.level
    return EmptyResult()


def requested_level(ctx: ServerRequestContext[Any]) -> LoggingLevel | None:
    """The least severe level the request's client asked to hear of (None: it asked for none)."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return min(allowed_log_levels(ctx.protocol_version, ctx.meta), key=LEVELS.index, default=None)
    level: LoggingLevel | None = _session_state(ctx).get(LEVEL_KEY)
    return level


def _session_state(ctx: ServerRequestContext[Any]) -> dict[str, Any]:
    """The SDK's scratch state for this request's MCP session: `Connection.state`, one per client
    connection (per request on stateless HTTP), which the request context does not expose yet."""
    connection: Connection = ctx.session._connection
    return connection.state


@asynccontextmanager
async def forwarding(ctx: ServerRequestContext[Any]) -> AsyncIterator[None]:
    """The block's log records about this call go to its client, as `requested_level` allows."""

    async def send(entry: LogEntry) -> None:
        # The SDK's send_log_message sends the same, but warns of SEP-2577 at each use; whether to
        # send at all is requested_level's, which at 2026-07-28 is the SDK's own gate.
        params = LoggingMessageNotificationParams(level=entry.level, logger=entry.logger, data=entry.message)
        await ctx.session.send_notification(
            LoggingMessageNotification(params=params), related_request_id=ctx.request_id
        )

    async with forwarding_to(send, requested_level(ctx)):
        yield


@asynccontextmanager
async def forwarding_to(send: Send, threshold: LoggingLevel | None) -> AsyncIterator[None]:
    """The block's records at or above `threshold` go to `send`, emitted in this task only
    (None: nothing is sent, and nothing is started)."""
    if threshold is None:
        yield
        return
    call = _CallLog(threshold)
    failed: Exception | None = None
    async with anyio.create_task_group() as sending:
        # Started before the call's log is set, so the sender's own records never loop back to it.
        sending.start_soon(call.send_all, send)
        token = _current.set(call)
        try:
            yield
        except Exception as raised:  # noqa: BLE001 - raised below, outside the group (unwrapped)
            failed = raised
        finally:
            _current.reset(token)
            call.close()
            sending.cancel_scope.deadline = min(sending.cancel_scope.deadline, anyio.current_time() + FLUSH_S)
    if failed is not None:
        raise failed


class _CallLog:
    """One call's records on their way to its client."""

    def __init__(self, threshold: LoggingLevel) -> None:
        self._threshold = threshold
        self._task = _running_task()
        self._queue, self._queued = anyio.create_memory_object_stream[LogEntry](QUEUE_SIZE)
        #: Records that found the queue full.
        self.dropped = 0

    def offer(self, record: logging.LogRecord) -> None:
        """Queue `record` if this call's task emitted it at a level its client asked for; never blocks."""
        if _running_task() is not self._task:
            return
        level = mcp_level(record.levelno)
        if not at_least(level, self._threshold):
            return
        try:
            self._queue.send_nowait(LogEntry(level, record.name, record.getMessage()))
        except anyio.WouldBlock:
            self.dropped += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the call has ended, or its client stopped taking messages

    def close(self) -> None:
        """No more records: the sender sends what is queued, then the count of those dropped."""
        self._queue.close()

    async def send_all(self, send: Send) -> None:
        """Send each queued entry, in order, then say how many were dropped; a client that
        cannot take one gets no more."""
        with self._queued:
            try:
                async for entry in self._queued:
                    await send(entry)
                if self.dropped:
                    await send(self._dropped_note())
            except Exception:  # noqa: BLE001 - the call goes on without its log messages
                return

    def _dropped_note(self) -> LogEntry:
        return LogEntry(
            max(self._threshold, "warning", key=LEVELS.index),
            __name__,
            f"{self.dropped} log messages about this call were dropped: they came faster than "
            "the client took them",
        )


def _running_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # a worker thread: no event loop runs there
        return None


#: The call being served in this context (None: none, or its client asked for no messages).
_current: ContextVar[_CallLog | None] = ContextVar("mcp_sandbox_client_log", default=None)


class _CallRecords(logging.Handler):
    """Offers each record to the call being served where it was emitted, if any."""

    def emit(self, record: logging.LogRecord) -> None:
        call = _current.get()
        if call is None:
            return
        try:
            call.offer(record)
        except Exception:  # noqa: BLE001 - logging.Handler's contract: report, never raise
            self.handleError(record)


_HANDLER = _CallRecords()


def install() -> None:
    """Put the forwarding handler on the `mcp_sandbox` logger (once, however often called)."""
    logger = logging.getLogger(ROOT_LOGGER)
    if _HANDLER not in logger.handlers:
        logger.addHandler(_HANDLER)
