"""Red team, the host folders a sandbox is given: data/ in, output/ out."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    INPROCESS_SHARES,
    NO_CANARY,
    OUTSIDE_TEXT,
    READS_DECIDE,
    VICTIM_TEXT,
    WRITES_DECIDE,
    Attack,
    NotProtected,
    World,
    all_of,
    attack_ids,
    data_intact,
    failed,
    no_file,
    not_shown,
    on,
    outside_output_absent,
    run_attack,
)

pytestmark = pytest.mark.anyio


ATTACKS: list[Attack] = [
    # --- host folders: data/ in, output/ out ---
    Attack(
        "data_folder_write",
        "open('data/victim.txt', 'w').write('changed')",
        all_of(failed, data_intact("victim.txt", VICTIM_TEXT)),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "data_folder_write_through_ctypes",
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        "fd = libc.open(os.path.realpath('data/victim.txt').encode(), os.O_WRONLY | os.O_TRUNC)\n"
        "libc.write(fd, b'changed', 7)\nlibc.close(fd)\nfd",
        data_intact("victim.txt", VICTIM_TEXT),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,  # data/ is a read-only bind (bubblewrap), read-only to Landlock
            unconfined=WRITES_DECIDE,
            inprocess=NotProtected("docs/data-and-packages.md: the audit hook stops mistakes, not ctypes"),
        ),
        session="crash",
    ),
    Attack(
        # docs/data-and-packages.md: the Pyodide worker may read only the Pyodide and packages folders.
        "data_folder_symlink_to_outside",
        "try:\n    import js\n    text = js.Deno.readTextFileSync('@DATA@/link.txt')\nexcept ImportError:\n"
        "    text = open('data/link.txt').read()\ntext",
        not_shown(OUTSIDE_TEXT),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        # docs/data-and-packages.md: files are "copied to MCP_SANDBOX_OUTPUT_DIR/<session_id>/"; ".." is
        # a valid session id.
        "output_dir_escape_through_session_id",
        "open('output/rt-planted.txt', 'w').write('planted by the sandbox')",
        outside_output_absent("rt-planted.txt"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="..",
    ),
    Attack(
        "host_file_read",
        "open('@CANARY@').read()",
        NO_CANARY,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "host_file_write",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nopen('@TMP@/written', 'w').write('x')",
        no_file("written"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
