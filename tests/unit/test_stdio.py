"""The stdio wire's lines, read from a pipe without a thread."""

from __future__ import annotations

import os

import anyio
import pytest

from mcp_sandbox.stdio import _lines

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
