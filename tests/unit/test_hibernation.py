"""Sessions's checkpoints, restores and hibernation, with fake executors whose state is the
list of programs they ran (the real backends: tests/integration/test_checkpoints.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest

from mcp_sandbox.backends.base import Checkpoint, Executor, NotDone
from mcp_sandbox.lifecycle import WITH_SANDBOX, Timings
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.protocol import GuestOutcome
from mcp_sandbox.sessions import Sessions
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import DirectoryStore
from tests.unit.fakes import FakeExecutor, outcome

pytestmark = pytest.mark.anyio


class StatefulExecutor(FakeExecutor):
    """Its state is the programs it ran. A program named "unsaveable" makes its state one a
    checkpoint cannot carry whole."""

    #: How long a checkpoint takes (a real one takes milliseconds to seconds).
    checkpoint_seconds: ClassVar[float] = 0

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    async def _await_outcome(self) -> GuestOutcome:
        done = await super()._await_outcome()
        self.ran.append(self._code)
        return outcome(result=json.dumps(self.ran)) if done["success"] else done

    async def checkpoint(self) -> Checkpoint | NotDone:
        await anyio.sleep(self.checkpoint_seconds)
        lost = ("a value that cannot be carried",) if "unsaveable" in self.ran else ()
        return Checkpoint(json.dumps(self.ran).encode(), lost)

    async def restore(self, state: bytes) -> NotDone | None:
        self.ran = json.loads(state)
        return None


class FakeBackend:
    name = "fake"
    build = "fake-1"
    saves_sessions: ClassVar[bool] = True


async def start(principal: str | None = None) -> Executor:
    return StatefulExecutor()


#: A checkpoint soon after a call, idle sessions looked for often.
QUICK = Timings(sweep_interval=0.05, checkpoint_quiet=0.01)


@asynccontextmanager
async def pool_of_sessions(
    tmp_path: Path,
    *,
    start: Callable[[], Awaitable[Executor]] = start,
    store: bool = True,
    killed: bool = False,
    timings: Timings = QUICK,
    **overrides: Any,
) -> AsyncIterator[Sessions]:
    """A Sessions as a server has it, on the store in `tmp_path`/state (a restart: a second one
    on it). `killed`: it ends as a SIGKILL ends it, with no closing checkpoint and its leases left."""
    options = {"interrupt_grace": 0.05, "max_sessions": 20, "hibernate_after": 0, **overrides}
    settings = Settings(**options)
    on = DirectoryStore(tmp_path / "state", max_session_bytes=2**20, max_total_bytes=2**24) if store else None
    async with anyio.create_task_group() as group:
        pool = ReadyPool(start, size=1, task_group=group, acquire_timeout=2)
        backend = FakeBackend()
        sessions = Sessions(settings, pool, backend=backend, store=on, task_group=group, timings=timings)  # type: ignore[arg-type]
        yield sessions
        if not killed:
            await sessions.close()
        await pool.close()
        group.cancel_scope.cancel()


def live(sessions: Sessions) -> set[str]:
    return {name for name in "abc" if sessions.state(name) in WITH_SANDBOX}


async def test_the_least_recently_used_session_is_hibernated_and_comes_back_whole(tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path, max_live_sandboxes=2) as sessions:
        for name in ("a", "b", "c"):
            await sessions.run(f"{name}1", timeout=1, session_id=name)
        assert live(sessions) == {"b", "c"}, "a, the least recently used, made room"
        again = await sessions.run("a2", timeout=1, session_id="a")
        assert again.result == '["a1", "a2"]'
        assert not again.session_restored and not again.notes, "hibernation is silent"
        assert live(sessions) == {"c", "a"}


async def test_a_checkpoint_in_progress_does_not_spare_the_least_recently_used_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StatefulExecutor, "checkpoint_seconds", 0.3)
    async with pool_of_sessions(tmp_path, max_live_sandboxes=2) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await anyio.sleep(0.1)  # a's idle-time checkpoint is under way
        await sessions.run("b1", timeout=1, session_id="b")
        await sessions.run("c1", timeout=1, session_id="c")
        assert live(sessions) == {"b", "c"}, "a went once its checkpoint was written, not b"
        assert (await sessions.run("a2", timeout=1, session_id="a")).result == '["a1", "a2"]'


async def test_a_session_that_cannot_be_saved_whole_stays_live(tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path, max_live_sandboxes=2) as sessions:
        await sessions.run("unsaveable", timeout=1, session_id="a")
        await sessions.run("b1", timeout=1, session_id="b")
        await sessions.run("c1", timeout=1, session_id="c")
        assert live(sessions) == {"a", "c"}, "b went instead of a"


async def test_an_idle_session_is_hibernated_after_its_time(tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path, hibernate_after=0.1) as sessions:
        async with anyio.create_task_group() as group:
            group.start_soon(sessions.hibernate_idle)
            await sessions.run("a1", timeout=1, session_id="a")
            with anyio.fail_after(3):
                while live(sessions):
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        assert (await sessions.run("a2", timeout=1, session_id="a")).result == '["a1", "a2"]'


async def test_a_killed_session_comes_back_from_its_last_checkpoint(tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await anyio.sleep(0.2)  # its checkpoint
        await sessions.run("a2", timeout=1, session_id="a")
        killed = await sessions.run("die", timeout=1, session_id="a")  # before a2's checkpoint
        assert killed.session_restored and not killed.session_lost and killed.restored_from_call == 1
        assert (await sessions.run("a3", timeout=1, session_id="a")).result == '["a1", "a3"]'


async def test_a_hibernated_session_whose_state_is_damaged_says_it_is_lost(tmp_path: Path) -> None:
    async with pool_of_sessions(tmp_path, max_live_sandboxes=1) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        await sessions.run("b1", timeout=1, session_id="b")  # a is hibernated
        for path in (tmp_path / "state" / "sessions").glob("*.state"):
            path.write_bytes(b"garbage")
        back = await sessions.run("a2", timeout=1, session_id="a")
        assert back.session_lost and back.result == '["a2"]', back
        assert any("could not be used" in note for note in back.notes), back.notes


async def test_a_checkpoint_of_another_build_is_refused_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with pool_of_sessions(tmp_path) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
    # The server restarts on another build (another Pyodide, runner or guest): its memory layout differs.
    monkeypatch.setattr(FakeBackend, "build", "fake-2")
    async with pool_of_sessions(tmp_path) as sessions:
        back = await sessions.run("a2", timeout=1, session_id="a")
    assert back.session_lost and back.result == '["a2"]', back
    refused = "another sandbox build (fake-1; this server runs fake-2)"
    assert any(refused in note for note in back.notes), back.notes


class RefusingExecutor(StatefulExecutor):
    """Its checkpoints are refused, with a reason for the caller."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = anyio.Event()

    async def checkpoint(self) -> Checkpoint | NotDone:
        self.refused.set()
        return NotDone("it holds an open socket")


async def test_a_refused_checkpoint_is_said_once_in_the_next_result(tmp_path: Path) -> None:
    started: list[RefusingExecutor] = []

    async def refusing(principal: str | None = None) -> Executor:
        started.append(RefusingExecutor())
        return started[-1]

    async with pool_of_sessions(tmp_path, start=refusing) as sessions:
        await sessions.run("a1", timeout=1, session_id="a")
        (executor,) = [executor for executor in started if executor.ran]
        with anyio.fail_after(5):
            await executor.refused.wait()
        executor.refused = anyio.Event()
        second = await sessions.run("a2", timeout=1, session_id="a")
        assert second.notes == [
            "the session's state after call 1 was not checkpointed: it holds an open socket"
        ], second.notes
        with anyio.fail_after(5):
            await executor.refused.wait()
        third = await sessions.run("a3", timeout=1, session_id="a")
        assert not third.notes, "the same refusal is said once"
        assert sessions.saved_call("a") == 0
