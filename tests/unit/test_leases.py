"""Leases on sessions for instances sharing a state folder: exclusive while they run, taken over
once they run out, and never by two instances at once, even racing from separate processes."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest

from mcp_sandbox.store import DirectoryStore, LeaseHeld, LeaseTaken, SavedState

STATE = SavedState("pyodide", "build-1", b"state", call=1)


def make(root: Path) -> DirectoryStore:
    return DirectoryStore(root, max_session_bytes=2**20, max_total_bytes=2**24)


def test_a_held_lease_keeps_other_instances_out_until_released(tmp_path: Path) -> None:
    a, b = make(tmp_path), make(tmp_path)
    lease = a.acquire_lease("s", "instance-a", 30)
    with pytest.raises(LeaseHeld) as held:
        b.acquire_lease("s", "instance-b", 30)
    assert held.value.owner == "instance-a" and "instance-a" in str(held.value)
    assert b.acquire_lease("other", "instance-b", 30).owner == "instance-b", "leases are per session"
    a.release_lease(lease)
    assert b.acquire_lease("s", "instance-b", 30).owner == "instance-b"


def test_a_lease_that_ran_out_is_taken_over_and_its_old_holder_learns_it(tmp_path: Path) -> None:
    a, b = make(tmp_path), make(tmp_path)
    old = a.acquire_lease("s", "instance-a", 0.2)
    time.sleep(0.3)
    new = b.acquire_lease("s", "instance-b", 30)
    assert new.token != old.token
    with pytest.raises(LeaseTaken):
        a.renew_lease(old, 30)
    with pytest.raises(LeaseTaken):
        a.save("s", STATE, old)
    a.release_lease(old)  # not its lease any more: changes nothing
    with pytest.raises(LeaseHeld):
        a.acquire_lease("s", "instance-a", 30)
    assert b.save("s", STATE, new) > 0 and b.load("s") == STATE


def test_an_owner_that_ran_out_unnoticed_keeps_its_token(tmp_path: Path) -> None:
    """Nobody took it meanwhile, so the sandbox the owner kept is still the session's latest."""
    store = make(tmp_path)
    first = store.acquire_lease("s", "instance-a", 0.1)
    time.sleep(0.2)
    again = store.acquire_lease("s", "instance-a", 30)
    assert again.token == first.token and again.expires > first.expires
    renewed = store.renew_lease(again, 60)
    assert renewed.token == first.token and renewed.expires > again.expires


@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"session_id": "other", "owner": "x", "token": "t", "expires": 1e12}']
)
def test_a_damaged_lease_file_is_no_lease(tmp_path: Path, content: bytes) -> None:
    store = make(tmp_path)
    store.acquire_lease("s", "instance-b", 30)
    (path,) = (tmp_path / "leases").glob("*.lease")
    path.write_bytes(content)
    assert store.acquire_lease("s", "instance-a", 30).owner == "instance-a"


def test_old_lease_files_are_swept_and_a_held_lease_protects_its_state(tmp_path: Path) -> None:
    store = make(tmp_path)
    for session in ("held", "abandoned"):
        store.save(session, STATE)
        store.write_record(session, 3, "instance-a")
    store.acquire_lease("held", "instance-a", 30)
    time.sleep(0.3)
    store.acquire_lease("held", "instance-a", 30)  # renewed: its file is new again
    assert store.delete_older_than(0.2, keep=set()) == 1
    assert store.load("held") == STATE and store.load("abandoned") is None
    assert store.read_record("held") is not None and store.read_record("abandoned") is None


def _race(root: str, owner: str, start: float, wins: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = make(Path(root))
    while time.time() < start:
        pass
    taken = 0
    for i in range(30):
        try:
            store.acquire_lease(f"s{i}", owner, 30)
            taken += 1
        except LeaseHeld:
            pass
    wins.put(taken)


def test_instances_racing_for_the_same_leases_never_both_get_one(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    wins: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    start = time.time() + 1.5
    racers = [
        context.Process(target=_race, args=(str(tmp_path), f"instance-{n}", start, wins)) for n in range(4)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=30)
    assert sum(wins.get(timeout=5) for _ in racers) == 30, "each of the 30 leases went to exactly one"


def test_a_renewal_that_crosses_the_owners_own_acquire_is_no_loss(tmp_path: Path) -> None:
    """The background renewal and a call's acquire run in two threads; both are the one owner's."""
    store = make(tmp_path)
    first = store.acquire_lease("s", "instance-a", 30)
    store.acquire_lease("s", "instance-a", 60)
    assert store.renew_lease(first, 30).token == first.token
    assert store.save("s", STATE, first) > 0


def test_a_lease_taken_over_names_the_owner_it_came_from(tmp_path: Path) -> None:
    store = make(tmp_path)
    store.acquire_lease("s", "instance-a", 0.1)
    time.sleep(0.2)
    assert store.acquire_lease("s", "instance-b", 30).taken_from == "instance-a"
    assert store.acquire_lease("fresh", "instance-b", 30).taken_from is None
