"""Writes protocol.ts, the Deno runner's copy of mcp_sandbox/protocol.py: its types and constants.

    python -m mcp_sandbox.backends.pyodide.typescript          # rewrite protocol.ts
    python -m mcp_sandbox.backends.pyodide.typescript --check  # exit 1 if it is out of date

The tests run the check, and `deno check` the runner against the file, so a field or constant
added on one side only fails them.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any, Literal, NotRequired, Union, cast, get_args, get_origin, get_type_hints

from typing_extensions import is_typeddict

from mcp_sandbox import protocol

TARGET = Path(__file__).resolve().with_name("protocol.ts")
HEADER = (
    "// Generated from mcp_sandbox/protocol.py by mcp_sandbox/backends/pyodide/typescript.py: do not edit.\n"
)
#: The constants the runner uses; every other one is Python-side only.
CONSTANTS = (
    "MAX_TOOL_REPLY_CHARS",
    "SYNC_REPLY_MAX_BYTES",
    "SYNC_DATA_INITIAL_BYTES",
    "SYNC_STATE",
    "SYNC_LENGTH",
    "SYNC_WAITING",
    "SYNC_REPLY_READY",
    "SYNC_INTERRUPTED",
    "INTERRUPT_SIGNAL",
    "SIGNAL_INTERRUPT",
    "SIGNAL_KILL",
    "JIT_WARM_UP_IDLE_MS",
    "JIT_WARM_UP_ROUNDS_AT_START",
    "GUEST_RUNTIME_MODULE",
    "OUTPUT_DIR",
    "DATA_DIR",
    "PASSING_KINDS",
    "REPLY_INTERRUPTED",
    "RUNNER_TOKEN_ENV",
    "HOST_LINE_KEY_LABEL",
    "HOST_LINE_NONCE_BYTES",
    "HOST_LINE_TAG_BYTES",
)
#: The types, in the order the file declares them (unions after their members).
TYPES = (
    "OutputLimits",
    "GuestLimits",
    "GuestFile",
    "KeptText",
    "GuestTable",
    "GuestOutcome",
    "InitMessage",
    "RunMessage",
    "InterruptMessage",
    "KillMessage",
    "JitWarmUpMessage",
    "ToolResultMessage",
    "RecycleMessage",
    "CheckpointMessage",
    "RestoreMessage",
    "CloseMessage",
    "HostMessage",
    "HostEnvelope",
    "ReadyMessage",
    "ResultMessage",
    "CrashedMessage",
    "FatalMessage",
    "EndedMessage",
    "ProgressMessage",
    "ToolCallMessage",
    "DescribeMessage",
    "RecycledMessage",
    "CheckpointedMessage",
    "RestoredMessage",
    "RunnerMessage",
    "WorkerInit",
    "WorkerAhead",
    "DataFile",
    "WorkerData",
    "WorkerRecycle",
    "WorkerRecycled",
    "WorkerCheckpoint",
    "WorkerRestore",
    "WorkerKill",
    "ControlRequest",
    "ControlAnswer",
    "WorkerRecycledCrash",
    "WorkerModule",
    "WorkerWarmedUp",
    "WorkerCleanMemory",
    "SnapshotPages",
    "WorkerMessage",
    "WorkerPost",
)
_JS_TYPES = {
    protocol.Uint8Array: "Uint8Array",
    protocol.Int32Array: "Int32Array",
    protocol.MessagePort: "MessagePort",
    protocol.WasmModule: "WebAssembly.Module",
}
_JS_TYPES[protocol.SharedArrayBuffer] = "SharedArrayBuffer"
_SCALARS: dict[Any, str] = {str: "string", int: "number", float: "number", bool: "boolean", Any: "unknown"}
_SCALARS[type(None)] = "null"


def _ts(annotation: Any) -> str:
    """The TypeScript type of one annotation."""
    for name in TYPES:  # a union the file declares is named, not spelled out again
        if get_origin(annotation) in (Union, types.UnionType) and annotation == getattr(protocol, name):
            return name
    if annotation in _JS_TYPES:
        return _JS_TYPES[annotation]
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if isinstance(annotation, type) and is_typeddict(annotation):
        return annotation.__name__
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return " | ".join(_literal(value) for value in args)
    if origin in (Union, types.UnionType):
        return " | ".join(dict.fromkeys(_ts(arg) for arg in args))  # int | float: one number
    if origin is list:
        inner = _ts(args[0])
        return f"({inner})[]" if " | " in inner else f"{inner}[]"
    if origin is tuple:
        return "[" + ", ".join(_ts(arg) for arg in args) + "]"
    raise TypeError(f"no TypeScript type for {annotation!r}")


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        quoted = json.dumps(value)
        # deno fmt's choice: double quotes unless single ones need fewer escapes.
        if value.count('"') > value.count("'"):
            return "'" + quoted[1:-1].replace('\\"', '"').replace("'", "\\'") + "'"
        return quoted
    return str(value)


def _declaration(name: str) -> str:
    value = getattr(protocol, name)
    if isinstance(value, type) and is_typeddict(value):
        hints = get_type_hints(value, include_extras=True)
        lines = [f"export type {name} = {{"]
        for field, hint in hints.items():
            optional = get_origin(hint) is NotRequired or field in cast(Any, value).__optional_keys__
            if get_origin(hint) is NotRequired:
                hint = get_args(hint)[0]
            lines.append(f"  {field}{'?' if optional else ''}: {_ts(hint)};")
        return "\n".join([*lines, "};"])
    members = get_args(value)
    return f"export type {name} =\n" + "\n".join(f"  | {_ts(member)}" for member in members) + ";"


def _constant(name: str) -> str:
    value = getattr(protocol, name)
    if isinstance(value, tuple):
        return f"export const {name} = [{', '.join(_literal(item) for item in value)}] as const;"
    return f"export const {name} = {_literal(value)};"


def render() -> str:
    parts = [HEADER, *(_constant(name) + "\n" for name in CONSTANTS), "\n"]
    parts += [_declaration(name) + "\n\n" for name in TYPES]
    return "".join(parts).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run python -m mcp_sandbox.backends.pyodide.typescript")
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
