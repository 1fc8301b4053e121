"""The stdio wire's lines, read from a pipe without a thread."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.stdio import _lines, _pollable

pytestmark = pytest.mark.anyio


async def lines_of(*writes: bytes) -> list[str]:
    """What `_lines` yields for a pipe written in these pieces, then closed."""
    read, write = os.pipe()
    got: list[str] = []
    try:

        async def reader() -> None:
            async for line in _lines(read):
                got.append(line)

        async with anyio.create_task_group() as group:
            group.start_soon(reader)
            for piece in writes:  # from a thread: a piece may be more than the pipe holds
                await anyio.to_thread.run_sync(os.write, write, piece)
            os.close(write)
            write = -1
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    return got


async def test_lines_split_anywhere_come_back_whole() -> None:
    text = '{"a": "é"}\n{"b": 2}\n'.encode()
    cut = text.index("é".encode()) + 1  # between the two bytes of é
    assert await lines_of(text[:cut], text[cut:]) == ['{"a": "é"}\n', '{"b": 2}\n']


async def test_many_lines_in_one_read_and_a_last_line_without_its_newline() -> None:
    assert await lines_of(b"1\n2\n3\n4") == ["1\n", "2\n", "3\n", "4"]


async def test_bytes_that_are_not_utf8_are_replaced_not_fatal() -> None:
    assert await lines_of(b"\xff\xfe ok\n") == ["\ufffd\ufffd ok\n"]


async def test_a_line_longer_than_one_read() -> None:
    long = "x" * 200_000
    assert await lines_of(long.encode()[:70_000], long.encode()[70_000:] + b"\n") == [long + "\n"]


def test_a_pipe_is_read_in_the_event_loop_a_file_or_the_null_device_by_the_sdk(tmp_path: Path) -> None:
    read, write = os.pipe()
    file = os.open(tmp_path / "requests.jsonl", os.O_RDONLY | os.O_CREAT)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        assert (_pollable(read), _pollable(file), _pollable(null)) == (True, False, False)
    finally:
        for fd in (read, write, file, null):
            os.close(fd)
