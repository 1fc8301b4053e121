"""Limits per principal: how many sessions, live sandboxes and running calls one principal may
hold, and how many calls it may make a minute, so that no principal takes what the others need;
and the round-robin queue in which calls from several principals wait for a sandbox.

A server without a tokens file has one principal (`principals.SOLE`): with the default settings
nothing here changes what it may do."""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Generic, TypeVar

from mcp_sandbox.errors import PrincipalLimitReached
from mcp_sandbox.principals import SOLE
from mcp_sandbox.settings import Settings

#: The window MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE counts calls in, in seconds.
MINUTE = 60.0
#: Principals with recent calls kept before those idle for a minute are swept out.
SWEEP_AT = 1024

T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """What one principal may hold at once (0: no limit of its own)."""

    sessions: int = 0
    live_sandboxes: int = 0
    running_calls: int = 0
    calls_per_minute: int = 0
    #: Sessions each principal may hold when `sessions` is 0 on a server with several (a tokens
    #: file or an OAuth issuer): a share of the server's, so no one can take them all (0: none).
    shared_sessions: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            sessions=settings.principal_max_sessions,
            live_sandboxes=settings.principal_max_live_sandboxes,
            running_calls=settings.principal_max_running_calls,
            calls_per_minute=settings.principal_calls_per_minute,
            shared_sessions=math.ceil(settings.max_sessions / 2) if settings.many_principals else 0,
        )

    @property
    def max_sessions(self) -> int:
        """The most sessions one principal may hold (0: no limit of its own, only the server's)."""
        return self.sessions or self.shared_sessions


def _who(principal: str) -> str:
    return principal if principal != SOLE else "this caller"


class Quotas:
    """The calls each principal has running and made in the last minute, checked against its
    `Limits` as each call, session or sandbox is asked for. Every message names the principal's
    own numbers and the setting, never another principal's.

    Counts of sessions and live sandboxes are the caller's to give (the session registry knows
    them); running calls, recent calls and sandboxes being taken are kept here.
    """

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._running: Counter[str] = Counter()
        #: When each principal's calls of the last minute were let in, oldest first.
        self._recent: dict[str, deque[float]] = {}
        #: Sandboxes each principal's sessions are being given right now (not live yet).
        self._taking: Counter[str] = Counter()

    def __len__(self) -> int:
        """Principals with anything counted: calls running or of the last minute, sandboxes being taken."""
        return len(self._running.keys() | self._recent.keys() | self._taking.keys())

    def running(self, principal: str) -> int:
        return self._running[principal]

    @contextmanager
    def call(self, principal: str) -> Iterator[None]:
        """Hold one running call of `principal` for the block. Raises PrincipalLimitReached, before
        counting anything, when it has as many running as it may, or made as many this minute."""
        limits, now = self.limits, self._clock()
        running = self._running[principal]
        if limits.running_calls and running >= limits.running_calls:
            raise PrincipalLimitReached(
                f"{_who(principal)} has {running} calls running, the most "
                "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS allows; wait for one to finish",
                "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS",
            )
        if limits.calls_per_minute:
            if len(self._recent) > SWEEP_AT:
                self._sweep(now)
            recent = self._recent.setdefault(principal, deque())
            while recent and recent[0] <= now - MINUTE:
                recent.popleft()
            if len(recent) >= limits.calls_per_minute:
                wait = math.ceil(recent[0] + MINUTE - now)
                raise PrincipalLimitReached(
                    f"{_who(principal)} made {len(recent)} calls in the last minute, the most "
                    f"MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE allows; try again in {wait} s",
                    "MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE",
                )
            recent.append(now)
        self._running[principal] += 1
        try:
            yield
        finally:
            self._running[principal] -= 1
            self._forget_idle(principal)

    def check_new_session(self, principal: str, open_sessions: int, ttl: float) -> None:
        """Before `principal` opens another session, holding `open_sessions`. Raises PrincipalLimitReached."""
        limit = self.limits.max_sessions
        if limit and open_sessions >= limit:
            raise PrincipalLimitReached(
                f"{_who(principal)} has {open_sessions} sessions open, the most "
                "MCP_SANDBOX_PRINCIPAL_MAX_SESSIONS allows; call reset_session on one you no longer "
                f"need, or wait for idle ones to expire ({ttl:g} s)",
                "MCP_SANDBOX_PRINCIPAL_MAX_SESSIONS",
            )

    def check_new_sandbox(self, principal: str, live: int) -> None:
        """Before a session of `principal`, which has `live` sessions holding a sandbox, is given
        one. Raises PrincipalLimitReached."""
        limit = self.limits.live_sandboxes
        held = live + self._taking[principal]
        if limit and held >= limit:
            raise PrincipalLimitReached(
                f"{_who(principal)} has {held} sessions holding a sandbox, the most "
                "MCP_SANDBOX_PRINCIPAL_MAX_LIVE_SANDBOXES allows; reset one you no longer need, or "
                "wait for an idle one to hibernate (MCP_SANDBOX_HIBERNATE_AFTER)",
                "MCP_SANDBOX_PRINCIPAL_MAX_LIVE_SANDBOXES",
            )

    @contextmanager
    def taking_sandbox(self, principal: str, live: int) -> Iterator[None]:
        """Count a sandbox a session of `principal` is being given, for the block (the taking
        waits, and two sessions taking at once must not both pass the check). Raises PrincipalLimitReached."""
        self.check_new_sandbox(principal, live)
        self._taking[principal] += 1
        try:
            yield
        finally:
            self._taking[principal] -= 1
            self._forget_idle(principal)

    def _sweep(self, now: float) -> None:
        # A principal that called once and left still has its last minute here until swept.
        for principal in [
            p for p, recent in self._recent.items() if not recent or recent[-1] <= now - MINUTE
        ]:
            del self._recent[principal]

    def _forget_idle(self, principal: str) -> None:
        # Principals come and go (an OAuth issuer's are unbounded): keep nothing for idle ones.
        if not self._running[principal]:
            del self._running[principal]
        if not self._taking[principal]:
            del self._taking[principal]
        recent = self._recent.get(principal)
        if recent is not None and (not recent or recent[-1] <= self._clock() - MINUTE):
            del self._recent[principal]


class RoundRobin(Generic[T]):
    """Items waiting in one queue per principal, taken one principal at a time in turn, each
    principal's first come first served: a principal with many waiting delays another's next by
    at most one of its own. With one principal, it is one queue, first come first served."""

    def __init__(self) -> None:
        #: Each principal with items waiting, in turn order (the next to be served first).
        self._queues: dict[str, deque[T]] = {}

    def __len__(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def __bool__(self) -> bool:
        return bool(self._queues)

    def append(self, principal: str, item: T) -> None:
        self._queues.setdefault(principal, deque()).append(item)

    def popleft(self) -> T:
        """The next item: the first of the principal whose turn it is, which then goes last.
        Raises IndexError when nothing waits."""
        if not self._queues:
            raise IndexError("nothing waits")
        principal = next(iter(self._queues))
        queue = self._queues.pop(principal)
        item = queue.popleft()
        if queue:
            self._queues[principal] = queue
        return item

    def popleft_of(self, fits: Callable[[str], bool]) -> T | None:
        """The next item of the first principal in turn that `fits`, which then goes last; None
        when no such principal has one waiting."""
        principal = next((name for name in self._queues if fits(name)), None)
        if principal is None:
            return None
        queue = self._queues.pop(principal)
        item = queue.popleft()
        if queue:
            self._queues[principal] = queue
        return item

    def principals(self) -> list[str]:
        """Whose the waiting items are, in the order they would be taken."""
        left = {name: len(queue) for name, queue in self._queues.items()}
        order: list[str] = []
        while left:
            for name in list(left):
                order.append(name)
                left[name] -= 1
                if not left[name]:
                    del left[name]
        return order

    def remove(self, principal: str, item: T) -> None:
        """Take out an item that stopped waiting. Raises ValueError when it is not there."""
        queue = self._queues.get(principal)
        if queue is None:
            raise ValueError(f"nothing of {principal!r} waits")
        queue.remove(item)
        if not queue:
            del self._queues[principal]
