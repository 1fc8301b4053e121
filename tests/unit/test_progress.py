"""ProgressRelay: what a call says while it waits, then while it runs."""

from __future__ import annotations

import anyio
import pytest

from mcp_sandbox.progress import ProgressRelay

pytestmark = pytest.mark.anyio


async def ignore(elapsed: float, message: str) -> None:
    del elapsed, message


def test_a_call_says_what_it_waits_for_until_its_program_runs() -> None:
    relay = ProgressRelay(ignore, 1.0)
    assert relay.message().startswith("waiting for a sandbox (")
    relay.waiting("the session's running call to end")
    assert relay.message().startswith("waiting for the session's running call to end (")
    relay.push("too early")  # a line before the run is not the run's
    relay.running()
    assert relay.message() == "running for 0 s"
    relay.push("step 1")
    assert relay.message() == "running for 0 s; last output: step 1"


async def test_reports_come_at_the_interval_with_the_time_since_the_call_came() -> None:
    reports: list[tuple[float, str]] = []
    got_two = anyio.Event()

    async def report(elapsed: float, message: str) -> None:
        reports.append((elapsed, message))
        if len(reports) == 2:
            got_two.set()

    relay = ProgressRelay(report, 0.01)
    async with anyio.create_task_group() as group:
        group.start_soon(relay.report_until_cancelled, anyio.Event())
        with anyio.fail_after(10):
            await got_two.wait()
        group.cancel_scope.cancel()
    (first, _), (second, message) = reports[:2]
    assert 0 < first <= second and message.startswith("waiting for a sandbox")
