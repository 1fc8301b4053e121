"""Limits per principal (quotas.py): the accounting with a fake clock, the round-robin queue, and
the ready pool and sessions that use them, with fake executors."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.errors import PrincipalLimitReached, Refused
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.principals import SOLE
from mcp_sandbox.quotas import MINUTE, SWEEP_AT, Limits, Quotas, RoundRobin
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.settings import Settings
from tests.unit.fakes import FakeExecutor

pytestmark = pytest.mark.anyio


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_running_calls_past_the_limit_are_refused_naming_the_setting_and_only_their_principal() -> None:
    quotas = Quotas(Limits(running_calls=2))
    with quotas.call("alice"), quotas.call("alice"):
        with pytest.raises(PrincipalLimitReached) as refused:
            with quotas.call("alice"):
                pass
        message = str(refused.value)
        assert message == (
            "alice has 2 calls running, the most MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS allows; "
            "wait for one to finish"
        )
        assert refused.value.setting == "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS"
        assert isinstance(refused.value, Refused)
        with quotas.call("bob"), quotas.call("bob"):  # bob's own two
            assert quotas.running("alice") == 2 and quotas.running("bob") == 2
    with quotas.call("alice"):  # one finished: room again
        assert quotas.running("alice") == 1


def test_a_refused_call_counts_for_nothing() -> None:
    clock = Clock()
    quotas = Quotas(Limits(running_calls=1, calls_per_minute=5), clock)
    with quotas.call("alice"):
        for _ in range(10):
            with pytest.raises(PrincipalLimitReached, match="RUNNING_CALLS"), quotas.call("alice"):
                pass
    for _ in range(4):  # the refused ten took none of the five a minute
        with quotas.call("alice"):
            pass


def test_calls_per_minute_count_a_sliding_minute_on_the_clock() -> None:
    clock = Clock()
    quotas = Quotas(Limits(calls_per_minute=3), clock)
    for _ in range(3):
        with quotas.call("alice"):
            pass
        clock.now += 10  # calls at 1000, 1010, 1020
    with pytest.raises(PrincipalLimitReached) as refused, quotas.call("alice"):
        pass
    assert str(refused.value) == (
        "alice made 3 calls in the last minute, the most MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE "
        "allows; try again in 30 s"
    )
    with quotas.call("bob"):  # bob's minute is his own
        pass
    clock.now = 1000 + MINUTE  # the call at 1000 is a minute old
    with quotas.call("alice"):
        pass
    with pytest.raises(PrincipalLimitReached, match="try again in 10 s"), quotas.call("alice"):
        pass


def test_a_principal_with_nothing_running_or_recent_leaves_nothing_behind() -> None:
    clock = Clock()
    quotas = Quotas(Limits(running_calls=5, calls_per_minute=5, live_sandboxes=2), clock)
    for principal in ("alice", "bob", "carol"):
        with quotas.call(principal), quotas.taking_sandbox(principal, 0):
            pass
    clock.now += MINUTE
    with quotas.call("dave"):
        pass
    assert set(quotas._running) == set() and set(quotas._taking) == set()
    assert set(quotas._recent) <= {"alice", "bob", "carol", "dave"}
    for principal in ("alice", "bob", "carol"):
        quotas._forget_idle(principal)
    assert set(quotas._recent) == {"dave"}


def test_sessions_a_principal_may_hold_default_to_half_of_the_server_when_it_has_several(
    tmp_path: Path,
) -> None:
    shared = Quotas(Limits.from_settings(Settings(max_sessions=5, auth_tokens_file=tmp_path / "tokens")))
    shared.check_new_session("alice", 2, 600)
    with pytest.raises(PrincipalLimitReached) as refused:
        shared.check_new_session("alice", 3, 600)
    assert str(refused.value) == (
        "alice has 3 sessions open, the most MCP_SANDBOX_PRINCIPAL_MAX_SESSIONS allows; call "
        "reset_session on one you no longer need, or wait for idle ones to expire (600 s)"
    )
    with pytest.raises(PrincipalLimitReached, match="this caller has 3 sessions open"):
        shared.check_new_session(SOLE, 3, 600)  # a sole token beside the file: one of several
    alone = Quotas(Limits.from_settings(Settings(max_sessions=5)))
    alone.check_new_session(SOLE, 4, 600)  # a server without a tokens file: max_sessions only
    explicit = Quotas(Limits.from_settings(Settings(max_sessions=5, principal_max_sessions=1)))
    with pytest.raises(PrincipalLimitReached, match="this caller has 1 sessions open"):
        explicit.check_new_session(SOLE, 1, 600)


def test_sandboxes_being_taken_count_against_the_live_limit() -> None:
    quotas = Quotas(Limits(live_sandboxes=2))
    with quotas.taking_sandbox("alice", 1):
        with pytest.raises(PrincipalLimitReached) as refused, quotas.taking_sandbox("alice", 1):
            pass
        assert str(refused.value).startswith(
            "alice has 2 sessions holding a sandbox, the most MCP_SANDBOX_PRINCIPAL_MAX_LIVE_SANDBOXES allows"
        )
        with quotas.taking_sandbox("bob", 1):
            pass
    with quotas.taking_sandbox("alice", 1):
        pass


def test_the_default_limits_refuse_nothing() -> None:
    quotas = Quotas(Limits.from_settings(Settings()))
    for _ in range(200):
        with quotas.call(SOLE), quotas.taking_sandbox(SOLE, 10_000):
            quotas.check_new_session(SOLE, 10_000, 600)


def test_round_robin_takes_principals_in_turn_and_each_first_come_first_served() -> None:
    queue: RoundRobin[str] = RoundRobin()
    for number in range(4):
        queue.append("alice", f"a{number}")
    queue.append("bob", "b0")
    queue.append("bob", "b1")
    queue.append("carol", "c0")
    queue.remove("alice", "a1")  # gave up waiting
    assert len(queue) == 6
    taken = [queue.popleft() for _ in range(6)]
    assert taken == ["a0", "b0", "c0", "a2", "b1", "a3"]
    assert not queue and len(queue) == 0
    with pytest.raises(IndexError):
        queue.popleft()
    with pytest.raises(ValueError):
        queue.remove("alice", "a0")
    one: RoundRobin[int] = RoundRobin()
    for number in range(5):
        one.append(SOLE, number)
    assert [one.popleft() for _ in range(5)] == [0, 1, 2, 3, 4]


async def test_the_pool_hands_new_sandboxes_to_waiting_principals_in_turn() -> None:
    """Alice's four calls wait first, then bob's: bob's gets the second sandbox, not the fifth."""
    send, receive = anyio.create_memory_object_stream[Executor](10)
    served: list[str] = []

    async def gated_start(principal: str | None = None) -> Executor:
        return await receive.receive()  # a start ends when the test says

    async with send, receive, anyio.create_task_group() as group:
        pool = ReadyPool(gated_start, size=0, task_group=group, acquire_timeout=30, max_starting=1)

        async def take(principal: str) -> None:
            await pool.take(lend=True, principal=principal)
            served.append(principal)

        for principal in ("alice", "alice", "alice", "alice", "bob"):
            group.start_soon(take, principal)
            await anyio.wait_all_tasks_blocked()
        with anyio.fail_after(5):
            for count in range(1, 6):
                await send.send(FakeExecutor())
                while len(served) < count:
                    await anyio.wait_all_tasks_blocked()
        await pool.close()
        group.cancel_scope.cancel()
    assert served == ["alice", "bob", "alice", "alice", "alice"]


async def quick_start(principal: str | None = None) -> Executor:
    return FakeExecutor()


async def test_sessions_refuse_a_principal_past_its_sessions_and_live_sandboxes_only() -> None:
    settings = Settings(max_sessions=4, principal_max_live_sandboxes=1, interrupt_grace=0.05)
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=1, task_group=group, acquire_timeout=5)
        sessions = Sessions(settings, pool)
        assert (await sessions.run("1", timeout=5, session_id="alice/a", principal="alice")).success
        with pytest.raises(PrincipalLimitReached, match="alice has 1 sessions holding a sandbox"):
            await sessions.run("1", timeout=5, session_id="alice/b", principal="alice")
        assert not sessions.has("alice/b"), "a refused session is not made"
        assert (await sessions.run("2", timeout=5, session_id="alice/a", principal="alice")).success
        assert (await sessions.run("1", timeout=5, session_id="bob/a", principal="bob")).success
        assert (await sessions.run("1", timeout=5, principal="alice")).success  # no session: not held
        await sessions.reset("alice/a")
        assert (await sessions.run("1", timeout=5, session_id="alice/b", principal="alice")).success
        await sessions.close()
        group.cancel_scope.cancel()


async def test_a_principal_of_a_server_with_a_tokens_file_leaves_half_the_sessions_to_the_others() -> None:
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=1, task_group=group, acquire_timeout=5)
        sessions = Sessions(
            Settings(max_sessions=4, interrupt_grace=0.05, auth_tokens_file="tokens.json"), pool
        )
        for name in ("a", "b"):
            await sessions.run("1", timeout=5, session_id=f"alice/{name}", principal="alice")
        with pytest.raises(PrincipalLimitReached, match="MCP_SANDBOX_PRINCIPAL_MAX_SESSIONS"):
            await sessions.run("1", timeout=5, session_id="alice/c", principal="alice")
        for name in ("a", "b"):
            await sessions.run("1", timeout=5, session_id=f"bob/{name}", principal="bob")
        await sessions.close()
        group.cancel_scope.cancel()


def test_principals_that_called_once_and_left_are_swept_out() -> None:
    now = [0.0]
    quotas = Quotas(Limits(calls_per_minute=5), clock=lambda: now[0])
    for index in range(SWEEP_AT + 1):
        with quotas.call(f"p{index}"):
            pass
    now[0] += MINUTE + 1
    with quotas.call("late"):
        pass
    assert len(quotas) == 1
