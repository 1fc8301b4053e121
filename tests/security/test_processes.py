"""Red team, processes: spawning them, and ending or signalling the host's."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    CRASH,
    INPROCESS_SHARES,
    INPROCESS_UNSAFE,
    README_INPROCESS,
    README_SUBPROCESS,
    WRITES_DECIDE,
    Attack,
    Skip,
    World,
    attack_ids,
    canary_intact,
    contained,
    failed,
    no_file,
    on,
    program,
    pyodide_only,
    run_attack,
    session_sid_apart,
)

pytestmark = pytest.mark.anyio


ATTACKS: list[Attack] = [
    # --- spawning processes ---
    Attack(
        "deno_command_spawn",
        program("""
            import js
            options = js.JSON.parse('{"args": ["@TMP@/spawned"]}')
            js.Deno.Command.new('@TOUCH@', options).outputSync()
        """),
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "deno_run_legacy_spawn",
        'import js\njs.Deno.run(js.JSON.parse(\'{"cmd": ["@TOUCH@", "@TMP@/spawned"]}\'))',
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "node_child_process_spawn",
        "import js\ncp = await js.eval(\"import('node:child_process')\")\n"
        "cp.execFileSync('@TOUCH@', js.JSON.parse('[\"@TMP@/spawned\"]'))",
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "python_subprocess_spawn",
        "import subprocess\nsubprocess.run(['@TOUCH@', '@TMP@/spawned'])",
        no_file("spawned"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "python_os_system",
        "import os\nos.system('@TOUCH@ @TMP@/spawned')",
        no_file("spawned"),
        # Pyodide's os.system reaches for the environment, which Deno refuses, and the sandbox dies.
        on(
            pyodide=contained("SandboxCrash", "OSError"),
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="crash",
    ),
    Attack(
        "ctypes_libc_system",
        "import ctypes\nctypes.CDLL(None).system(b'@TOUCH@ @TMP@/spawned')",
        no_file("spawned"),
        on(
            pyodide=contained("SandboxCrash", "AttributeError", "OSError"),
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="crash",
    ),
    Attack(
        "deno_dlopen_libc_system",
        program("""
            import js
            lib = js.eval("Deno.dlopen('libc.so.6', {system: {parameters: ['buffer'], result: 'i32'}})")
            lib.symbols.system(js.TextEncoder.new().encode('@TOUCH@ @TMP@/spawned\\0'))
        """),
        no_file("spawned"),
        pyodide_only(),
    ),
    # --- ending or signalling processes ---
    Attack("deno_exit", "import js\njs.Deno.exit(3)", canary_intact, pyodide_only(CRASH), session="crash"),
    Attack(
        "worker_self_close", "import js\njs.self.close()", canary_intact, pyodide_only(CRASH), session="crash"
    ),
    Attack(
        "os_exit",
        "import os\nos._exit(3)",
        canary_intact,
        on(pyodide=CRASH, subprocess=CRASH, inprocess=INPROCESS_UNSAFE),
        session="crash",
    ),
    Attack(
        "sigsegv_self",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
        canary_intact,
        on(pyodide=CRASH, subprocess=CRASH, inprocess=INPROCESS_UNSAFE),
        session="crash",
    ),
    Attack(
        "deno_kill_server",
        "import js\njs.Deno.kill(js.Deno.ppid, 'SIGTERM')",
        failed,
        pyodide_only(),
    ),
    Attack(
        "python_kill_server",
        "import os\nos.kill(os.getppid(), 9)",
        failed,
        on(
            pyodide=BLOCKED,
            subprocess=Skip(f"not-protected ({README_SUBPROCESS}): it would kill the test server"),
            inprocess=INPROCESS_UNSAFE,
        ),
    ),
    Attack(
        "kill_own_process_group",
        "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)",
        canary_intact,
        # Pyodide's processes are make-believe; a worker's group holds only the worker (inside
        # bubblewrap, the group's leader is outside its pid namespace: there is none to kill).
        on(
            pyodide=BLOCKED,
            subprocess=contained("ProcessLookupError"),
            landlock=CRASH,
            unconfined=CRASH,
            inprocess=INPROCESS_UNSAFE,
        ),
        session="crash",
    ),
    Attack(
        "sandbox_in_its_own_session",
        "try:\n    import js\n    ids = (js.Deno.pid, js.Deno.ppid)\nexcept ImportError:\n    import os\n"
        "    ids = (os.getpid(), os.getppid())\nids",
        session_sid_apart,
        on(
            pyodide=BLOCKED,
            subprocess=Skip(
                "inside bubblewrap the worker sees only its own pid namespace, so its pids mean nothing "
                "to the host; kill_own_process_group shows a group signal cannot leave it"
            ),
            landlock=BLOCKED,
            unconfined=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it is the server's own process"),
        ),
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
