"""ReadyPool and Sessions with fake executors: fairness, failures, state, expiry."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from mcp_sandbox.backends.base import Executor, NotDone, SandboxStartError
from mcp_sandbox.errors import PoolUnavailable, SessionLimitReached
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.settings import Settings
from tests.unit.fakes import FakeExecutor

pytestmark = pytest.mark.anyio


async def quick_start(principal: str | None = None) -> Executor:
    await anyio.sleep(0.01)
    return FakeExecutor()


async def test_pool_fills_to_its_size() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=3, task_group=group, acquire_timeout=1)
        pool.fill()
        await anyio.sleep(0.1)
        assert len(pool.ready) == 3
        await pool.take()
        with anyio.fail_after(5):  # the pool refills after a hand-out
            while len(pool.ready) < 3:
                await anyio.sleep(0.01)
        await pool.close()


async def test_a_refill_waits_out_the_takers_first_call_and_a_waiting_caller_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A start takes a core: the one that refills the pool after a take waits REFILL_DELAY, so as
    not to slow the taker's first call, while a caller that waits gets a start at once."""
    monkeypatch.setattr("mcp_sandbox.pool.REFILL_DELAY", 60)
    starts: list[str | None] = []

    async def start(principal: str | None = None) -> Executor:
        starts.append(principal)
        return FakeExecutor()

    async with anyio.create_task_group() as group:
        pool = ReadyPool(start, size=1, task_group=group, acquire_timeout=10)
        pool.fill()
        with anyio.fail_after(5):
            while not pool.ready:
                await anyio.sleep(0.01)
        assert len(starts) == 1, "the first fill starts at once"
        await pool.take()
        for _ in range(20):
            await anyio.lowlevel.checkpoint()
        assert len(starts) == 1, "the refill started at once, beside the taker's first call"
        with anyio.fail_after(5):
            await pool.take()  # a caller waits: a start for it, now
        assert len(starts) == 2, "the refill is still waiting"
        await pool.close()
        group.cancel_scope.cancel()  # the refill would wait out its 60 s


class RecyclableExecutor(FakeExecutor):
    async def recycle(self) -> NotDone | None:
        return None


async def test_a_sandbox_that_is_not_reusable_is_closed_not_recycled() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=2, task_group=group, acquire_timeout=1, recycle=True)
        kept, spent = RecyclableExecutor(), RecyclableExecutor()
        spent.reusable = False  # as after Executor.renew
        for executor in (kept, spent):
            await pool.give_back(executor)
        with anyio.fail_after(5):
            while kept not in pool.ready:
                await anyio.sleep(0.01)
        assert spent.closed and not kept.closed and spent not in pool.ready
        await pool.close()


async def test_a_recycled_sandbox_serves_only_the_principal_whose_call_used_it() -> None:
    """A reset in place restores what it knows of, not all a program could leave: alice's used
    sandbox, recycled, goes to alice's next call, never to bob's, who gets a sandbox of his own."""

    async def start(principal: str | None = None) -> Executor:
        return RecyclableExecutor()

    async with anyio.create_task_group() as group:
        pool = ReadyPool(start, size=1, task_group=group, acquire_timeout=5, recycle=True)
        used = await pool.take(principal="alice")
        await pool.give_back(used)
        with anyio.fail_after(5):
            while used not in pool.ready:
                await anyio.sleep(0.01)
        with anyio.fail_after(5):
            bobs = await pool.take(principal="bob")
        assert bobs is not used and used in pool.ready
        with anyio.fail_after(5):
            alices = await pool.take(principal="alice")
        assert alices is used
        await pool.close()


async def test_waiters_are_served_first_come_first_served() -> None:
    order: list[int] = []

    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=0, task_group=group, acquire_timeout=5, max_starting=1)

        async def take(number: int) -> None:
            await pool.take()
            order.append(number)

        for number in range(4):
            group.start_soon(take, number)
            await anyio.sleep(0.001)
        with anyio.fail_after(5):
            while len(order) < 4:
                await anyio.sleep(0.01)
        await pool.close()
    assert order == [0, 1, 2, 3]


async def test_a_failing_start_reaches_the_waiter_at_once() -> None:
    async def broken(principal: str | None = None) -> Executor:
        raise SandboxStartError("no runtime here")

    async with anyio.create_task_group() as group:
        pool = ReadyPool(broken, size=0, task_group=group, acquire_timeout=30)
        with anyio.fail_after(5), pytest.raises(PoolUnavailable, match="no runtime here"):
            await pool.take()
        await pool.close()
        group.cancel_scope.cancel()


async def test_a_single_failed_start_is_retried_for_the_waiter() -> None:
    attempts: list[int] = []

    async def flaky(principal: str | None = None) -> Executor:
        attempts.append(1)
        if len(attempts) == 1:
            raise SandboxStartError("killed while starting")
        return FakeExecutor()

    async with anyio.create_task_group() as group:
        pool = ReadyPool(flaky, size=0, task_group=group, acquire_timeout=30)
        with anyio.fail_after(5):
            executor = await pool.take()
        assert executor.alive and len(attempts) == 2
        await pool.close()


async def test_acquire_gives_up_after_its_timeout() -> None:
    async def slow(principal: str | None = None) -> Executor:
        await anyio.sleep(10)
        return FakeExecutor()

    async with anyio.create_task_group() as group:
        pool = ReadyPool(slow, size=0, task_group=group, acquire_timeout=0.1)
        with pytest.raises(PoolUnavailable, match=r"within 0\.1 s"):
            await pool.take()
        await pool.close()
        group.cancel_scope.cancel()


def settings(**overrides: object) -> Settings:
    return Settings(**{"interrupt_grace": 0.05, "session_ttl": 0.2, "max_sessions": 2, **overrides})  # type: ignore[arg-type]


async def test_session_keeps_its_executor_and_one_off_calls_discard_theirs() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=1, task_group=group, acquire_timeout=1)
        sessions = Sessions(settings(), pool)
        first = await sessions.run("1", timeout=1, session_id="s")
        second = await sessions.run("2", timeout=1, session_id="s")
        assert first.session_id == second.session_id == "s"
        one_off = await sessions.run("3", timeout=1)
        assert one_off.session_id is None
        await sessions.close()
        await pool.close()


async def test_a_lost_session_gets_a_new_sandbox() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(_stubborn, size=1, task_group=group, acquire_timeout=1)
        sessions = Sessions(settings(), pool)
        lost = await sessions.run("hang", timeout=0.05, session_id="s")
        assert lost.session_lost
        assert (await sessions.run("'again'", timeout=1, session_id="s")).success
        await sessions.close()
        await pool.close()


async def _stubborn(principal: str | None = None) -> Executor:
    return FakeExecutor(stubborn=True)


async def test_session_limit_and_expiry() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=1, task_group=group, acquire_timeout=1)
        sessions = Sessions(settings(), pool)
        await sessions.run("1", timeout=1, session_id="a")
        await sessions.run("1", timeout=1, session_id="b")
        with pytest.raises(SessionLimitReached):
            await sessions.run("1", timeout=1, session_id="c")
        group.start_soon(sessions.expire_idle)
        with anyio.fail_after(3):
            while sessions.has("a") or sessions.has("b"):
                await anyio.sleep(0.05)
        await sessions.run("1", timeout=1, session_id="c")
        await sessions.close()
        await pool.close()
        group.cancel_scope.cancel()
