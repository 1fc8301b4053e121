"""The timeout policy every backend shares (Executor.run), with a fake executor."""

from __future__ import annotations

import pytest

from tests.unit.fakes import FakeExecutor, KillableExecutor

pytestmark = pytest.mark.anyio


async def test_a_program_that_finishes_returns_its_outcome() -> None:
    result = await FakeExecutor().run("'hi'", 1)
    assert result.success and result.result == "'hi'" and result.backend == "fake"


async def test_an_interruptible_program_times_out_and_keeps_its_sandbox() -> None:
    executor = FakeExecutor()
    result = await executor.run("hang", 0.05)
    assert result.error_type == "Timeout" and not result.session_lost
    assert result.stdout == "partial" and not executor.closed


async def test_a_program_that_ignores_the_interrupt_is_killed() -> None:  # grace: 0.05 s
    executor = FakeExecutor(stubborn=True)
    result = await executor.run("hang", 0.05)
    assert result.error_type == "Timeout" and result.session_lost and executor.closed


async def test_a_program_that_ignores_the_interrupt_is_killed_and_its_sandbox_renewed() -> None:
    executor = KillableExecutor(stubborn=True)
    result = await executor.run("hang", 0.05)
    assert result.error_type == "Timeout" and result.session_lost, result
    assert executor.killed.is_set() and executor.renewed == 1 and not executor.closed


@pytest.mark.parametrize(("kill_works", "renews"), [(False, True), (True, False)])
async def test_a_kill_that_fails_closes_the_sandbox(kill_works: bool, renews: bool) -> None:
    executor = KillableExecutor(stubborn=True, kill_works=kill_works, renews=renews)
    result = await executor.run("hang", 0.05)
    assert result.error_type == "Timeout" and result.session_lost and executor.closed


async def test_a_crash_in_a_renewing_sandbox_keeps_the_sandbox() -> None:
    executor = KillableExecutor()
    result = await executor.run("crash", 1)
    assert result.error_type == "SandboxCrash" and result.session_lost, result
    assert executor.renewed == 1 and not executor.closed and executor.alive
    assert (await executor.run("'again'", 1)).result == "'again'"


async def test_a_dead_sandbox_is_a_crash() -> None:
    executor = FakeExecutor()
    result = await executor.run("die", 1)
    assert result.error_type == "SandboxCrash" and result.session_lost and executor.closed


async def test_output_from_the_guest_is_capped() -> None:
    result = await FakeExecutor().run("x" * 5000, 1)  # the fake's cap is 1,000 characters
    assert result.truncated and len(result.result or "") < 1100
