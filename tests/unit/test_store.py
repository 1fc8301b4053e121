"""The saved-session store: what it writes, and every way a state file can be unusable."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from mcp_sandbox import store as store_module
from mcp_sandbox.store import (
    MAGIC,
    DirectoryStore,
    LeaseTaken,
    SavedState,
    SessionRecord,
    StateUnusable,
    StoreError,
)

STATE = SavedState("pyodide", "build-1", b"\x00" * 100_000 + b"state" * 1000, call=3, lost=("open files",))


def make(root: Path, session_mb: int = 8, total_mb: int = 64) -> DirectoryStore:
    return DirectoryStore(root, max_session_bytes=session_mb * 2**20, max_total_bytes=total_mb * 2**20)


def state_file(root: Path) -> Path:
    (path,) = (root / "sessions").glob("*.state")
    return path


def test_a_saved_state_comes_back_whole(tmp_path: Path) -> None:
    store = make(tmp_path / "state")
    stored = store.save("agent:1", STATE)
    assert stored < len(STATE.payload) / 10, "mostly empty memory compresses"
    assert store.load("agent:1") == STATE
    assert store.load("another") is None


def test_files_are_the_owners_alone(tmp_path: Path) -> None:
    root = tmp_path / "state"
    make(root).save("s", STATE)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "sessions").stat().st_mode) == 0o700
    assert stat.S_IMODE(state_file(root).stat().st_mode) == 0o600


def test_a_session_id_never_becomes_a_path(tmp_path: Path) -> None:
    root = tmp_path / "state"
    make(root).save("../../escape", STATE)
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
def test_an_unusable_file_is_refused_with_the_reason(tmp_path: Path, damage, said: str) -> None:  # type: ignore[no-untyped-def]
    store = make(tmp_path / "state")
    store.save("s", STATE)
    path = state_file(tmp_path / "state")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(StateUnusable, match=said):
        store.load("s")


def test_a_file_moved_to_another_session_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "state"
    store = make(root)
    store.save("victim", STATE)
    store.save("attacker", SavedState("pyodide", "build-1", b"attacker's", call=1))
    paths = {path.stat().st_size: path for path in (root / "sessions").glob("*.state")}
    small, large = sorted(paths)
    paths[small].replace(paths[large])  # the attacker's file in the victim's place
    with pytest.raises(StateUnusable, match="another session"):
        store.load("victim")


def test_over_the_session_cap_nothing_is_written(tmp_path: Path) -> None:
    store = make(tmp_path / "state", session_mb=1)
    with pytest.raises(StoreError, match="MCP_SANDBOX_MAX_STATE_MB"):
        store.save("s", SavedState("pyodide", "b", os.urandom(2 * 2**20), call=1))
    assert list((tmp_path / "state" / "sessions").iterdir()) == []


def test_over_the_total_cap_the_old_state_stays(tmp_path: Path) -> None:
    store = make(tmp_path / "state", session_mb=2, total_mb=2)
    first = SavedState("pyodide", "b", os.urandom(2**20), call=1)
    store.save("one", first)
    store.save("one", SavedState("pyodide", "b", os.urandom(2**20), call=2))  # replacing fits
    with pytest.raises(StoreError, match="MCP_SANDBOX_MAX_STORE_MB"):
        store.save("two", SavedState("pyodide", "b", os.urandom(int(1.5 * 2**20)), call=1))
    assert store.load("one") is not None and store.load("two") is None


def test_a_full_disk_leaves_the_last_state_and_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "state"
    store = make(root)
    store.save("s", STATE)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_module.os, "fsync", full)
    with pytest.raises(StoreError, match=r"disk .* is full"):
        store.save("s", SavedState("pyodide", "build-1", b"newer", call=4))
    assert [path.name for path in (root / "sessions").iterdir()] == [state_file(root).name]
    assert store.load("s") == STATE


def test_delete_forgets_a_session(tmp_path: Path) -> None:
    store = make(tmp_path / "state")
    store.save("s", STATE)
    store.delete("s")
    store.delete("s")  # twice is fine
    assert store.load("s") is None


def test_the_operators_folder_keeps_its_mode(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    make(root).save("s", STATE)
    assert stat.S_IMODE(root.stat().st_mode) == 0o755, "only the store's own folder is made private"
    assert stat.S_IMODE((root / "sessions").stat().st_mode) == 0o700


def test_a_record_holds_a_sessions_latest_call_until_it_is_deleted(tmp_path: Path) -> None:
    store = make(tmp_path / "state")
    assert store.read_record("s") is None, "a session that never ran has no record"
    store.write_record("s", 3, "host:1:ab")
    assert store.read_record("s") == SessionRecord(3, "host:1:ab")
    store.save("s", STATE)
    store.delete_checkpoint("s")
    assert store.load("s") is None and store.read_record("s") == SessionRecord(3, "host:1:ab")
    store.delete("s")
    assert store.read_record("s") is None


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"session_id": "other", "call": 2, "owner": "x"}'])
def test_a_damaged_record_reads_as_a_session_that_ran(tmp_path: Path, content: bytes) -> None:
    store = make(tmp_path / "state")
    store.write_record("s", 5, "host:1:ab")
    (path,) = (tmp_path / "state" / "records").glob("*.record")
    path.write_bytes(content)
    record = store.read_record("s")
    assert record is not None and record.call >= 1, "nothing is lost unsaid"


def test_a_record_is_written_only_under_the_lease_it_names(tmp_path: Path) -> None:
    store = make(tmp_path / "state")
    lease = store.acquire_lease("s", "one", 30)
    store.write_record("s", 1, "one", lease)
    store.release_lease(lease)
    store.acquire_lease("s", "two", 30)
    with pytest.raises(LeaseTaken):
        store.write_record("s", 2, "one", lease)
    assert store.read_record("s") == SessionRecord(1, "one")
