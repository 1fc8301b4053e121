"""Runs inside the subprocess sandbox: a CPython worker speaking the runner protocol.

Started as ``python -I cpython_worker.py '<limits json>'`` with an empty environment in a private
temporary directory. Standard library only, and no import of mcp_sandbox: the guest runtime
arrives in the ``init`` message, as it does for Pyodide. The protocol moves to private copies
of fds 0 and 1, so the program's own stdin/stdout lead nowhere and cannot reach the host.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
from typing import Any

#: True while user code runs: only then does SIGINT (the host's interrupt) raise.
running = False


def on_interrupt(signum: int, frame: Any) -> None:
    if running:
        raise KeyboardInterrupt


def processes_of_this_user() -> int:
    """Processes and threads this uid has now: RLIMIT_NPROC counts them all."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as status:
                    for line in status:
                        if line.startswith("Uid:"):
                            count += int(line.split()[1]) == uid
                            break
            except OSError:
                continue
    return count


def apply_limits(limits: dict[str, int]) -> None:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    if os.path.isdir("/proc"):
        # A margin over what the user already runs: enough for threads, not for a fork bomb.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes_of_this_user() + limits["processes"],) * 2)


def main() -> None:
    global running
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    nowhere = os.open(os.devnull, os.O_RDWR)
    os.dup2(nowhere, 0)
    os.dup2(nowhere, 1)
    apply_limits(json.loads(sys.argv[1]))
    signal.signal(signal.SIGINT, on_interrupt)

    init = json.loads(protocol_in.readline())
    envelope = '{"token":' + json.dumps(init["token"]) + ',"msg":%s}\n'

    def send(payload: str) -> None:
        protocol_out.write((envelope % payload).encode())
        protocol_out.flush()

    guest: dict[str, Any] = {"__name__": "guest_runtime"}
    exec(compile(init["guest_runtime"], "<guest_runtime>", "exec"), guest)
    run_program_json = guest["run_program_json"]
    loop = asyncio.new_event_loop()  # one loop per worker, so a session's async objects survive
    send(json.dumps({"type": "ready", "python": sys.version.split()[0]}))

    for line in protocol_in:
        message = json.loads(line)
        if message.get("type") != "run":
            continue
        running = True
        try:
            outcome = run_program_json(message["code"], message["max_output_chars"])
            if not isinstance(outcome, str):
                outcome = loop.run_until_complete(outcome)
        except BaseException as error:  # noqa: BLE001 - an interrupt that lands outside the program
            outcome = json.dumps({"success": False, "error_type": type(error).__name__, "error": str(error)})
        finally:
            running = False
        send(f'{{"type":"result","id":{int(message["id"])},"outcome":{outcome}}}')


if __name__ == "__main__":
    main()
