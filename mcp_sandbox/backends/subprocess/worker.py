"""Runs inside the subprocess sandbox: a CPython worker speaking the runner protocol.

Started as ``python -I worker.py '<ProcessLimits json>'`` with an empty environment in a private
temporary directory. Standard library only, and no import of the installed mcp_sandbox: the
protocol and the guest runtime arrive as source in the ``init`` message, as they do for
Pyodide. The protocol moves to private copies of fds 0 and 1, so the program's own
stdin/stdout lead nowhere and cannot reach the host.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
import json
import os
import queue
import resource
import signal
import sys
import threading
import time
import types
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO

#: True while user code runs: only then does SIGINT (the host's interrupt) raise.
running = False
#: The reader thread's stack: RLIMIT_AS counts all of the 8 MB default, and 256 KB already
#: holds json's deepest nesting under the recursion limit.
READER_STACK = 512 * 1024


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


def apply_limits(limits: dict[str, Any]) -> None:
    """Resource limits, then (as root) the worker's own uid, then (tier landlock) Landlock and
    seccomp: all before the host's first message, while the worker is single-threaded."""
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_mb"] * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 5))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * mb,) * 2)
    # ctypes costs milliseconds at every start: only Landlock and a capability kept need it.
    needs_ctypes = limits["confine"] is not None or limits["read_anything"]
    confine = load_sibling("confine") if needs_ctypes else None
    if limits["uid"] is not None and confine is not None:
        confine.become(limits["uid"], limits["read_anything"])
    elif limits["uid"] is not None:
        # In bubblewrap: it left only CAP_SETUID and CAP_SETGID, which go with uid 0; the
        # bounding set stays, out of reach under no_new_privs (set with its seccomp filter).
        os.setgroups([])
        os.setgid(limits["uid"])
        os.setuid(limits["uid"])
    os.chdir(os.environ.get("HOME", "."))  # the working directory, entered as the worker's own uid
    os.environ.pop("PWD", None)  # bubblewrap sets it; the worker's environment holds only what the host gave
    if os.path.isdir("/proc"):
        # A margin over what this uid already runs: enough for threads, not for a fork bomb.
        resource.setrlimit(resource.RLIMIT_NPROC, (processes_of_this_user() + limits["processes"],) * 2)
    if limits["confine"] is not None and confine is not None:
        rules = limits["confine"]
        confine.apply_landlock(rules["read_only"], [*rules["read_write"], os.getcwd()])
        confine.install_seccomp(base64.b64decode(rules["seccomp"]))


def load_sibling(name: str) -> types.ModuleType:
    """A module beside this file (isolated mode puts no script folder on sys.path)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_mcp_sandbox_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HostLink:
    """The worker's end of the host's pipe: a thread reads the host's lines, so replies to
    bridged tool calls reach the guest's ToolChannel while the program runs."""

    def __init__(self, protocol_in: BinaryIO, protocol_out: BinaryIO, envelope_prefix: str) -> None:
        self._in = protocol_in
        self._out = protocol_out
        self._envelope = envelope_prefix.replace("%", "%%") + "%s}\n"
        self._lock = threading.Lock()  # program threads may call tools too
        self.deliver: Callable[[int, str], None] = lambda call, reply: None
        self.runs: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def send(self, payload: str) -> None:
        data = (self._envelope % payload).encode()
        with self._lock:
            self._out.write(data)
            self._out.flush()

    def read_forever(self) -> None:
        for line in self._in:
            message = json.loads(line)
            kind = message.get("type")
            if kind in ("run", "checkpoint", "restore"):  # in order, one at a time
                self.runs.put(message)
            elif kind == "tool_result":
                self.deliver(message["call"], message["reply"])
        self.runs.put(None)  # the host closed stdin: time to go


def load_module(name: str, source: str) -> types.ModuleType:
    """Install one of the guest's modules from its source (as the Pyodide worker does)."""
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    sys.modules[name] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def finish(loop: asyncio.AbstractEventLoop, pending: Coroutine[Any, Any, str]) -> str:
    """Run an awaiting program to its end; if interrupted, end it so it cannot resume later."""
    task = loop.create_task(pending)
    try:
        return loop.run_until_complete(task)
    except BaseException:
        task.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(task)
        raise


def between_runs(guest: Any, interpreter: Any, message: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint or a restore (the guest runtime does the work): the answer to send."""
    started = time.monotonic()
    kind, file = message["type"], str(message["file"])

    def ms() -> float:
        return round((time.monotonic() - started) * 1000, 2)

    if "/" in file or file.startswith("."):
        problem = "the host named no valid checkpoint file"
    else:
        try:
            if kind == "checkpoint":
                written, lost = guest.save_session(interpreter, file)
                answer = {"saved": True, "reason": None, "lost": lost, "bytes": written}
                return {"type": "checkpointed", "id": message["id"], **answer, "ms": ms()}
            guest.load_session(interpreter, file)
            return {"type": "restored", "id": message["id"], "restored": True, "reason": None, "ms": ms()}
        except Exception as error:  # noqa: BLE001 - said to the host, which tells the caller
            problem = f"{type(error).__name__}: {str(error)[:300]}"
    if kind == "checkpoint":
        answer = {"saved": False, "reason": problem, "lost": [], "bytes": 0}
        return {"type": "checkpointed", "id": message["id"], **answer, "ms": ms()}
    return {"type": "restored", "id": message["id"], "restored": False, "reason": problem, "ms": ms()}


def main() -> None:
    global running
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    nowhere = os.open(os.devnull, os.O_RDWR)
    os.dup2(nowhere, 0)
    os.dup2(nowhere, 1)
    apply_limits(json.loads(sys.argv[1]))
    signal.signal(signal.SIGINT, on_interrupt)

    started = time.monotonic()
    init = json.loads(protocol_in.readline())
    for name, source in init["guest_modules"]:
        load_module(name, source)
    protocol = sys.modules["mcp_sandbox.protocol"]
    guest = sys.modules[protocol.GUEST_RUNTIME_MODULE]
    link = HostLink(protocol_in, protocol_out, protocol.envelope_prefix(init["token"]))
    channel = guest.ToolChannel(link.send)
    link.deliver = channel.deliver
    interpreter = guest.Interpreter(init["limits"], channel)
    if init.get("data_dir"):
        guest.protect_read_only(init["data_dir"])
    loop = asyncio.new_event_loop()  # one loop per worker, so a session's async objects survive
    threading.stack_size(READER_STACK)
    threading.Thread(target=link.read_forever, name="host-reader", daemon=True).start()
    threading.stack_size(0)  # the program's own threads get the default
    load_ms = round((time.monotonic() - started) * 1000)
    ready = {"type": "ready", "python": sys.version.split()[0], "pyodide": None, "load_ms": load_ms}
    link.send(json.dumps(ready))

    while (message := link.runs.get()) is not None:
        if message["type"] != "run":
            link.send(json.dumps(between_runs(guest, interpreter, message)))
            continue
        running = True
        try:
            outcome = guest.run_json(interpreter, message["code"], message.get("tools"))
            if not isinstance(outcome, str):
                outcome = finish(loop, outcome)
        except BaseException as error:  # noqa: BLE001 - an interrupt that lands outside the program
            outcome = json.dumps(guest.interrupted_outcome(error))
        finally:
            running = False
        link.send(f'{{"type":"result","id":{int(message["id"])},"outcome":{outcome}}}')


if __name__ == "__main__":
    main()
