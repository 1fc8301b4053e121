"""The guest runtime: everything that runs inside a sandbox, the same in every backend.

Its modules, one concept each: `capture` (the program's stdout, stderr and stdin), `program` (a
program compiled as a REPL cell, and its outcome), `tools` (the upstream tools as functions, and
the channel to the host), `artifacts` (figures and output files), `interpreter` (a sandbox's
Python state and its runs), `checkpoint` (a CPython session saved and restored), `readonly`
(data/ kept read-only), `pyodide_worker` (the Pyodide worker's waits, audit hook and checkpoint
check).

Standard library and the protocol only: the runners load these modules from source (the ``init``
message's ``guest_modules``, in the order of protocol.GUEST_MODULES) into Pyodide and CPython
workers, and the in-process executor imports them. This package's namespace is what runners
take from the runtime.
"""

from mcp_sandbox.guest.capture import NO_INPUT, CappedText
from mcp_sandbox.guest.checkpoint import load_session, save_session
from mcp_sandbox.guest.interpreter import (
    Interpreter,
    cancel_run,
    deliver,
    jit_warm_up,
    note_tasks,
    run_json,
)
from mcp_sandbox.guest.program import Program, interrupted_outcome
from mcp_sandbox.guest.pyodide_worker import (
    forget_modules,
    install_interrupt_handlers,
    install_waits,
    interrupted_json,
    js_holders,
    report_reaching_past,
    reseed,
)
from mcp_sandbox.guest.readonly import protect_read_only
from mcp_sandbox.guest.tools import ToolChannel, ToolError

__all__ = [
    "NO_INPUT",
    "CappedText",
    "Interpreter",
    "Program",
    "ToolChannel",
    "ToolError",
    "cancel_run",
    "deliver",
    "forget_modules",
    "install_interrupt_handlers",
    "install_waits",
    "interrupted_json",
    "interrupted_outcome",
    "jit_warm_up",
    "js_holders",
    "load_session",
    "note_tasks",
    "protect_read_only",
    "report_reaching_past",
    "reseed",
    "run_json",
    "save_session",
]
