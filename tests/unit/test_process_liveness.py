"""Whether a sandbox process still runs, as the executor asks before it sends a program."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from mcp_sandbox.backends.watch import is_running


def test_a_process_that_ended_is_not_running_even_before_it_is_reaped() -> None:
    # A sandbox killed between calls must be seen as dead at the next call, before the program is sent.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert is_running(child.pid)
        child.kill()
        deadline = time.monotonic() + 30
        while is_running(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # a zombie now: ended, and not reaped (nothing has waited for it)
        assert not is_running(child.pid)
        assert Path(f"/proc/{child.pid}").exists()
    finally:
        child.wait()
    assert not is_running(child.pid)  # reaped: gone
