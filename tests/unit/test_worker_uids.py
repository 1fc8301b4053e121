"""Worker uids are the host's: two servers on one machine never hand out the same one."""

from __future__ import annotations

import errno

import pytest

from mcp_sandbox.backends.subprocess.isolation import WorkerUids


def test_two_servers_share_the_range_without_sharing_a_uid() -> None:
    first, second = WorkerUids(64990, 64991), WorkerUids(64990, 64991)
    assert first.take() == 64990
    assert second.take() == 64991  # 64990 is locked by the first
    with pytest.raises(OSError) as full:
        second.take()
    assert full.value.errno == errno.EAGAIN and "MCP_SANDBOX_WORKER_UIDS" in str(full.value)
    first.give_back(64990)
    assert second.take() == 64990
    second.give_back(64990)
    second.give_back(64991)
