"""The messages between the host (this package) and a sandbox runner: the Deno runner
(deno/runner.ts) and the CPython worker (cpython_worker.py) speak the same protocol.

Transport: one JSON object per line, host -> runner on the runner's stdin, runner -> host on
its stdout. Every runner line is an envelope ``{"token": <str>, "msg": <message>}``; the token
is a random secret the host sends in ``init``. Only the runner's main thread knows it, and
sandboxed code never runs there, so a line the sandbox prints itself (``console.log``,
``js.Deno.stdout``) carries no valid token and is dropped.

Host -> runner:
    init       {type, token, guest_runtime, pyodide_dir?, data_dir?, packages_dir?, allow_net?,
                snapshot?}
                                              first line, once: the token, the Python source of
                                              guest_runtime.py to load, the host folders the
                                              sandbox reads (Pyodide, data/, packages, the
                                              memory snapshot to start from) and the hosts it
                                              may reach.
    run        {type, id, code, max_output_chars, output, tools?}
                                              run a program in the session's interpreter;
                                              ``output`` caps what it hands back besides text
                                              ({max_files, max_bytes, max_figures});
                                              ``tools`` (JSON text, a list of
                                              catalog.ToolSpec) replaces the guest's `tools`
                                              first, sent only when the catalog changed.
    interrupt  {type, id}                     raise KeyboardInterrupt in run ``id`` if it is
                                              still running (ignored otherwise).
    warm_up    {type, rounds}                 (Pyodide) spend idle time running a sample
                                              program ``rounds`` times so V8 compiles the
                                              interpreter's hot code; one round at a time,
                                              only after 250 ms without a message.
    tool_result {type, call, reply}           the answer to ``tool_call`` number ``call``:
                                              reply is JSON text, {"ok": true, "value": ...}
                                              or {"ok": false, "error": "..."}.

Runner -> host:
    ready      {type, pyodide_version, load_ms}   Pyodide is loaded; runs may be sent.
    result     {type, id, outcome}                outcome is a GuestOutcome (result.py).
    crashed    {type, id, message}                Pyodide itself failed during run ``id``;
                                                  the sandbox is unusable.
    fatal      {type, message}                    the runner cannot go on (load failure).
    progress   {type, line}                       the latest line the program printed, at most
                                                  twice a second (for progress reports).
    tool_call  {type, call, server, tool, arguments}
                                                  sandboxed code calls tools.<server>.<tool>;
                                                  arguments is JSON text; ``call`` numbers the
                                                  calls of one sandbox. Answered by tool_result,
                                                  possibly out of order (async calls overlap).

Closing the runner's stdin asks it to exit.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Literal, Required, TypedDict


class InitMessage(TypedDict, total=False):
    type: Required[Literal["init"]]
    token: Required[str]
    guest_runtime: Required[str]
    pyodide_dir: str
    data_dir: str
    packages_dir: str
    allow_net: str
    snapshot: str


class RunMessage(TypedDict, total=False):
    type: Required[Literal["run"]]
    id: Required[int]
    code: Required[str]
    max_output_chars: Required[int]
    output: Required[dict[str, int]]
    tools: str


class InterruptMessage(TypedDict):
    type: Literal["interrupt"]
    id: int


class WarmUpMessage(TypedDict):
    type: Literal["warm_up"]
    rounds: int


class ToolResultMessage(TypedDict):
    type: Literal["tool_result"]
    call: int
    reply: str


HostMessage = InitMessage | RunMessage | InterruptMessage | WarmUpMessage | ToolResultMessage


def encode(message: HostMessage) -> bytes:
    return json.dumps(message, ensure_ascii=False).encode() + b"\n"


def max_line_bytes(max_output_chars: int, max_artifact_bytes: int = 0) -> int:
    """Longest genuine runner line: four capped text fields, each char at most six JSON bytes,
    plus figures and output files sent inline as base64 (4 characters for every 3 bytes)."""
    return 4 * 6 * (max_output_chars + 200) + (max_artifact_bytes * 4) // 3 + 65_536


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
