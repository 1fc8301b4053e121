"""Red team, resources: output floods, recursion and huge or malformed code, endless loops, memory,
and the subprocess backend's other limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    MAX_CODE_CHARS,
    MEMORY,
    README_INPROCESS,
    SUBPROCESS_ONLY,
    TIMEOUT,
    Attack,
    ByWorkerUid,
    NotProtected,
    Skip,
    World,
    all_of,
    attack_ids,
    canary_intact,
    capped,
    clean_reply,
    contained,
    count_below,
    error_is,
    on,
    program,
    pyodide_only,
    result_is,
    run_attack,
    session_kept,
    size_at_most,
    tool_error,
)

pytestmark = pytest.mark.anyio


SWALLOWS_INTERRUPTS = """
import time
end = time.monotonic() + 4
while time.monotonic() < end:
    try:
        while time.monotonic() < end:
            pass
    except BaseException:
        pass
"""


ATTACKS: list[Attack] = [
    # --- output floods ---
    Attack(
        "stdout_flood",
        "print('x' * 5_000_000)",
        capped("stdout"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "stderr_flood",
        "import sys\nsys.stderr.write('e' * 5_000_000)",
        capped("stderr"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "many_small_prints",
        "for i in range(100_000):\n    print(i)",
        capped("stdout"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        # About two seconds at most alone; over five on a loaded machine.
        timeout=20,
    ),
    Attack(
        "exception_message_flood",
        "raise ValueError('v' * 2_000_000)",
        all_of(error_is("ValueError"), capped("error")),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "result_repr_flood",
        "'r' * 3_000_000",
        capped("result"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "javascript_console_flood",
        "import js\njs.eval(\"for (let i = 0; i < 50000; i++) console.log('flood ' + i)\")\n'done'",
        result_is("'done'"),
        pyodide_only(),
    ),
    Attack(
        # Unterminated bytes would glue onto the runner's next genuine line, which would then fail
        # to parse: each genuine line starts with a newline, so the program's own result arrives.
        "protocol_stream_garbage",
        program("""
            import js
            js.Deno.stdout.writeSync(js.TextEncoder.new().encode('garbage-without-newline'))
            'genuine'
        """),
        all_of(canary_intact, result_is("'genuine'")),
        pyodide_only(),
        session="crash",
        timeout=1,
    ),
    Attack(
        "protocol_line_too_long",
        "import js\njs.Deno.stdout.writeSync(js.TextEncoder.new().encode('x' * 20_000_000))\n'genuine'",
        canary_intact,
        pyodide_only(contained("SandboxCrash", "MemoryLimit", "Timeout")),
        session="crash",
    ),
    # --- recursion, huge and malformed code ---
    Attack(
        "deep_recursion",
        "def dive():\n    dive()\ndive()",
        all_of(error_is("RecursionError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="recursion",
    ),
    Attack(
        "recursion_limit_lifted",
        "import sys\nsys.setrecursionlimit(10**6)\ndef dive(n):\n    return dive(n + 1)\ndive(0)",
        canary_intact,
        # It ends well within the timeout: a traceback shows the first and last frames only.
        on(
            pyodide=contained("RecursionError", "SandboxCrash", "MemoryLimit", "MemoryError"),
            subprocess=contained("RecursionError", "SandboxCrash", "MemoryError"),
            inprocess=Skip(f"{README_INPROCESS}: the recursion limit is the server's own"),
        ),
        session="crash",
        # ~2.4 s alone, over 15 s on a machine loaded fivefold.
        timeout=30,
    ),
    Attack(
        "code_over_the_size_limit",
        "#" * (MAX_CODE_CHARS + 1),
        tool_error("MCP_SANDBOX_MAX_CODE_CHARS"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "null_bytes_in_code",
        "x = 1\x00\nprint('after the null byte')",
        all_of(error_is("SyntaxError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "deeply_nested_code",
        "(" * 100_000 + ")" * 100_000,
        all_of(error_is("SyntaxError", "RecursionError", "MemoryError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        # A lone surrogate cannot be encoded as UTF-8: the result must still come back.
        "surrogates_in_output",
        "print('\\udcff')\n'after'",
        clean_reply,
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "surrogates_in_error",
        "raise ValueError('\\ud800')",
        clean_reply,
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    # --- endless loops and calls that will not stop ---
    Attack(
        "busy_loop",
        "while True:\n    pass",
        session_kept,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="loops",
        timeout=1,
    ),
    Attack(
        "swallows_keyboard_interrupt",
        SWALLOWS_INTERRUPTS,
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "ignores_sigint",
        program("""
            import signal, time
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            except ValueError:
                pass
            end = time.monotonic() + 4
            while time.monotonic() < end:
                pass
        """),
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "javascript_infinite_loop",
        "import js\njs.eval('while (true) {}')",
        canary_intact,
        pyodide_only(TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "disarm_interrupt_buffer",
        "import js, pyodide_js\npyodide_js.setInterruptBuffer(js.Uint8Array.new(1))\nwhile True:\n    pass",
        canary_intact,
        # pyodide_js offers only what Pyodide's own modules use: setInterruptBuffer is not there.
        pyodide_only(contained("Timeout", "AttributeError")),
        session="crash",
        timeout=1,
    ),
    Attack(
        "long_sleep",
        "import time\ntime.sleep(8)",
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "huge_bigint_power",
        "10 ** 10 ** 8",
        canary_intact,
        on(
            pyodide=TIMEOUT,
            subprocess=TIMEOUT,
            inprocess=Skip(
                f"{README_INPROCESS}: a C call holding the GIL stalls the whole server (docs/backends.md)"
            ),
        ),
        session="crash",
        timeout=1,
    ),
    # --- memory ---
    Attack(
        "memory_bytearray_2gb",
        "bytearray(2_000_000_000)",
        canary_intact,
        on(
            pyodide=MEMORY,
            subprocess=MEMORY,
            inprocess=Skip(f"{README_INPROCESS}: no memory cap, it would grow the server"),
        ),
        session="memory",
    ),
    Attack(
        "memory_gradual_growth",
        # Inside a function, so a MemoryError that the session survives frees it all again.
        program("""
            def grow():
                hog = []
                for _ in range(4000):
                    hog.append(bytearray(1_000_000))
            grow()
        """),
        canary_intact,
        on(
            pyodide=MEMORY,
            subprocess=MEMORY,
            inprocess=Skip(f"{README_INPROCESS}: no memory cap, it would grow the server"),
        ),
        session="memory",
    ),
    Attack(
        "memory_javascript_array",
        program("""
            import js
            js.eval('globalThis.hog = [];'
                    ' for (let i = 0; i < 1000; i++) hog.push(new Float64Array(1e6).fill(1))')
        """),
        canary_intact,
        pyodide_only(MEMORY),
        session="memory",
        # Filling arrays until the memory watchdog fires (past 1.3 GB for each sandbox its process
        # hosts: these buffers live outside V8's heap) takes seconds: past the 5 s default on a
        # loaded machine, where it timed out in a full run instead.
        timeout=60,
    ),
    Attack(
        "raise_rlimit_then_allocate",
        program("""
            import resource
            try:
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            except (ValueError, OSError):
                pass
            bytearray(2_000_000_000)
        """),
        canary_intact,
        on(pyodide=SUBPROCESS_ONLY, subprocess=MEMORY, inprocess=SUBPROCESS_ONLY),
        session="memory",
    ),
    # --- the subprocess backend's other limits ---
    Attack(
        "fork_bomb_bounded",
        program("""
            import os, time
            kids = 0
            for _ in range(200):
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    time.sleep(2)
                    os._exit(0)
                kids += 1
            kids
        """),
        count_below(200),
        # As root, RLIMIT_NPROC holds because each worker runs under a uid of its own.
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it would fork the server"),
        ),
        session="crash",
    ),
    Attack(
        "file_over_the_size_limit",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nwith open('@TMP@/big.bin', 'wb') as out:\n"
        "    for _ in range(65):\n        out.write(b'0' * (1024 * 1024))",
        size_at_most("big.bin", 64 * 1024 * 1024),
        on(
            pyodide=BLOCKED,
            subprocess=contained("OSError", "SandboxCrash"),
            landlock=contained("PermissionError"),  # it may not write outside its folder at all
            unconfined=ByWorkerUid(
                server=contained("OSError", "SandboxCrash"),
                own=contained("PermissionError"),  # a folder of the test's, which its uid may not write
                own_reading=contained("PermissionError"),
            ),
            inprocess=NotProtected(f"{README_INPROCESS}: rlimits apply to subprocess workers only"),
        ),
        session="crash",
    ),
    Attack(
        "open_files_exhaustion",
        program("""
            handles = []
            try:
                for _ in range(5000):
                    handles.append(open('/dev/null'))
            except OSError:
                pass
            for handle in handles:
                handle.close()
            len(handles)
        """),
        count_below(5000),
        on(
            pyodide=SUBPROCESS_ONLY,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it would use up the server's own descriptors"),
        ),
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
