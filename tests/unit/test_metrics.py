"""metrics.py: outcomes, refusals by kind, gauges read at scrape time, one registry per App; and
what the ready pool and the sessions report to them."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mcp_sandbox.backends.base import Executor, SandboxStartError
from mcp_sandbox.errors import InvalidRequest, PoolUnavailable, PrincipalLimitReached, Refused
from mcp_sandbox.metrics import Metrics, Readings, outcome_of
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.settings import Settings
from tests.unit.fakes import FakeExecutor

pytestmark = pytest.mark.anyio


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed as Prometheus parses it: (name, labels) -> value."""
    text = metrics.exposition().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def ok() -> ExecutionResult:
    return ExecutionResult(success=True, backend="inprocess", duration_ms=1)


@pytest.mark.parametrize(
    ("status", "exception"),
    [
        ("error", "ZeroDivisionError"),
        ("error", "Timeout"),  # the program's own exception of that name
        ("timeout", None),
        ("cancelled", None),
        ("memory_limit", None),
        ("crash", None),
        ("rejected", None),
    ],
)
def test_a_failed_result_has_a_bounded_outcome(status: str, exception: str | None) -> None:
    failed = ExecutionResult.model_validate(
        {"status": status, "exception": exception, "backend": "inprocess", "duration_ms": 1}
    )
    assert outcome_of(failed) == status
    assert outcome_of(ok()) == "ok"


def test_calls_are_counted_by_outcome_and_refusals_by_kind_and_setting() -> None:
    metrics = Metrics()
    for _ in range(2):
        with metrics.call("subprocess") as call:
            call.ended(ok())
    refusals: list[Refused] = [
        InvalidRequest("too long"),
        PrincipalLimitReached("at a limit", "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS"),
        PoolUnavailable("none"),
    ]
    for refusal in refusals:
        with pytest.raises(Refused), metrics.call("subprocess"):
            raise refusal
    with pytest.raises(RuntimeError), metrics.call("subprocess"):
        raise RuntimeError("not a call's outcome")  # a bug: not counted as any outcome
    got = samples(metrics)
    assert got["mcp_sandbox_calls_total", (("backend", "subprocess"), ("outcome", "ok"))] == 2
    assert got["mcp_sandbox_calls_total", (("backend", "subprocess"), ("outcome", "refused"))] == 3
    assert sum(value for (name, _), value in got.items() if name == "mcp_sandbox_calls_total") == 5
    count = "mcp_sandbox_call_duration_seconds_count"
    assert got[count, (("backend", "subprocess"), ("outcome", "ok"))] == 2
    assert got[count, (("backend", "subprocess"), ("outcome", "refused"))] == 3
    refused = {labels: value for (name, labels), value in got.items() if name == "mcp_sandbox_refusals_total"}
    assert refused == {
        (("kind", "InvalidRequest"), ("setting", "")): 1,
        (("kind", "PrincipalLimitReached"), ("setting", "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS")): 1,
        (("kind", "PoolUnavailable"), ("setting", "")): 1,
    }


def test_no_label_names_a_principal_or_a_session() -> None:
    metrics = Metrics()
    with metrics.call("pyodide") as call:
        call.ended(ok())
    labels = {name for (_, pairs) in samples(metrics) for name, _ in pairs}
    assert labels <= {
        "backend",
        "outcome",
        "kind",
        "setting",
        "reason",
        "state",
        "le",
        "version",
        "operation",
    }


def test_each_metrics_has_its_own_registry() -> None:
    first, second = Metrics(), Metrics()
    with first.call("inprocess") as call:
        call.ended(ok())
    assert samples(first)["mcp_sandbox_calls_total", (("backend", "inprocess"), ("outcome", "ok"))] == 1
    assert ("mcp_sandbox_calls_total", (("backend", "inprocess"), ("outcome", "ok"))) not in samples(second)


def test_gauges_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    state: dict[str, Any] = {"sessions": {"live": 2, "hibernated": 1}, "ready": 3}
    metrics.read(Readings(lambda: state["sessions"], lambda: state["ready"], lambda: 4, lambda: "pyodide"))
    got = samples(metrics)
    assert got["mcp_sandbox_sessions", (("state", "live"),)] == 2
    assert got["mcp_sandbox_sessions", (("state", "hibernated"),)] == 1
    assert got["mcp_sandbox_ready_sandboxes", ()] == 3
    assert got["mcp_sandbox_waiting_calls", ()] == 4
    state["ready"] = 0
    assert samples(metrics)["mcp_sandbox_ready_sandboxes", ()] == 0


def test_lost_sandboxes_restores_and_checkpoints() -> None:
    metrics = Metrics()
    killed = ExecutionResult.failure("Timeout", "killed", backend="subprocess", session_lost=True)
    crashed = ExecutionResult.failure("SandboxCrash", "died", backend="subprocess", session_lost=True)
    kept = ExecutionResult.failure("Timeout", "interrupted", backend="subprocess")
    for result in (killed, crashed, kept):
        metrics.count_lost(result)
    metrics.count_restore(True, None)
    metrics.count_restore(False, "unusable")
    metrics.count_restore(False, None)  # no checkpoint: no restore
    metrics.count_checkpoint(1000)
    metrics.count_checkpoint(24)
    got = samples(metrics)
    assert got["mcp_sandbox_sandboxes_lost_total", (("reason", "timeout"),)] == 1
    assert got["mcp_sandbox_sandboxes_lost_total", (("reason", "crash"),)] == 1
    assert got["mcp_sandbox_restores_total", (("outcome", "restored"),)] == 1
    assert got["mcp_sandbox_restores_total", (("outcome", "failed"),)] == 1
    assert got["mcp_sandbox_checkpoints_total", ()] == 2
    assert got["mcp_sandbox_checkpoint_bytes_total", ()] == 1024


async def quick_start(principal: str | None = None) -> Executor:
    return FakeExecutor()


async def test_the_pool_reports_waits_failures_and_its_health() -> None:
    metrics = Metrics()
    failing = True

    async def start(principal: str | None = None) -> Executor:
        if failing:
            raise SandboxStartError("no runtime here")
        return FakeExecutor()

    async with anyio.create_task_group() as group:
        pool = ReadyPool(start, size=1, task_group=group, acquire_timeout=30, metrics=metrics)
        assert pool.health() == "the first sandboxes are starting"
        with anyio.fail_after(10), pytest.raises(PoolUnavailable):
            await pool.take()
        assert pool.health() == "sandboxes fail to start: no runtime here"
        assert samples(metrics)["mcp_sandbox_sandbox_start_failures_total", ()] >= 2
        failing = False
        with anyio.fail_after(20):  # the backoff's next try succeeds
            while pool.health() is not None:
                await anyio.sleep(0.05)
        assert len(pool.ready) == 1 and pool.waiting == 0
        await pool.close()
        assert pool.health() == "the server is shutting down"
        group.cancel_scope.cancel()
    assert samples(metrics)["mcp_sandbox_sandbox_wait_seconds_count", ()] == 1


async def test_sessions_count_by_state_and_count_the_sandboxes_they_lose() -> None:
    metrics = Metrics()
    async with anyio.create_task_group() as group:
        pool = ReadyPool(quick_start, size=1, task_group=group, acquire_timeout=1)
        sessions = Sessions(Settings(interrupt_grace=0.05), pool, metrics=metrics)
        assert set(sessions.counts().values()) == {0}
        await sessions.run("1", timeout=1, session_id="a")
        await sessions.run("1", timeout=1, session_id="b")
        assert sessions.counts()["live"] == 2 and sum(sessions.counts().values()) == 2
        assert (await sessions.run("die", timeout=1)).session_lost
        await sessions.close()
        await pool.close()
    assert samples(metrics)["mcp_sandbox_sandboxes_lost_total", (("reason", "crash"),)] == 1
