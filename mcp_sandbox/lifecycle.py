"""A session's lifecycle: its states and the moves between them, what its next result says
after it got a new sandbox (`account`, `said`), and the timings it runs on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import anyio

from mcp_sandbox.backends.base import Executor
from mcp_sandbox.principals import SOLE
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.store import Lease, SavedState


@dataclass(frozen=True)
class Timings:
    """How long the session lifecycle waits, in seconds (tests pass shorter ones)."""

    #: How often idle sessions are looked for, at most.
    sweep_interval: float = 5.0
    #: Between progress reports of a running call.
    progress_interval: float = 1.0
    #: A session is checkpointed once it has been idle this long: calls sent back to back never
    #: wait behind one, and a busy session is not checkpointed between every two calls (an
    #: agent's turn between calls takes longer).
    checkpoint_quiet: float = 2.0
    #: A server that stops checkpoints the sessions that ran since their last checkpoint, for at
    #: most this long in all (a stop is the first half of a restart or of a move to another instance).
    closing_save: float = 10.0


class SessionState(Enum):
    """Where a session's state is. Only a live or checkpointing session has a sandbox; the others
    get one at their next call, and `account` says what that call's result tells the caller."""

    #: Never ran on this instance (the store's record and checkpoint say what it had), or started
    #: fresh, or was reset.
    NEW = "new"
    #: Its sandbox holds its state.
    LIVE = "live"
    #: Live, and an idle-time checkpoint holds its lock: soon free, so worth waiting for.
    CHECKPOINTING = "checkpointing"
    #: This instance wrote its whole state to the store and gave its sandbox back.
    HIBERNATED = "hibernated"
    #: Another instance took its lease: the store's state is the one to go on from.
    MOVED = "moved"
    #: Its sandbox died (killed, crashed, found dead between calls).
    LOST = "lost"


#: The states whose session has a sandbox.
WITH_SANDBOX = frozenset({SessionState.LIVE, SessionState.CHECKPOINTING})

#: Every state a session can go to from each state; any other move is a bug.
TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    # Given a sandbox: a clean one, or one its checkpoint was restored into.
    SessionState.NEW: frozenset({SessionState.LIVE}),
    SessionState.HIBERNATED: frozenset({SessionState.LIVE}),
    SessionState.MOVED: frozenset({SessionState.LIVE}),
    # Or, with nothing to restore, told it starts fresh (new) before it gets one.
    SessionState.LOST: frozenset({SessionState.LIVE, SessionState.NEW}),
    # Reset (new), an idle-time checkpoint, written out, taken over by another instance, died.
    SessionState.LIVE: frozenset(
        {
            SessionState.NEW,
            SessionState.CHECKPOINTING,
            SessionState.HIBERNATED,
            SessionState.MOVED,
            SessionState.LOST,
        }
    ),
    SessionState.CHECKPOINTING: frozenset({SessionState.LIVE}),
}


@dataclass(frozen=True)
class Saved:
    """What the store holds of a session: its state after `call` (0: none), less `lost` (what
    the checkpoint could not carry; empty: the whole state)."""

    call: int = 0
    lost: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refusal:
    """A checkpoint the backend or the store refused: why, in words for the caller (said once
    rather than after every call), and at which call (asked again only once another ran)."""

    reason: str
    call: int


@dataclass(eq=False)
class Session:
    """One session: its state, its sandbox while it has one, and what the store holds of it.
    Its state and sandbox change together, only through `to`."""

    session_id: str
    #: Whose it is: its sandboxes serve this principal only.
    principal: str = SOLE
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    #: Calls that ran to an end in this session (its state is "after call `calls`").
    calls: int = 0
    #: What the store holds of it.
    saved: Saved = field(default_factory=Saved)
    #: The call the store's record was last written with (-1: write it at the next call). The
    #: record needs writing only when it does not show the session past its checkpoint yet.
    recorded: int = -1
    #: Said in the session's next result: what happened to it in between (a checkpoint refused).
    notes: list[str] = field(default_factory=list)
    #: Its last checkpoint, refused since the store's copy was written (None: not refused).
    refusal: Refusal | None = None
    #: This instance's right to run it (instances sharing a state folder); held while it is live.
    lease: Lease | None = None
    #: Another instance ran it and stopped without giving it up (named in what is said).
    moved_from: str | None = None
    _state: SessionState = field(default=SessionState.NEW, init=False)
    _executor: Executor | None = field(default=None, init=False, repr=False)

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def executor(self) -> Executor | None:
        """Its sandbox: set exactly while it is live or checkpointing."""
        return self._executor

    @property
    def live(self) -> bool:
        return self._state in WITH_SANDBOX

    @property
    def record_is_current(self) -> bool:
        """The store's record shows the session past its checkpoint, at a call it has reached:
        any later call leaves a record beyond the checkpoint, which is all a restore needs."""
        return self.saved.call < self.recorded <= self.calls

    def to(self, state: SessionState, executor: Executor | None = None) -> Executor | None:
        """Move to `state`, with `executor` when it gets a sandbox; the sandbox it gives up, for the
        caller to give back or close (None: it had none, or keeps it). Raises AssertionError for
        a move `TRANSITIONS` does not have."""
        assert state in TRANSITIONS[self._state], (
            f"session {self.session_id!r}: {self._state.value} -> {state.value} is not a transition"
        )
        gets, had = state in WITH_SANDBOX, self._state in WITH_SANDBOX
        assert (executor is not None) == (gets and not had), "a sandbox is given exactly on going live"
        given_up = self._executor if had and not gets else None
        if executor is not None:
            self._executor = executor
        elif not gets:
            self._executor = None
        self._state = state
        return given_up

    def restored(self, executor: Executor, state: SavedState) -> None:
        """Go live in `executor`, which holds checkpoint `state`: the session is at that call, saved."""
        self.to(SessionState.LIVE, executor)
        self.calls, self.saved, self.refusal = state.call, Saved(state.call, state.lost), None

    def give_up(self, state: SessionState) -> Executor:
        """Move from a live state to `state`, which has no sandbox: the sandbox it had, for the
        caller to give back or close."""
        executor = self.to(state)
        assert executor is not None, f"session {self.session_id!r} had no sandbox to give up"
        return executor


@dataclass
class Resumed:
    """What the result of a call that gave a session a new sandbox says: restored from its
    checkpoint after `from_call`, lost, or nothing (a new session, or hibernated and back whole)."""

    from_call: int | None = None
    notes: list[str] = field(default_factory=list)
    #: Its variables are gone: the session starts fresh.
    lost: bool = False

    @property
    def said_nothing(self) -> bool:
        return self.from_call is None and not self.lost and not self.notes


def account(
    state: SessionState,
    latest: int,
    restored: SavedState | None,
    problem: str | None,
    ran_on: str | None,
) -> Resumed:
    """What a session's next result says, once it has a new sandbox. `latest` is its latest call
    as far as known (0: it never ran, or started fresh since): exact when this instance ran it
    all along, a lower bound from the store's record otherwise. `restored` is the checkpoint now
    in the sandbox (None: none, or `problem` says why it could not be used), `ran_on` another
    instance it ran on.

    The one rule: the result is silent only when the session holds exactly the state its caller
    last saw and nothing happened to it but hibernation; any other change is said.
    """
    elsewhere = f" on another server process ({ran_on}) that stopped" if ran_on else ""
    if restored is not None:
        return _restored(state, latest, restored, elsewhere)
    if problem is not None:
        return Resumed(notes=[f"{problem}, so it starts fresh"], lost=True)
    if state is SessionState.LOST:
        return Resumed(notes=["the session had no checkpoint yet, so its variables are gone"], lost=True)
    if latest == 0:
        return Resumed()  # a new session, or one that started fresh and has not run since
    if state is SessionState.HIBERNATED:
        said = "the session's hibernated state is gone from the store, so its variables are gone"
    else:
        said = (
            f"the session ran{elsewhere or ' on a server process that stopped'} before its first checkpoint"
        )
        said += ", so its variables are gone"
    return Resumed(notes=[said], lost=True)


def _restored(state: SessionState, latest: int, restored: SavedState, elsewhere: str) -> Resumed:
    """What a session's next result says once its checkpoint is back (`account`)."""
    call = restored.call
    if state is SessionState.HIBERNATED and call == latest and not restored.lost:
        return Resumed()
    said = f"the session was restored from its checkpoint after call {call}"
    if elsewhere:
        said += f"; it ran{elsewhere}"
    if call < latest:
        said += "; what later calls did is gone"
        if state in (SessionState.HIBERNATED, SessionState.LOST):  # this instance knows them all
            said += f" (call {latest})" if latest == call + 1 else f" (calls {call + 1} to {latest})"
    return Resumed(from_call=call, notes=[said, *restored.lost])


def said(result: ExecutionResult, session: Session, resumed: Resumed, notes: list[str]) -> ExecutionResult:
    """The result as its caller gets it: what getting a sandbox said (a restore, a loss), the
    session's own notes since its last call, `notes` of the settling, and the run's."""
    update: dict[str, object] = {
        "session_id": session.session_id,
        "notes": [*session.notes, *resumed.notes, *notes, *result.notes],
    }
    session.notes.clear()
    if resumed.from_call is not None:
        update |= {"session_lost": False, "session_restored": True, "restored_from_call": resumed.from_call}
    if resumed.lost:
        update["session_lost"] = True
    return result.model_copy(update=update)
