"""A call's stop: a caller that goes away (a cancelled MCP request, a person pressing stop, a
cancelled task in the Python API) stops its program the way a timeout does, so the session keeps its
state and its sandbox, while what the call was still waiting for is simply called off."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

import anyio

T = TypeVar("T")


class CallStopped(Exception):
    """The call was stopped before its program started: nothing ran."""


async def stop_on_cancel(work: Callable[[anyio.Event], Awaitable[T]]) -> T:
    """`work(stop)`, carried to its end even when the calling task is cancelled: the cancel sets
    `stop` instead (the program is then interrupted, and the session settles as after a timeout),
    and goes on once `work` returns."""
    stop = anyio.Event()
    outcome: list[T] = []
    error: Exception | None = None
    async with anyio.create_task_group() as watching:
        watching.start_soon(_set_when_cancelled, stop)
        with anyio.CancelScope(shield=True):
            try:
                outcome.append(await work(stop))
            except Exception as raised:  # noqa: BLE001 - raised below, outside the group (unwrapped)
                error = raised
        watching.cancel_scope.cancel()
    if error is not None:
        raise error
    return outcome[0]


@asynccontextmanager
async def stopped_by(stop: anyio.Event) -> AsyncIterator[None]:
    """The block, called off when `stop` is set: then CallStopped is raised. Its own exceptions pass
    as they are."""
    error: Exception | None = None
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as watching:
            watching.start_soon(_cancel_when_set, stop, scope)
            try:
                yield
            except Exception as raised:  # noqa: BLE001 - raised below, outside the group (unwrapped)
                error = raised
            watching.cancel_scope.cancel()
    if error is not None:
        raise error
    if scope.cancelled_caught:
        raise CallStopped


async def _cancel_when_set(stop: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel `scope` once `stop` is set (run it in a task)."""
    await stop.wait()
    scope.cancel()


async def _set_when_cancelled(stop: anyio.Event) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        stop.set()
