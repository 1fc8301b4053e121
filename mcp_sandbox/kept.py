"""The whole of each cut stdout and stderr, and each file a call wrote, kept readable through a
link in the result (`sandbox://kept/<call>/stdout`, `sandbox://kept/<call>/files/<name>`): for as
long as the call's session lives, or `ttl` seconds for a session-less call, within a byte cap that
drops the oldest first and says so."""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote, urlsplit

from mcp_sandbox.result import ExecutionResult, KeptOutput

URI_PREFIX = "sandbox://kept/"
URI_TEMPLATE = URI_PREFIX + "{call}/{stream}{?first,last}"
#: A kept file's link: its name under output/, percent-encoded (slashes too), so it is one segment.
FILE_URI_TEMPLATE = URI_PREFIX + "{call}/files/{name}"
STREAMS = ("stdout", "stderr")
#: Dropped calls remembered, so a dead link says why it is dead rather than "unknown".
REMEMBERED_DROPS = 1000


class KeptOutputMissing(Exception):
    """The link names nothing kept now; the message says why (unknown, expired, dropped)."""


@dataclass
class _Entry:
    #: Whose it is: only this principal reads it.
    principal: str
    #: The session it lives with, by its name inside the server (None: a session-less call's).
    session_key: str | None
    streams: dict[str, KeptOutput]
    #: The files the call wrote, by their name under output/.
    files: dict[str, bytes]
    #: monotonic time it expires (session-less), or None (it lives with its session).
    expires: float | None
    size: int


def line_number(text: str | None) -> int | None:
    """A ?first= or ?last= value. Raises ValueError naming it when it is not a whole number."""
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"a line number is a whole number (negative from the end), not {text!r}") from None


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


class KeptOutputs:
    """Owns every kept output of one App."""

    def __init__(self, max_bytes: int, ttl: float, session_alive: Callable[[str], bool]) -> None:
        self._max_bytes = max_bytes
        self._ttl = ttl
        self._session_alive = session_alive
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        #: (call, its principal, why it was dropped), newest last.
        self._dropped: deque[tuple[str, str, str]] = deque(maxlen=REMEMBERED_DROPS)
        self._bytes = 0

    def keep(self, result: ExecutionResult, principal: str = "", session_key: str | None = None) -> None:
        """Give `result` a link to the whole of each of its cut streams, with a note on what is kept:
        `principal`'s, living with its session (`session_key`, its name inside the server, when
        that is not the result's `session_id`)."""
        kept = result.artifacts.kept_output
        if not (kept or result.files) or not self._max_bytes:
            return
        self._prune()
        call = secrets.token_urlsafe(12)  # unguessable: a link is as private as the session
        streams: dict[str, KeptOutput] = {}
        room = self._max_bytes
        for stream in STREAMS:
            if (output := kept.get(stream)) is None:
                continue
            text = output.text
            if _size(text) > room:
                text = text.encode("utf-8")[:room].decode("utf-8", "ignore")
            room -= _size(text)
            streams[stream] = KeptOutput(text, output.total)
            setattr(result, f"{stream}_uri", f"{URI_PREFIX}{call}/{stream}")
            result.notes.append(self._describe(stream, streams[stream], call, result.session_id))
        files: dict[str, bytes] = {}
        for file in result.files:
            data = result.artifacts.files.get(file.name)
            if data is None or len(data) > room:
                continue  # a file is kept whole or not at all
            room -= len(data)
            files[file.name] = data
            file.uri = f"{URI_PREFIX}{call}/files/{quote(file.name, safe='')}"
        size = self._max_bytes - room
        dropped = 0
        while self._entries and self._bytes + size > self._max_bytes:
            self._drop_oldest("dropped to keep MCP_SANDBOX_MAX_KEPT_OUTPUT_MB")
            dropped += 1
        if dropped:
            result.notes.append(
                f"to stay within MCP_SANDBOX_MAX_KEPT_OUTPUT_MB, the kept output of {dropped} earlier "
                "call(s) was dropped"
            )
        key = session_key if session_key is not None else result.session_id
        expires = None if key else time.monotonic() + self._ttl
        self._entries[call] = _Entry(principal, key, streams, files, expires, size)
        self._bytes += size

    def links(self, principal: str) -> list[tuple[str, int]]:
        """`principal`'s kept outputs, oldest first: (link, characters kept). Another principal's
        are not there."""
        self._prune()
        return [
            (f"{URI_PREFIX}{call}/{stream}", len(output.text))
            for call, entry in self._entries.items()
            if entry.principal == principal
            for stream, output in entry.streams.items()
        ]

    def _describe(self, stream: str, output: KeptOutput, call: str, session_id: str | None) -> str:
        uri = f"{URI_PREFIX}{call}/{stream}"
        lifetime = f"while session {session_id!r} lives" if session_id else f"for {self._ttl:g} s"
        if len(output.text) >= output.total:
            what = f"all {output.total:,} characters are at {uri}"
        else:
            what = (
                f"its first {len(output.text):,} of {output.total:,} characters are at {uri} (the rest "
                "is past MCP_SANDBOX_MAX_KEPT_OUTPUT_CHARS or MCP_SANDBOX_MAX_KEPT_OUTPUT_MB)"
            )
        return f"{stream} was cut; {what}, kept {lifetime}; read lines with ?first=N&last=M"

    def read(
        self, call: str, stream: str, first: int | None = None, last: int | None = None, principal: str = ""
    ) -> str:
        """Lines `first` to `last` (from 1; negative counts from the end) of `principal`'s kept
        stream, or all of it. Raises KeptOutputMissing, or ValueError for a line number of 0."""
        entry = self._entry(call, principal)
        output = entry.streams.get(stream)
        if output is None:
            raise KeptOutputMissing(
                f"{stream!r} of that call was not cut; kept: {', '.join(entry.streams) or 'nothing'}"
            )
        if first is None and last is None:
            return output.text
        if first == 0 or last == 0:
            raise ValueError("lines are numbered from 1, or from -1 at the end")
        lines = output.text.splitlines(keepends=True)
        start = 0 if first is None else (first - 1 if first > 0 else max(len(lines) + first, 0))
        stop = len(lines) if last is None else (last if last > 0 else len(lines) + last + 1)
        return "".join(lines[start:stop])

    def read_file(self, call: str, name: str, principal: str = "") -> bytes:
        """`principal`'s kept file `name` (as its link has it, percent-encoded) of `call`. Raises
        KeptOutputMissing."""
        entry = self._entry(call, principal)
        data = entry.files.get(unquote(name))
        if data is None:
            raise KeptOutputMissing(
                f"that call kept no file {unquote(name)!r}; kept: {', '.join(entry.files) or 'no file'}"
            )
        return data

    def _entry(self, call: str, principal: str) -> _Entry:
        """`principal`'s entry of `call`. Raises KeptOutputMissing, saying why it is not there."""
        self._prune()
        entry = self._entries.get(call)
        if entry is not None and entry.principal != principal:
            entry = None  # another principal's: to this caller, it is not there
        if entry is None:
            why = next(
                (
                    reason
                    for dropped, owner, reason in self._dropped
                    if dropped == call and owner == principal
                ),
                None,
            )
            raise KeptOutputMissing(
                f"{URI_PREFIX}{call} is no longer kept: {why}"
                if why
                else f"nothing is kept as {URI_PREFIX}{call}: the link is mistyped, or from before a restart"
            )
        return entry

    def read_uri(self, uri: str, principal: str = "") -> str:
        """`read` for a link as a result gives it, with ?first=N&last=M or not. Raises
        KeptOutputMissing, or ValueError for a link that is not one."""
        parts = urlsplit(uri)
        path = f"{parts.scheme}://{parts.netloc}{parts.path}"
        call, _, stream = path.removeprefix(URI_PREFIX).partition("/")
        if not path.startswith(URI_PREFIX) or not call or stream not in STREAMS:
            raise ValueError(f"not a kept-output link: {uri!r} (they look like {URI_PREFIX}<call>/stdout)")
        query = parse_qs(parts.query)
        first, last = (line_number(query.get(name, [None])[-1]) for name in ("first", "last"))
        return self.read(call, stream, first, last, principal)

    def forget_session(self, session_key: str) -> None:
        """Drop what a session kept (it was reset); `session_key`: its name inside the server."""
        for call in [call for call, entry in self._entries.items() if entry.session_key == session_key]:
            self._drop(call, f"session {session_key.rpartition('/')[2]!r} was reset")

    def _prune(self) -> None:
        now = time.monotonic()
        for call, entry in list(self._entries.items()):
            if entry.expires is not None and entry.expires < now:
                self._drop(call, f"a session-less call's output is kept for {self._ttl:g} s")
            elif entry.session_key is not None and not self._session_alive(entry.session_key):
                self._drop(call, f"session {entry.session_key.rpartition('/')[2]!r} ended")

    def _drop_oldest(self, reason: str) -> None:
        self._drop(next(iter(self._entries)), reason)

    def _drop(self, call: str, reason: str) -> None:
        entry = self._entries.pop(call)
        self._bytes -= entry.size
        self._dropped.append((call, entry.principal, reason))
