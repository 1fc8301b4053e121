"""Runs inside the subprocess sandbox: a CPython worker speaking the runner protocol.

Started as ``python -I cpython_worker.py '<limits json>'`` with an empty environment in a private
temporary directory. Standard library only, and no import of mcp_sandbox: the guest runtime
arrives in the ``init`` message, as it does for Pyodide. The protocol moves to private copies
of fds 0 and 1, so the program's own stdin/stdout lead nowhere and cannot reach the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import queue
import resource
import signal
import sys
import threading
from collections.abc import Callable, Coroutine
from typing import Any, BinaryIO

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


class HostChannel:
    """The worker's end of the protocol: a thread reads the host's lines, so replies to bridged
    tool calls arrive while the program runs (blocked in a call, or awaiting several)."""

    def __init__(self, protocol_in: BinaryIO, protocol_out: BinaryIO, token: str) -> None:
        self._in = protocol_in
        self._out = protocol_out
        self._envelope = '{"token":' + json.dumps(token) + ',"msg":%s}\n'
        self._lock = threading.Lock()  # guards _pending and writes: program threads may call tools too
        self._pending: dict[int, Callable[[str], None]] = {}
        self._numbers = itertools.count(1)
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
            if kind == "run":
                self.runs.put(message)
            elif kind == "tool_result":
                with self._lock:
                    resolve = self._pending.pop(message.get("call"), None)
                if resolve is not None:
                    resolve(message["reply"])
        self.runs.put(None)  # the host closed stdin: time to go

    def _request(self, server: str, tool: str, arguments: str, resolve: Callable[[str], None]) -> int:
        call = next(self._numbers)
        with self._lock:
            self._pending[call] = resolve
        request = {"type": "tool_call", "call": call, "server": server, "tool": tool, "arguments": arguments}
        self.send(json.dumps(request))
        return call

    def progress(self, line: str) -> None:
        self.send(json.dumps({"type": "progress", "line": line}))

    def call_sync(self, server: str, tool: str, arguments: str) -> str:
        replies: list[str] = []
        done = threading.Event()

        def resolve(reply: str) -> None:
            replies.append(reply)
            done.set()

        call = self._request(server, tool, arguments, resolve)
        try:
            done.wait()  # SIGINT interrupts the wait, so a timeout still stops the program
        finally:
            with self._lock:
                self._pending.pop(call, None)
        return replies[0]

    def call_async(self, server: str, tool: str, arguments: str) -> asyncio.Future[str]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[str] = loop.create_future()

        def settle(reply: str) -> None:
            if not future.done():
                future.set_result(reply)

        def resolve(reply: str) -> None:
            loop.call_soon_threadsafe(settle, reply)

        self._request(server, tool, arguments, resolve)
        return future


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
    channel = HostChannel(protocol_in, protocol_out, init["token"])
    guest: dict[str, Any] = {"__name__": "guest_runtime"}
    exec(compile(init["guest_runtime"], "<guest_runtime>", "exec"), guest)
    guest["install_transport"](channel)
    if init.get("data_dir"):
        guest["protect_read_only"](init["data_dir"])
    run_program_json = guest["run_program_json"]
    loop = asyncio.new_event_loop()  # one loop per worker, so a session's async objects survive
    threading.Thread(target=channel.read_forever, name="host-reader", daemon=True).start()
    channel.send(json.dumps({"type": "ready", "python": sys.version.split()[0]}))

    while (message := channel.runs.get()) is not None:
        running = True
        try:
            outcome = run_program_json(
                message["code"], message["max_output_chars"], message.get("tools"), message.get("output")
            )
            if not isinstance(outcome, str):
                outcome = finish(loop, outcome)
        except BaseException as error:  # noqa: BLE001 - an interrupt that lands outside the program
            outcome = json.dumps({"success": False, "error_type": type(error).__name__, "error": str(error)})
        finally:
            running = False
        channel.send(f'{{"type":"result","id":{int(message["id"])},"outcome":{outcome}}}')


if __name__ == "__main__":
    main()
