"""A session's state never changes without a word: what a result says after its session got a new
sandbox (`account`), and the paths that lead there, with fake executors whose state is the list of
programs they ran (the real servers: tests/integration/test_checkpoints.py, tests/soak/test_oracle.py)."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_sandbox.backends.base import Executor, SandboxDied
from mcp_sandbox.lifecycle import Resumed, SessionState, account
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.store import SavedState
from tests.unit.test_hibernation import QUICK, StatefulExecutor, pool_of_sessions

pytestmark = pytest.mark.anyio

NEW, LIVE, HIBERNATED, MOVED, LOST = (
    SessionState.NEW,
    SessionState.LIVE,
    SessionState.HIBERNATED,
    SessionState.MOVED,
    SessionState.LOST,
)


def checkpoint(call: int, *lost: str) -> SavedState:
    return SavedState("fake", "fake-1", b"", call, lost)


def said(resumed: Resumed) -> tuple[str, int | None]:
    kind = "lost" if resumed.lost else "restored" if resumed.from_call is not None else "silent"
    return kind, resumed.from_call


# (why it had no sandbox, its latest call, the checkpoint restored, why none could be, what is said)
ACCOUNTS = [
    (NEW, 0, None, None, ("silent", None)),  # a session a caller never created
    (NEW, 3, None, None, ("lost", None)),  # ran on a process that stopped before its first checkpoint
    (NEW, 3, checkpoint(3), None, ("restored", 3)),  # a restart: said, even when whole
    (NEW, 5, checkpoint(3), None, ("restored", 3)),
    (NEW, 0, checkpoint(2), None, ("restored", 2)),  # a checkpoint with no record: said
    (NEW, 3, None, "damaged", ("lost", None)),
    (NEW, 0, None, "damaged", ("lost", None)),
    (HIBERNATED, 3, checkpoint(3), None, ("silent", None)),  # back whole, as if never gone
    (HIBERNATED, 4, checkpoint(3), None, ("restored", 3)),  # another instance ran it since
    (HIBERNATED, 3, checkpoint(3, "an open file"), None, ("restored", 3)),
    (HIBERNATED, 3, None, None, ("lost", None)),
    (HIBERNATED, 3, None, "damaged", ("lost", None)),
    (MOVED, 3, checkpoint(3), None, ("restored", 3)),
    (MOVED, 3, None, None, ("lost", None)),
    (LOST, 3, checkpoint(3), None, ("restored", 3)),  # killed: said, even when whole
    (LOST, 3, checkpoint(1), None, ("restored", 1)),
    (LOST, 3, None, None, ("lost", None)),
    (LOST, 0, None, None, ("lost", None)),  # died in its first call
    (LOST, 3, None, "checkpoints are off", ("lost", None)),
]


@pytest.mark.parametrize(("state", "latest", "restored", "problem", "expected"), ACCOUNTS)
def test_every_change_of_state_is_said(
    state: SessionState,
    latest: int,
    restored: SavedState | None,
    problem: str | None,
    expected: tuple[str, int | None],
) -> None:
    resumed = account(state, latest, restored, problem, None)
    assert said(resumed) == expected
    assert bool(resumed.notes) == (expected[0] != "silent"), resumed.notes


def test_what_is_said_names_the_calls_that_are_gone_and_where_it_ran() -> None:
    resumed = account(NEW, 5, checkpoint(3), None, "host:12:ab")
    assert resumed.notes == [
        "the session was restored from its checkpoint after call 3; it ran on another server process "
        "(host:12:ab) that stopped; what later calls did is gone"
    ], "another instance's record gives the least number of calls, so none are named"
    assert account(LOST, 5, checkpoint(3), None, None).notes == [
        "the session was restored from its checkpoint after call 3; "
        "what later calls did is gone (calls 4 to 5)"
    ]
    assert "no checkpoint yet" in account(LOST, 2, None, None, None).notes[0]
    assert "starts fresh" in account(NEW, 2, None, "its hash does not match", None).notes[0]


class KillableExecutor(StatefulExecutor):
    #: Killed, and its host has not noticed yet: it looks alive until a run is sent to it.
    dead_unnoticed = False

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        if self.dead_unnoticed:
            raise SandboxDied("the sandbox's stdin is closed")
        await super()._submit(code, tools_manifest)


class Sandboxes:
    """Starts the fake sandboxes and keeps them, so a test can kill one from outside."""

    def __init__(self) -> None:
        self.started: list[KillableExecutor] = []

    async def start(self, principal: str | None = None) -> Executor:
        executor = KillableExecutor()
        self.started.append(executor)
        return executor

    def kill_the_one_that_ran(self, program: str, *, noticed: bool = True) -> None:
        (holder,) = [executor for executor in self.started if program in executor.ran]
        if noticed:
            holder.closed = True
        else:
            holder.dead_unnoticed = True


def server(
    tmp_path: Path, sandboxes: Sandboxes, *, store: bool = True, killed: bool = False, **overrides: Any
) -> AbstractAsyncContextManager[Sessions]:
    """A server's Sessions on the store in `tmp_path`, whose leases run out in a second."""
    return pool_of_sessions(
        tmp_path, start=sandboxes.start, store=store, killed=killed, **{"lease_seconds": 1, **overrides}
    )


async def settled(sessions: Sessions, session_id: str, call: int) -> None:
    with anyio.fail_after(5):
        while sessions.saved_call(session_id) != call:
            await anyio.sleep(0.01)


async def test_a_sandbox_killed_between_calls_before_its_first_checkpoint_is_said_lost(
    tmp_path: Path,
) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes, checkpoints=False) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        sandboxes.kill_the_one_that_ran("a1")
        after = await sessions.run("a2", timeout=1, session_id="a")
        assert after.session_lost and not after.session_restored, after
        assert after.result == '["a2"]' and after.notes, after
        again = await sessions.run("a3", timeout=1, session_id="a")
        assert not again.session_lost and again.result == '["a2", "a3"]', "said once, then a session again"


async def test_a_death_noticed_only_when_the_call_is_sent_still_runs_the_call(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await settled(sessions, "a", 1)
        sandboxes.kill_the_one_that_ran("a1", noticed=False)
        after = await sessions.run("a2", timeout=1, session_id="a")
        assert after.success and after.result == '["a1", "a2"]', after
        assert after.session_restored and after.restored_from_call == 1, after


async def test_a_sandbox_killed_between_calls_without_any_store_is_said_lost(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes, store=False) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        sandboxes.kill_the_one_that_ran("a1")
        after = await sessions.run("a2", timeout=1, session_id="a")
        assert after.session_lost and after.result == '["a2"]', after


async def test_a_sandbox_killed_between_calls_after_a_checkpoint_is_said_restored(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await settled(sessions, "a", 1)
        sandboxes.kill_the_one_that_ran("a1")
        after = await sessions.run("a2", timeout=1, session_id="a")
        assert after.session_restored and after.restored_from_call == 1, after
        assert after.result == '["a1", "a2"]', "its state is intact"


async def test_a_restart_before_the_first_checkpoint_is_said_lost(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes, killed=True) as first:
        await first.run("a1", timeout=1, session_id="a")
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a2", timeout=1, session_id="a")
        assert after.session_lost and after.result == '["a2"]', after
        assert any("before its first checkpoint" in note for note in after.notes), after.notes
        fresh = await second.run("b1", timeout=1, session_id="b")
        assert not fresh.session_lost and not fresh.notes, "a session nobody created is simply new"


async def test_a_restart_after_later_calls_names_what_is_gone(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes, killed=True) as first:
        await first.run("a1", timeout=1, session_id="a")
        await settled(first, "a", 1)
        await first.run("a2", timeout=1, session_id="a")
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a3", timeout=1, session_id="a")
        assert after.session_restored and after.restored_from_call == 1, after
        assert "ran on another server process" in after.notes[0], after.notes
        assert "what later calls did is gone" in after.notes[0], after.notes
        assert after.result == '["a1", "a3"]'


async def test_a_stop_waits_for_a_checkpoint_under_way_and_saves_the_last_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StatefulExecutor, "checkpoint_seconds", 0.3)
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes) as first:
        await first.run("a1", timeout=1, session_id="a")
        await anyio.sleep(0.1)  # its idle-time checkpoint is under way when the server stops
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a2", timeout=1, session_id="a")
        assert after.session_restored and after.restored_from_call == 1, after
        assert after.result == '["a1", "a2"]'


async def test_reset_forgets_the_record_too(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    async with server(tmp_path, sandboxes, killed=True) as first:
        await first.run("a1", timeout=1, session_id="a")
        assert await first.reset("a")
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a1", timeout=1, session_id="a")
        assert not after.session_lost and not after.notes, "a reset session is a new one"


async def test_a_stop_whose_closing_checkpoint_runs_out_of_time_is_said_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StatefulExecutor, "checkpoint_seconds", 0.5)
    sandboxes = Sandboxes()
    async with server(
        tmp_path, sandboxes, timings=replace(QUICK, closing_save=0.05)
    ) as first:  # stops cleanly: its leases are given up
        await first.run("a1", timeout=1, session_id="a")
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a2", timeout=1, session_id="a")
        assert after.session_lost and after.result == '["a2"]', after


async def test_the_record_is_written_once_per_checkpoint_not_once_per_call(tmp_path: Path) -> None:
    sandboxes = Sandboxes()
    records = tmp_path / "state" / "records"
    no_checkpoint_between_calls = replace(QUICK, checkpoint_quiet=60)
    async with server(tmp_path, sandboxes, killed=True, timings=no_checkpoint_between_calls) as first:
        await first.run("a1", timeout=1, session_id="a")
        (record,) = records.glob("*.record")
        written = record.stat().st_mtime_ns
        for i in range(2, 6):
            await first.run(f"a{i}", timeout=1, session_id="a")  # back to back: no checkpoint between
            assert record.stat().st_mtime_ns == written, f"call {i} wrote the record again"
    async with server(tmp_path, sandboxes) as second:
        after = await second.run("a6", timeout=1, session_id="a")
        assert after.session_lost and not after.session_restored, (
            "calls ran, no checkpoint came: lost, and said"
        )
