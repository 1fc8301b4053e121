"""A session's lifecycle: the timings it runs on."""

from __future__ import annotations

from dataclasses import dataclass


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
