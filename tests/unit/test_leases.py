"""The directory store's leases: lease files, their sweep, and instances racing for them from
separate processes; what every store's leases do is tests/integration/test_store_contract.py."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.store import DirectoryStore, LeaseHeld, SavedState

STATE = SavedState("pyodide", "build-1", b"state", call=1)


def make(root: Path) -> DirectoryStore:
    return DirectoryStore(root, max_session_bytes=2**20, max_total_bytes=2**24)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "content", [b"", b"{not json", b'{"session_id": "other", "owner": "x", "token": "t", "expires": 1e12}']
)
async def test_a_damaged_lease_file_is_no_lease(tmp_path: Path, content: bytes) -> None:
    store = make(tmp_path)
    await store.acquire_lease("s", "instance-b", 30)
    (path,) = (tmp_path / "leases").glob("*.lease")
    path.write_bytes(content)
    assert (await store.acquire_lease("s", "instance-a", 30)).owner == "instance-a"


@pytest.mark.anyio
async def test_old_lease_files_are_swept_and_a_held_lease_protects_its_state(tmp_path: Path) -> None:
    store = make(tmp_path)
    for session in ("held", "abandoned"):
        await store.save(session, STATE)
        await store.write_record(session, 3, "instance-a")
    await store.acquire_lease("held", "instance-a", 30)
    await anyio.sleep(0.3)  # the files' age is what the sweep reads
    await store.acquire_lease("held", "instance-a", 30)  # renewed: its file is new again
    assert await store.delete_older_than(0.2, keep=set()) == 1
    assert await store.load("held") == STATE and await store.load("abandoned") is None
    assert await store.read_record("held") is not None and await store.read_record("abandoned") is None


async def _take(store: DirectoryStore, owner: str) -> int:
    taken = 0
    for i in range(30):
        try:
            await store.acquire_lease(f"s{i}", owner, 30)
            taken += 1
        except LeaseHeld:
            pass
    return taken


def _race(root: str, owner: str, start: float, wins: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = make(Path(root))
    time.sleep(max(0.0, start - time.time() - 0.02))  # asleep, not spinning: the racers share two cores
    while time.time() < start:
        pass
    wins.put(anyio.run(_take, store, owner))


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
