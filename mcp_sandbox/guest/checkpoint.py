"""Checkpoints of a CPython sandbox: the session's variables (pickled inside the sandbox) and the
files of its working directory, saved to a file and put into a fresh sandbox. A Pyodide
sandbox's checkpoint is its memory (checkpoint.ts)."""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

from mcp_sandbox.guest.interpreter import Interpreter
from mcp_sandbox.protocol import CHECKPOINT_FOLDER, DATA_DIR, OUTPUT_DIR

#: Names every interpreter has from the start; a restore keeps the new sandbox's own.
_OWN_NAMES = frozenset({"__builtins__", "tools", "ToolError", "display"})
#: Folders of the working directory a checkpoint leaves out: per call, the host's, its own.
_NOT_SAVED = frozenset({OUTPUT_DIR, DATA_DIR, CHECKPOINT_FOLDER})


def _pickler() -> Any:
    """cloudpickle where the sandbox has it (functions, classes and lambdas defined in the
    session travel by value), else the standard library's pickle."""
    try:
        import cloudpickle  # type: ignore[import-untyped, import-not-found, unused-ignore]

        return cloudpickle
    except ImportError:
        import pickle

        return pickle


def save_session(interpreter: Interpreter, file: str) -> tuple[int, list[str]]:
    """Write the session's variables and the files of its working directory to
    CHECKPOINT_FOLDER/`file`; (bytes written, what a restore will not bring back).

    Variables are pickled together, so two names for one object stay one object; the ones that
    cannot be pickled (an open file, a generator, a lock) are left out and named.
    """
    import io as _io
    import pickle
    import tarfile

    pickler = _pickler()
    names = {name: value for name, value in interpreter.namespace.items() if name not in _OWN_NAMES}
    lost: list[str] = []
    try:
        variables = pickler.dumps(names, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - find which names cannot be pickled
        kept = {}
        for name, value in names.items():
            try:
                pickler.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
                kept[name] = value
            except Exception as error:  # noqa: BLE001 - any failure means "cannot be saved"
                lost.append(f"{name} ({type(error).__name__}: {str(error)[:80]})")
        variables = pickler.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL)
    if lost:
        lost = [f"variables that cannot be pickled are not in the checkpoint: {', '.join(lost[:10])}"]
    home = os.path.realpath(os.environ.get("HOME", "."))
    files = _io.BytesIO()
    with tarfile.open(fileobj=files, mode="w") as archive:
        for entry in sorted(os.listdir(home)):
            if entry not in _NOT_SAVED:
                archive.add(os.path.join(home, entry), arcname=entry)  # links stay links
    cwd = os.path.relpath(os.getcwd(), home)
    state = {
        "format": 1,
        "cells": interpreter.cells,
        "variables": variables,
        "files": files.getvalue(),
        "cwd": cwd,
    }
    os.makedirs(os.path.join(home, CHECKPOINT_FOLDER), mode=0o700, exist_ok=True)
    path = os.path.join(home, CHECKPOINT_FOLDER, file)
    with open(path, "wb") as out:
        out.write(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
        written = out.tell()
    return written, lost


def load_session(interpreter: Interpreter, file: str) -> None:
    """Put the checkpoint in CHECKPOINT_FOLDER/`file` (which is then deleted) into this fresh
    interpreter and working directory. Unpickling happens here, inside the sandbox, never on the host."""
    import io as _io
    import pickle
    import tarfile

    home = os.path.realpath(os.environ.get("HOME", "."))
    path = os.path.join(home, CHECKPOINT_FOLDER, file)
    try:
        with open(path, "rb") as source:
            state = pickle.loads(source.read())
    finally:
        with suppress(OSError):
            os.unlink(path)
    if not isinstance(state, dict) or state.get("format") != 1:
        raise ValueError("the checkpoint is not one this sandbox can read")
    _pickler()  # cloudpickle's functions must be importable before its pickles load
    variables = pickle.loads(state["variables"])
    with tarfile.open(fileobj=_io.BytesIO(state["files"])) as archive:
        archive.extractall(home, filter="data")  # nothing lands outside the working directory
    cwd = os.path.realpath(os.path.join(home, state["cwd"]))
    if cwd == home or cwd.startswith(home + os.sep):
        with suppress(OSError):
            os.chdir(cwd)
    interpreter.adopt(variables, int(state["cells"]))
