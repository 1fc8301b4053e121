"""The directory store's own ways (files, modes, damage of a state file, a full disk); what every
store does is tests/integration/test_store_contract.py."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from mcp_sandbox.store import MAGIC, DirectoryStore, SavedState, StateUnusable, StoreError
from mcp_sandbox.store import directory as directory_module

pytestmark = pytest.mark.anyio

STATE = SavedState("pyodide", "build-1", b"\x00" * 100_000 + b"state" * 1000, call=3, lost=("open files",))


def make(root: Path, session_mb: int = 8, total_mb: int = 64) -> DirectoryStore:
    return DirectoryStore(root, max_session_bytes=session_mb * 2**20, max_total_bytes=total_mb * 2**20)


def state_file(root: Path) -> Path:
    (path,) = (root / "sessions").glob("*.state")
    return path


async def test_files_are_the_owners_alone(tmp_path: Path) -> None:
    root = tmp_path / "state"
    await make(root).save("s", STATE)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "sessions").stat().st_mode) == 0o700
    assert stat.S_IMODE(state_file(root).stat().st_mode) == 0o600


async def test_a_session_id_never_becomes_a_path(tmp_path: Path) -> None:
    root = tmp_path / "state"
    await make(root).save("../../escape", STATE)
    assert [path.parent for path in root.rglob("*.state")] == [root / "sessions"]
    assert "escape" not in state_file(root).name


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda data: data[: len(data) // 2], "cut short"),
        (lambda data: b"something else entirely\n" + data, "not a state file"),
        (lambda data: MAGIC + b"{not json\n" + data[len(MAGIC) :], "header is damaged"),
        (lambda data: data[:-10] + bytes(b ^ 0xFF for b in data[-10:]), "do not match their hash"),
        (lambda data: data.replace(b"mcp-sandbox state 1", b"mcp-sandbox state 9"), "not a state file"),
        (lambda data: b"", "not a state file"),
    ],
    ids=["truncated", "foreign", "bad-header", "tampered", "other-version", "empty"],
)
async def test_an_unusable_file_is_refused_with_the_reason(tmp_path: Path, damage, said: str) -> None:  # type: ignore[no-untyped-def]
    store = make(tmp_path / "state")
    await store.save("s", STATE)
    path = state_file(tmp_path / "state")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StateUnusable, match=said):
        await store.load("s")


async def test_a_file_moved_to_another_session_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = make(root)
    await store.save("victim", STATE)
    await store.save("attacker", SavedState("pyodide", "build-1", b"attacker's", call=1))
    paths = {path.stat().st_size: path for path in (root / "sessions").glob("*.state")}
    small, large = sorted(paths)
    paths[small].replace(paths[large])  # the attacker's file in the victim's place
    with pytest.raises(StateUnusable, match="another session"):
        await store.load("victim")


async def test_over_the_session_cap_no_file_is_written(tmp_path: Path) -> None:
    store = make(tmp_path / "state", session_mb=1)
    with pytest.raises(StoreError, match="MCP_SANDBOX_MAX_STATE_MB"):
        await store.save("s", SavedState("pyodide", "b", os.urandom(2 * 2**20), call=1))
    assert list((tmp_path / "state" / "sessions").iterdir()) == []


async def test_over_the_total_cap_the_old_state_stays(tmp_path: Path) -> None:
    store = make(tmp_path / "state", session_mb=2, total_mb=2)
    first = SavedState("pyodide", "b", os.urandom(2**20), call=1)
    await store.save("one", first)
    await store.save("one", SavedState("pyodide", "b", os.urandom(2**20), call=2))  # replacing fits
    with pytest.raises(StoreError, match="MCP_SANDBOX_MAX_STORE_MB"):
        await store.save("two", SavedState("pyodide", "b", os.urandom(int(1.5 * 2**20)), call=1))
    assert await store.load("one") is not None and await store.load("two") is None


async def test_a_full_disk_leaves_the_last_state_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "state"
    store = make(root)
    await store.save("s", STATE)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(directory_module.os, "fsync", full)
    with pytest.raises(StoreError, match=r"disk .* is full"):
        await store.save("s", SavedState("pyodide", "build-1", b"newer", call=4))
    assert [path.name for path in (root / "sessions").iterdir()] == [state_file(root).name]
    assert await store.load("s") == STATE


async def test_the_operators_folder_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    await make(root).save("s", STATE)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755, "only the store's own folder is made private"
    assert stat.S_IMODE((root / "sessions").stat().st_mode) == 0o700


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"session_id": "other", "call": 2, "owner": "x"}'])
async def test_a_damaged_record_reads_as_a_session_that_ran(tmp_path: Path, content: bytes) -> None:
    store = make(tmp_path / "state")
    await store.write_record("s", 5, "host:1:ab")
    (path,) = (tmp_path / "state" / "records").glob("*.record")
    path.write_bytes(content)
    record = await store.read_record("s")
    assert record is not None and record.call >= 1, "nothing is lost unsaid"


async def test_a_released_lease_gets_a_fence_past_what_it_wrote(tmp_path: Path) -> None:
    """The lease file goes with a release; the state's header still carries the fence."""
    store = make(tmp_path / "state")
    first = await store.acquire_lease("s", "one", 30)
    await store.save("s", STATE, first)
    await store.release_lease(first)
    assert (await store.acquire_lease("s", "two", 30)).fence > first.fence
