"""Red team, sessions: taint that must not reach another session, and the saved sessions in
MCP_SANDBOX_STATE_DIR (another session's state, a planted file, a full store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    INPROCESS_SHARES,
    README_INPROCESS,
    READS_DECIDE,
    STATE_MARKER,
    WRITES_DECIDE,
    Attack,
    NotProtected,
    Outcome,
    Skip,
    World,
    all_of,
    attack_ids,
    gone_after_reset,
    no_file,
    not_seen_elsewhere,
    not_shown,
    on,
    program,
    pyodide_only,
    run_attack,
    state_files_untouched,
    state_store_capped,
)

pytestmark = pytest.mark.anyio


def untainted(name: str, taint: str, probe: str, *, pyodide: Outcome = BLOCKED) -> Attack:
    """A taint check: `taint` runs in one session; `probe` must say False in another session and
    in a session-less call (inprocess is one interpreter, so it is not tried there)."""
    return Attack(
        name,
        taint,
        not_seen_elsewhere(probe, "False", sessionless=True),
        on(
            pyodide=pyodide,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: one interpreter; it would taint the server itself"),
        ),
        session="tainter",
    )


ATTACKS: list[Attack] = [
    # --- taint across sessions ---
    Attack(
        "taint_globals",
        "rt_planted = 'TAINT'",
        not_seen_elsewhere("'rt_planted' in globals()", "False", sessionless=True),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="tainter",
    ),
    Attack(
        "taint_builtins",
        "import builtins\nbuiltins.rt_planted = 'TAINT'",
        not_seen_elsewhere("import builtins\nhasattr(builtins, 'rt_planted')", "False", sessionless=True),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(f"{README_INPROCESS}: builtins are shared"),
        ),
        session="tainter",
        cleanup="import builtins\ndel builtins.rt_planted",
    ),
    Attack(
        "taint_sys_modules",
        program("""
            import sys, json, types
            json.rt_planted = 'TAINT'
            sys.modules['rt_fake'] = types.ModuleType('rt_fake')
        """),
        not_seen_elsewhere(
            "import sys, json\n(hasattr(json, 'rt_planted'), 'rt_fake' in sys.modules)", "(False, False)"
        ),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(f"{README_INPROCESS}: modules are shared"),
        ),
        session="tainter",
        cleanup="import sys, json\ndel json.rt_planted\ndel sys.modules['rt_fake']",
    ),
    untainted(
        "taint_random_state",
        "import random\nrandom.seed(1234)",
        "import random\nrandom.random() == random.Random(1234).random()",
    ),
    untainted(
        "taint_sys_path",
        "import sys\nsys.path.insert(0, '/rt-planted')",
        "import sys\n'/rt-planted' in sys.path",
    ),
    untainted(
        "taint_os_environ",
        "import os\nos.environ['RT_PLANTED'] = '1'",
        "import os\n'RT_PLANTED' in os.environ",
    ),
    untainted(
        "taint_recursion_limit",
        "import sys\nsys.setrecursionlimit(12345)",
        "import sys\nsys.getrecursionlimit() == 12345",
    ),
    untainted(
        "taint_warnings_filters",
        "import warnings\nwarnings.filterwarnings('error', message='rt-planted')",
        "import warnings\nany('rt-planted' in str(f[1]) for f in warnings.filters)",
    ),
    untainted(
        "taint_codecs_registry",
        "import codecs\n"
        "def rt_search(name):\n"
        "    return codecs.lookup('utf-8') if name == 'rt_planted' else None\n"
        "codecs.register(rt_search)",
        "import codecs\n"
        "try:\n"
        "    codecs.lookup('rt_planted')\n"
        "    found = True\n"
        "except LookupError:\n"
        "    found = False\n"
        "found",
    ),
    untainted(
        "taint_atexit_handlers",
        "import atexit\natexit.register(print, 'rt-planted')",
        "import atexit, contextlib, io\n"
        "buffer = io.StringIO()\n"
        "with contextlib.redirect_stdout(buffer):\n"
        "    atexit._run_exitfuncs()\n"
        "'rt-planted' in buffer.getvalue()",
    ),
    untainted(
        "taint_stdlib_class_attribute",
        "import fractions\nfractions.Fraction.rt_planted = 'TAINT'",
        "import fractions\nhasattr(fractions.Fraction, 'rt_planted')",
    ),
    untainted(
        "taint_abc_registration",
        "import collections.abc\ncollections.abc.Sequence.register(int)",
        "import collections.abc\nissubclass(int, collections.abc.Sequence)",
    ),
    untainted(
        "taint_thread_left_running",
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), name='rt-planted', daemon=True).start()",
        "import threading\nany(thread.name == 'rt-planted' for thread in threading.enumerate())",
        pyodide=Skip("Pyodide has no threads"),
    ),
    untainted(
        "taint_asyncio_task_left_running",
        "import asyncio\n"
        "async def rt_planted():\n"
        "    await asyncio.sleep(30)\n"
        "rt_task = asyncio.ensure_future(rt_planted())\n"
        "await asyncio.sleep(0)",
        "import asyncio\n"
        "await asyncio.sleep(0)\n"
        "any('rt_planted' in repr(task) for task in asyncio.all_tasks())",
    ),
    untainted(
        "taint_file_left_open",
        "rt_file = open('rt-planted.txt', 'w')\nrt_file.write('TAINT')",
        "import gc, io\n"
        "files = [o for o in gc.get_objects() if isinstance(o, io.IOBase)]\n"
        "any('rt-planted' in str(getattr(o, 'name', '')) for o in files)",
    ),
    Attack(
        "taint_tmp_file",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nopen('@TMP@/taint.txt', 'w').write('TAINT')\n"
        "open('/tmp/rt-taint-@PORT@.txt', 'w').write('TAINT')",
        all_of(
            no_file("taint.txt"),
            not_seen_elsewhere(
                "import os\n(os.path.exists('@TMP@/taint.txt'), os.path.exists('/tmp/rt-taint-@PORT@.txt'))",
                "(False, False)",
                sessionless=True,
                refusal_blocks=True,  # Landlock refuses the write outright
            ),
        ),
        # docs/security.md table: subprocess sessions have private working directories; with no isolation
        # they share the host's files, /tmp included.
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="tainter",
        cleanup="import os\nos.remove('/tmp/rt-taint-@PORT@.txt')",
    ),
    Attack(
        "taint_home_file",
        "import os\nopen(os.path.expanduser('~/rt-taint.txt'), 'w').write('TAINT')",
        not_seen_elsewhere("import os\nos.path.exists(os.path.expanduser('~/rt-taint.txt'))", "False"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(
                f"not-protected ({README_INPROCESS}): it would write into the server user's real home"
            ),
        ),
        session="tainter",
    ),
    Attack(
        "taint_working_directory",
        "open('rt-taint.txt', 'w').write('TAINT')",
        not_seen_elsewhere("import os\nos.path.exists('rt-taint.txt')", "False"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(
                "docs/data-and-packages.md: inprocess sessions share one working directory"
            ),
        ),
        session="tainter",
        cleanup="import os\nos.remove('rt-taint.txt')",
    ),
    Attack(
        "taint_js_globals",
        "import js\njs.globalThis.rt_planted = 'TAINT'\njs.eval('globalThis.Array.prototype.rtPlanted = 1')",
        not_seen_elsewhere(
            "import js\njs.eval('typeof globalThis.rt_planted + typeof [].rtPlanted')",
            "'undefinedundefined'",
            sessionless=True,
        ),
        pyodide_only(),
        session="tainter",
    ),
    Attack(
        "taint_survives_reset",
        "import builtins\nrt_planted = 'TAINT'",
        gone_after_reset("'rt_planted' in globals()", "False"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="resettable",
    ),
    # --- the saved sessions (MCP_SANDBOX_STATE_DIR): another session's state, a planted file, a full store
    Attack(
        "read_another_sessions_state",
        program("""
            import hashlib, os
            # The session's name is known; its file's name is a hash of it.
            path = os.path.join("@STATE@", "sessions", hashlib.sha256(b"victim").hexdigest()[:40] + ".state")
            try:
                with open(path, "rb") as file:
                    print(file.read().decode("latin-1"))
            except OSError as error:
                print(type(error).__name__)
        """),
        not_shown(STATE_MARKER),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "plant_a_state_file",
        program("""
            import hashlib, os
            name = hashlib.sha256(b"victim").hexdigest()[:40]
            targets = [("sessions", name + ".state"), ("sessions", "x.state"), ("leases", name + ".lease")]
            for folder, file in targets:
                try:
                    os.makedirs(os.path.join("@STATE@", folder), exist_ok=True)
                    with open(os.path.join("@STATE@", folder, file), "wb") as handle:
                        handle.write(b"mcp-sandbox state 1\\n{}\\n")
                except OSError as error:
                    print(type(error).__name__)
        """),
        state_files_untouched,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "fill_the_state_store",
        "import os\nfiller = os.urandom(24 * 2**20)  # incompressible, over MCP_SANDBOX_MAX_STATE_MB",
        state_store_capped,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip("the in-process backend keeps no checkpoints (docs/sessions.md)"),
        ),
        session="state-filler",
        timeout=20,
        cleanup="del filler",
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
