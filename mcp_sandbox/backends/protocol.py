"""The messages between the host (this package) and the Deno runner (deno/runner.ts).

Transport: one JSON object per line, host -> runner on the runner's stdin, runner -> host on
its stdout. Every runner line is an envelope ``{"token": <str>, "msg": <message>}``; the token
is a random secret the host sends in ``init``. Only the runner's main thread knows it, and
sandboxed code never runs there, so a line the sandbox prints itself (``console.log``,
``js.Deno.stdout``) carries no valid token and is dropped.

Host -> runner:
    init       {type, token, guest_runtime}   first line, once: the token and the Python
                                              source of guest_runtime.py to load into Pyodide.
    run        {type, id, code, max_output_chars}
                                              run a program in the session's interpreter.
    interrupt  {type, id}                     raise KeyboardInterrupt in run ``id`` if it is
                                              still running (ignored otherwise).

Runner -> host:
    ready      {type, pyodide_version, load_ms}   Pyodide is loaded; runs may be sent.
    result     {type, id, outcome}                outcome is a GuestOutcome (result.py).
    crashed    {type, id, message}                Pyodide itself failed during run ``id``;
                                                  the sandbox is unusable.
    fatal      {type, message}                    the runner cannot go on (load failure).

Closing the runner's stdin asks it to exit.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Literal, TypedDict


class InitMessage(TypedDict):
    type: Literal["init"]
    token: str
    guest_runtime: str


class RunMessage(TypedDict):
    type: Literal["run"]
    id: int
    code: str
    max_output_chars: int


class InterruptMessage(TypedDict):
    type: Literal["interrupt"]
    id: int


HostMessage = InitMessage | RunMessage | InterruptMessage


def encode(message: HostMessage) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"


def max_line_bytes(max_output_chars: int) -> int:
    """Longest genuine runner line: four capped text fields, each char at most six JSON bytes."""
    return 4 * 6 * (max_output_chars + 200) + 65_536


def open_envelope(line: bytes, token: str) -> dict[str, Any] | None:
    """The message inside a runner line, or None when the line is not a genuine one."""
    try:
        envelope = json.loads(line)
    except ValueError:
        return None
    if not isinstance(envelope, dict):
        return None
    sent_token = envelope.get("token")
    message = envelope.get("msg")
    if not isinstance(sent_token, str) or not isinstance(message, dict):
        return None
    if not hmac.compare_digest(sent_token.encode(), token.encode()):
        return None
    return message
