"""The guest's stdin and its waits, in this interpreter, with a recording `wait` in place of the
Pyodide worker's."""

from __future__ import annotations

import builtins
import queue
import select
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from mcp_sandbox import guest


@pytest.fixture
def waits() -> Iterator[list[float]]:
    """The waits asked for, each in seconds; the standard library is put back afterwards."""
    saved = time.sleep, select.select, threading._allocate_lock  # type: ignore[attr-defined]
    asked: list[float] = []
    guest.install_waits(asked.append)
    try:
        yield asked
    finally:
        time.sleep, select.select, threading._allocate_lock = saved  # type: ignore[attr-defined]


def test_time_sleep_waits(waits: list[float]) -> None:
    time.sleep(0.25)
    assert waits == [0.25]
    with pytest.raises(ValueError, match="non-negative"):
        time.sleep(-1)


def test_select_without_files_waits_for_its_timeout(waits: list[float]) -> None:
    assert select.select([], [], [], 0.5) == ([], [], [])
    select.select([], [], [])
    assert waits == [0.5, float("inf")]


def test_threading_and_queue_waits_wait(waits: list[float]) -> None:
    assert threading.Event().wait(0.3) is False
    with pytest.raises(queue.Empty):
        queue.Queue().get(timeout=0.2)
    assert waits[0] == 0.3 and 0 < waits[1] <= 0.2


def test_a_set_event_does_not_wait(waits: list[float]) -> None:
    event = threading.Event()
    event.set()
    assert event.wait(5) is True and waits == []


def test_input_fails_at_once_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", guest.NO_INPUT)
    with pytest.raises(EOFError, match="there is no input in the sandbox"):
        builtins.input()
    with pytest.raises(EOFError, match="no input"):
        sys.stdin.read()
