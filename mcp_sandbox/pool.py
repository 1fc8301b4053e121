"""Sandboxes started before they are needed, so no call waits for a cold start."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

import anyio
import anyio.abc

from mcp_sandbox.backends.base import Executor, NotDone, SandboxStartError
from mcp_sandbox.errors import PoolUnavailable
from mcp_sandbox.metrics import Metrics
from mcp_sandbox.principals import SOLE
from mcp_sandbox.quotas import RoundRobin
from mcp_sandbox.retry import Backoff
from mcp_sandbox.tracing import traced

logger = logging.getLogger(__name__)

#: Failed starts in a row before a waiter is told: one may be a sandbox killed while starting.
FAILURES_BEFORE_TELLING = 2
#: Seconds a refill waits after the take that made room for it (a caller that waits gets a start
#: of its own at once): a start takes a core, and would slow the taker's first call.
REFILL_DELAY = 0.1


def _named(executor: Executor) -> str:
    """A sandbox as the log names it: its backend and, for a process, its pid (which the code in it
    can read too)."""
    pid = getattr(executor, "pid", None)
    return f"{executor.backend} sandbox" if pid is None else f"{executor.backend} sandbox {pid}"


@dataclass(eq=False)
class _Waiter:
    principal: str
    ready: anyio.Event = field(default_factory=anyio.Event)
    executor: Executor | None = None
    error: str | None = None


class ReadyPool:
    """Keeps `size` started executors ready; hands them out first come, first served, in turn
    across principals.

    When more callers wait than there are ready sandboxes, more are started (at most
    `max_starting` at once, since each start is CPU-bound), and each new one goes to the
    longest waiter of the principal whose turn it is (`quotas.RoundRobin`): a flood of one
    principal's calls delays another's by at most one sandbox. A caller waits at most
    `acquire_timeout` seconds.

    A sandbox may serve some principals only (one that shares its process with another's
    sandboxes, `Executor.serves`): it is handed to the first waiter it serves, and a start for a
    waiter is started for its principal. A recycled sandbox serves only the principal whose call
    used it last: a reset in place restores what it knows of, not all a program could leave.

    A caller done with a sandbox gives it back (`give_back`): with `recycle`, it is reset in place
    in the background and is ready again in milliseconds; otherwise, or when it cannot be
    reset, it is closed. A sandbox lent for one call (`take(lend=True)`) is expected back, so
    taking it starts no replacement.
    """

    def __init__(
        self,
        start: Callable[[str | None], Awaitable[Executor]],
        *,
        size: int,
        task_group: anyio.abc.TaskGroup,
        acquire_timeout: float,
        recycle: bool = False,
        max_starting: int = 2,
        metrics: Metrics | None = None,
    ) -> None:
        self._start = start
        self._size = size
        self._task_group = task_group
        self._acquire_timeout = acquire_timeout
        self._ready: deque[Executor] = deque()
        self._waiters: RoundRobin[_Waiter] = RoundRobin()
        self._starting = 0
        self._recycle = recycle
        #: Lent out for one call, or being reset: each will most likely be ready again soon.
        self._coming_back = 0
        self._start_slots = anyio.Semaphore(max_starting)
        self._backoff = Backoff()
        self._closed = False
        self._metrics = metrics or Metrics()
        #: Why the latest start failed, while starts fail (None once one succeeds).
        self._start_error: str | None = None
        self._started_any = False
        #: Whose call each sandbox handed out serves, and whose call last used each recycled one.
        self._claimed_by: WeakKeyDictionary[Executor, str] = WeakKeyDictionary()
        self._used_by: WeakKeyDictionary[Executor, str] = WeakKeyDictionary()

    @property
    def ready(self) -> tuple[Executor, ...]:
        """The sandboxes ready to be handed out, first in line first."""
        return tuple(self._ready)

    @property
    def waiting(self) -> int:
        """Calls waiting for a sandbox."""
        return len(self._waiters)

    def health(self) -> str | None:
        """Why a call could not have a sandbox now, or None: shutting down, sandboxes failing to
        start, or the first ones not started yet. A pool whose sandboxes are all in use is
        healthy: its callers wait their turn."""
        if self._closed:
            return "the server is shutting down"
        if self._start_error is not None and self._backoff.failures >= FAILURES_BEFORE_TELLING:
            return f"sandboxes fail to start: {self._start_error}"
        if self._size and not self._started_any:
            return "the first sandboxes are starting"
        return None

    def fill(self) -> None:
        """Start as many sandboxes as it takes to have `size` ready plus one per waiter: each
        for the next waiter's principal, then for whoever comes."""
        if self._closed:
            return
        for unfit in [executor for executor in self._ready if not executor.alive or not executor.reusable]:
            # Died, or its process may hold code it could not stop: never handed out.
            self._ready.remove(unfit)
            self._task_group.start_soon(unfit.close)
        wanted = self._size + len(self._waiters) - len(self._ready) - self._starting - self._coming_back
        whose: list[str | None] = [*self._waiters.principals()]
        for _ in range(max(0, wanted)):
            self._starting += 1
            principal = whose.pop(0) if whose else None
            refill = principal is None and self._started_any
            self._task_group.start_soon(self._start_one, principal, refill)

    @traced("mcp_sandbox.sandbox_wait")
    async def take(self, *, lend: bool = False, principal: str = SOLE) -> Executor:
        """A ready executor, now or as soon as one starts. Raises PoolUnavailable. `lend`: the
        caller gives it back with `give_back` after one call. `principal`: whose call waits, for
        its turn."""
        if self._closed:
            raise PoolUnavailable("the server is shutting down")
        with self._metrics.sandbox_wait.time():
            executor = await self._wait_for_one(principal)
        if lend and self._recycle:
            self._coming_back += 1
        self.fill()
        return executor

    async def start_new(self, principal: str = SOLE) -> Executor:
        """A sandbox started for `principal`'s caller alone, never used before: for what a pooled
        one may have been ruled out of by its use (a restore). Raises SandboxStartError."""
        executor = await self._start(principal)
        self._claim(executor, principal)
        return executor

    def _serves(self, executor: Executor, principal: str) -> bool:
        return executor.serves(principal) and self._used_by.get(executor, principal) == principal

    def _claim(self, executor: Executor, principal: str) -> None:
        self._claimed_by[executor] = principal
        executor.claim(principal)

    async def give_back(self, executor: Executor, *, lent: bool = False) -> None:
        """Take back a sandbox its caller is done with (`lent`: one from `take(lend=True)`):
        closed before this returns, or recycled in the background."""
        if lent and self._recycle:
            self._coming_back -= 1
        if not self._recycle or self._closed or not executor.alive or not executor.reusable:
            if self._recycle and not self._closed:
                why = "it died" if not executor.alive else "it was renewed after a crash, for its caller only"
                logger.debug("a used %s was closed, not recycled: %s", _named(executor), why)
            await self._discard(executor)
            return
        self._coming_back += 1
        self._task_group.start_soon(self._recycle_one, executor)

    async def _discard(self, executor: Executor) -> None:
        await executor.close()
        self.fill()

    async def _recycle_one(self, executor: Executor) -> None:
        try:
            why_not = await executor.recycle()
        except Exception as error:  # noqa: BLE001 - a sandbox that fails to reset is replaced, never fatal
            why_not = NotDone(f"its reset failed: {error!r}")
        finally:
            self._coming_back -= 1
        if why_not is not None:
            logger.info("a used %s was replaced, not recycled: %s", _named(executor), why_not.reason)
            await self._discard(executor)
            return
        executor.unclaim()
        if (principal := self._claimed_by.pop(executor, None)) is not None:
            self._used_by[executor] = principal
        if self._closed:
            await executor.close()
        elif self._hand_over(executor):
            logger.debug("a used %s was recycled, for a waiting caller", _named(executor))
        else:
            # First in line: its V8 has compiled Pyodide's hot code, a new one's has not.
            self._ready.appendleft(executor)
            logger.debug("a used %s was recycled, first in line", _named(executor))
            while len(self._ready) > self._size:
                await self._ready.pop().close()

    def _hand_over(self, executor: Executor) -> bool:
        """Give `executor` to the first waiter it serves; False when it serves none."""
        waiter = self._waiters.popleft_of(lambda principal: self._serves(executor, principal))
        if waiter is None:
            return False
        self._claim(executor, waiter.principal)
        waiter.executor = executor
        waiter.ready.set()
        return True

    async def _wait_for_one(self, principal: str) -> Executor:
        for executor in list(self._ready):
            if not executor.alive or not executor.reusable:
                self._ready.remove(executor)
                await executor.close()
            elif self._serves(executor, principal):
                self._ready.remove(executor)
                self._claim(executor, principal)
                return executor
        waiter = _Waiter(principal)
        self._waiters.append(principal, waiter)
        self.fill()
        try:
            with anyio.move_on_after(self._acquire_timeout):
                await waiter.ready.wait()
        finally:
            if not waiter.ready.is_set():
                self._waiters.remove(principal, waiter)
        if waiter.executor is not None:
            return waiter.executor
        raise PoolUnavailable(waiter.error or self._busy())

    def _busy(self) -> str:
        """Why a call that waited its bound for a sandbox is refused, and when to try again."""
        others = len(self._waiters)
        queue = f", {others} other calls still waiting" if others else ""
        return (
            f"the server is busy: no sandbox became free within {self._acquire_timeout:g} s{queue}; "
            f"retry in about {self._acquire_timeout:g} s, or send fewer calls at once"
        )

    async def _start_one(self, principal: str | None, refill: bool = False) -> None:
        if refill:
            await anyio.sleep(REFILL_DELAY)
        try:
            async with self._start_slots:
                if delay := self._backoff.delay:
                    await anyio.sleep(delay)
                executor = await self._start(principal)
        except SandboxStartError as error:
            self._starting -= 1
            self._backoff.failed()
            self._start_error = str(error)
            self._metrics.sandbox_start_failures.inc()
            logger.error("could not start a sandbox: %s", error)
            # Tell one waiter now rather than let it wait out its timeout for starts that keep failing.
            if self._waiters and not error.killed and self._backoff.failures >= FAILURES_BEFORE_TELLING:
                waiter = self._waiters.popleft()
                waiter.error = f"could not start a sandbox: {error}"
                waiter.ready.set()
            self.fill()
            return
        self._starting -= 1
        self._backoff.succeeded()
        self._start_error, self._started_any = None, True
        if self._closed:
            await executor.close()
            return
        if self._recycle:
            # A recycled sandbox keeps its compiled code, so warming it up pays for every caller.
            await executor.jit_warm_up()
        if not self._hand_over(executor):
            self._ready.append(executor)

    async def close(self) -> None:
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            waiter.error = "the server is shutting down"
            waiter.ready.set()
        while self._ready:
            await self._ready.popleft().close()
