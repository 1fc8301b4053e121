"""A session's states and the moves between them: every move in the table works and carries its
sandbox along, every other move is refused (what each state makes a result say:
test_session_continuity.py)."""

from __future__ import annotations

import itertools

import pytest

from mcp_sandbox.lifecycle import TRANSITIONS, WITH_SANDBOX, Session, SessionState
from tests.unit.fakes import FakeExecutor

#: How a new session reaches each state, through moves of the table.
PATHS: dict[SessionState, list[SessionState]] = {
    SessionState.NEW: [],
    SessionState.LIVE: [SessionState.LIVE],
    SessionState.CHECKPOINTING: [SessionState.LIVE, SessionState.CHECKPOINTING],
    SessionState.HIBERNATED: [SessionState.LIVE, SessionState.HIBERNATED],
    SessionState.MOVED: [SessionState.LIVE, SessionState.MOVED],
    SessionState.LOST: [SessionState.LIVE, SessionState.LOST],
}

LEGAL = [(start, end) for start, ends in TRANSITIONS.items() for end in sorted(ends, key=lambda s: s.value)]
ILLEGAL = [pair for pair in itertools.product(SessionState, repeat=2) if pair not in LEGAL]


def session_in(state: SessionState) -> Session:
    session = Session("s")
    for step in PATHS[state]:
        session.to(step, FakeExecutor() if step in WITH_SANDBOX and not session.live else None)
    assert session.state is state
    return session


def test_every_state_has_its_moves_and_a_way_there() -> None:
    assert set(TRANSITIONS) == set(SessionState) == set(PATHS)


@pytest.mark.parametrize(("start", "end"), LEGAL, ids=[f"{a.value}->{b.value}" for a, b in LEGAL])
def test_a_move_of_the_table_carries_the_sandbox_along(start: SessionState, end: SessionState) -> None:
    session = session_in(start)
    had = session.executor
    gets = end in WITH_SANDBOX and start not in WITH_SANDBOX
    given = FakeExecutor() if gets else None
    gave_up = session.to(end, given)
    assert session.state is end
    assert session.live == (end in WITH_SANDBOX)
    if gets:
        assert session.executor is given and gave_up is None, "a sandbox-less session is given one"
    elif end in WITH_SANDBOX:
        assert session.executor is had and gave_up is None, "live and checkpointing share the sandbox"
    else:
        assert session.executor is None and gave_up is had, "the sandbox given up goes to the caller"


@pytest.mark.parametrize(("start", "end"), ILLEGAL, ids=[f"{a.value}->{b.value}" for a, b in ILLEGAL])
def test_any_other_move_is_refused(start: SessionState, end: SessionState) -> None:
    session = session_in(start)
    had = session.executor
    given = FakeExecutor() if end in WITH_SANDBOX and start not in WITH_SANDBOX else None
    with pytest.raises(AssertionError, match="is not a transition"):
        session.to(end, given)
    assert session.state is start and session.executor is had


def test_a_session_gets_a_sandbox_exactly_when_it_goes_live() -> None:
    with pytest.raises(AssertionError, match="a sandbox is given"):
        Session("s").to(SessionState.LIVE)
    with pytest.raises(AssertionError, match="a sandbox is given"):
        session_in(SessionState.LIVE).to(SessionState.CHECKPOINTING, FakeExecutor())
    with pytest.raises(AssertionError, match="a sandbox is given"):
        session_in(SessionState.LIVE).to(SessionState.LOST, FakeExecutor())
