"""What a program's print() and input() reach: streams that keep a capped head and tail, and a
stdin with nothing to read."""

from __future__ import annotations

import io
from collections.abc import Callable
from time import monotonic

from mcp_sandbox.protocol import MAX_PROGRESS_LINE_CHARS, PROGRESS_EVERY_S, TRUNCATION_MARKER, KeptText


class CappedText(io.TextIOBase):
    """A text stream that keeps the head and the tail, so a flood never fills memory.

    Keeps ``limit`` characters at most: the first half and the last half of everything
    written, and counts what falls between them.
    """

    def __init__(self, limit: int, on_line: Callable[[str], None] | None = None, keep: int = 0) -> None:
        """`keep`: also keep this many characters from the start whole, for when the stream is cut."""
        self._on_line = on_line
        self._keep_limit = keep
        self._kept: list[str] = []
        self._kept_len = 0
        self._partial = ""
        self._reported = float("-inf")  # the first line goes at once: a clock may start near 0
        self._head_limit = limit - limit // 2
        self._tail_limit = limit // 2
        self._head: list[str] = []
        self._head_len = 0
        self._tail: list[str] = []
        self._tail_len = 0
        self.total = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        length = len(text)
        self.total += length
        if self._on_line is not None:
            self._note_line(text)
        if self._kept_len < self._keep_limit:
            piece = text[: self._keep_limit - self._kept_len]
            self._kept.append(piece)
            self._kept_len += len(piece)
        room = self._head_limit - self._head_len
        if room > 0:
            self._head.append(text[:room])
            self._head_len += min(room, length)
            text = text[room:]
        if text and self._tail_limit:
            self._tail.append(text[-self._tail_limit :])
            self._tail_len += min(len(text), self._tail_limit)
            if self._tail_len > 2 * self._tail_limit:
                # Compact rarely, so many small writes stay cheap.
                joined = "".join(self._tail)[-self._tail_limit :]
                self._tail = [joined]
                self._tail_len = len(joined)
        return length

    def _note_line(self, text: str) -> None:
        """Tell the host the latest complete line, at most twice a second (for progress reports)."""
        if "\n" not in text:
            self._partial = (self._partial + text)[-MAX_PROGRESS_LINE_CHARS:]
            return
        lines = text.split("\n")
        line = (self._partial + lines[0]) if len(lines) == 2 else lines[-2]
        self._partial = lines[-1][-MAX_PROGRESS_LINE_CHARS:]
        now = monotonic()
        if now - self._reported >= PROGRESS_EVERY_S and self._on_line is not None:
            self._reported = now
            self._on_line(line[-MAX_PROGRESS_LINE_CHARS:])

    @property
    def truncated(self) -> bool:
        return self.total > self._head_limit + self._tail_limit

    def kept(self) -> KeptText | None:
        """The text from its start, up to the keep limit, when the stream was cut; else None."""
        if not self.truncated or not self._keep_limit:
            return None
        return {"text": "".join(self._kept), "total": self.total}

    def getvalue(self) -> str:
        head = "".join(self._head)
        if not self.truncated:
            return head + "".join(self._tail)
        tail = "".join(self._tail)[-self._tail_limit :] if self._tail_limit else ""
        cut = self.total - len(head) - len(tail)
        return head + TRUNCATION_MARKER.format(cut=cut) + tail


class NoInput(io.TextIOBase):
    """A sandbox's stdin: nobody is there to type, so reading fails at once instead of waiting
    for the timeout."""

    MESSAGE = (
        "there is no input in the sandbox: input() and sys.stdin have nothing to read "
        "(put the data in the code, or read it from data/)"
    )

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        raise EOFError(self.MESSAGE)

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        raise EOFError(self.MESSAGE)

    def fileno(self) -> int:
        raise io.UnsupportedOperation(self.MESSAGE)


NO_INPUT = NoInput()
