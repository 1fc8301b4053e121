"""Red team, JavaScript and Deno (pyodide): their file APIs reached from Python, permission
requests, nested workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    MODULE_TEXT,
    NO_CANARY,
    VICTIM_TEXT,
    Attack,
    World,
    all_of,
    attack_ids,
    canary_intact,
    data_intact,
    failed,
    no_connection,
    no_file,
    not_shown,
    pyodide_only,
    result_lacks,
    result_lacks_any,
    run_attack,
    runner_files_unchanged,
)

pytestmark = pytest.mark.anyio


# A worker of its own, from a Blob, that tries to write a host file and says how it went.
NESTED_WORKER = """
import js, asyncio
js.eval('''
globalThis.rtSaid = [];
const source = `try { Deno.writeTextFileSync("@TMP@/escaped", "x"); postMessage("wrote") }
                catch (e) { postMessage("refused: " + e) }`;
const url = URL.createObjectURL(new Blob([source], {type: "application/javascript"}));
globalThis.rtWorker = new Worker(url, @OPTIONS@);
rtWorker.onmessage = (e) => rtSaid.push(e.data);
rtWorker.onerror = (e) => { rtSaid.push("error: " + e.message); e.preventDefault() };
''')
for _ in range(40):  # a new worker takes a while to start on a busy machine
    if js.rtSaid.length:
        break
    await asyncio.sleep(0.1)
list(js.rtSaid)
"""


ATTACKS: list[Attack] = [
    # --- reaching JavaScript and Deno's file APIs (pyodide) ---
    Attack(
        "js_deno_reads_host_file",
        "import js\njs.Deno.readTextFileSync('@CANARY@')",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "run_js_reads_host_file",
        "from pyodide.code import run_js\nrun_js(\"Deno.readTextFileSync('@CANARY@')\")",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "js_eval_writes_host_file",
        "import js\njs.eval(\"Deno.writeTextFileSync('@TMP@/escaped', 'x')\")",
        no_file("escaped"),
        pyodide_only(),
    ),
    Attack(
        "pyodide_js_mounts_host_folder",
        "import pyodide_js\npyodide_js.mountNodeFS('/mnt/host', '@TMP@')\n"
        "open('/mnt/host/escaped', 'w').write('x')\nopen('/mnt/host/canary.txt').read()",
        all_of(no_file("escaped"), NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "deno_write_file",
        "import js\njs.Deno.writeTextFileSync('@TMP@/escaped', 'x')",
        no_file("escaped"),
        pyodide_only(),
    ),
    Attack(
        "deno_remove_file",
        "import js\njs.Deno.removeSync('@CANARY@')",
        canary_intact,
        pyodide_only(),
    ),
    Attack(
        "deno_mkdir",
        "import js\njs.Deno.mkdirSync('@TMP@/newdir')",
        no_file("newdir"),
        pyodide_only(),
    ),
    Attack(
        "deno_rename_file",
        "import js\njs.Deno.renameSync('@CANARY@', '@TMP@/moved')",
        all_of(canary_intact, no_file("moved")),
        pyodide_only(),
    ),
    Attack(
        "deno_symlink",
        "import js\njs.Deno.symlinkSync('/etc/passwd', '@TMP@/link')",
        no_file("link"),
        pyodide_only(),
    ),
    Attack(
        "deno_open_create_truncate",
        'import js\nopts = js.JSON.parse(\'{"write": true, "create": true}\')\n'
        "js.Deno.openSync('@TMP@/created', opts)\n"
        "js.Deno.truncateSync('@CANARY@', 0)",
        all_of(no_file("created"), canary_intact),
        pyodide_only(),
    ),
    Attack(
        "deno_list_host_folder",
        "import js\n[entry.name for entry in js.Deno.readDirSync('@TMP@')]",
        all_of(failed, not_shown("canary.txt", "secret.mjs")),
        pyodide_only(),
    ),
    Attack(
        "fetch_file_url",
        "import js\nresponse = await js.fetch('file://@CANARY@')\nawait response.text()",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "dynamic_import_of_host_module",
        "import js\nmodule = await js.eval(\"import('file://@TMP@/secret.mjs')\")\nmodule.s",
        all_of(failed, not_shown(MODULE_TEXT)),
        pyodide_only(),
    ),
    Attack(
        "node_fs_reads_host_file",
        "import js\nfs = await js.eval(\"import('node:fs')\")\nfs.readFileSync('@CANARY@', 'utf8')",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "poison_runner_and_pyodide_files",
        "import js\nappended = []\nfor path in @POISON@:\n    try:\n"
        "        js.Deno.writeTextFileSync(path, '', js.JSON.parse('{\"append\": true}'))\n"
        "        appended.append(path)\n    except Exception:\n        pass\nappended",
        runner_files_unchanged,
        pyodide_only(),
    ),
    Attack(
        "deno_writes_data_folder",
        "import js\njs.Deno.writeTextFileSync('@DATA@/victim.txt', 'changed')",
        data_intact("victim.txt", VICTIM_TEXT),
        pyodide_only(),
    ),
    # --- permissions: asking must neither prompt nor hang nor grant ---
    Attack(
        "permissions_request_net_then_fetch",
        'import js\nrequest = js.JSON.parse(\'{"name": "net", "host": "127.0.0.1:@PORT@"}\')\n'
        "state = (await js.Deno.permissions.request(request)).state\n"
        "try:\n    await js.fetch('http://127.0.0.1:@PORT@/')\nexcept Exception:\n    pass\nstate",
        all_of(no_connection, result_lacks("granted")),
        pyodide_only(),
        timeout=3,
    ),
    Attack(
        "permissions_request_sync_everything",
        "import js\nasks = ['{\"name\": \"%s\"}' % n for n in ('run', 'env', 'write', 'ffi', 'sys', 'net')]\n"
        'asks.append(\'{"name": "read", "path": "@CANARY@"}\')\n'
        "[js.Deno.permissions.requestSync(js.JSON.parse(a)).state for a in asks]",
        result_lacks("granted"),
        pyodide_only(),
        timeout=3,
    ),
    Attack(
        "permissions_query",
        "import js\nstates = []\n"
        'for ask in (\'{"name": "read", "path": "@CANARY@"}\', \'{"name": "write", "path": "@TMP@"}\',\n'
        '            \'{"name": "net"}\', \'{"name": "env"}\', \'{"name": "run"}\'):\n'
        "    states.append((await js.Deno.permissions.query(js.JSON.parse(ask))).state)\nstates",
        result_lacks("granted"),
        pyodide_only(),
        timeout=3,
    ),
    # --- nested workers ---
    Attack(
        "nested_worker_asks_for_permissions",
        NESTED_WORKER.replace(
            "@OPTIONS@", "{type: 'module', deno: {permissions: {write: true, read: true}}}"
        ),
        all_of(no_file("escaped"), result_lacks("wrote")),
        pyodide_only(),
        session="crash",
    ),
    Attack(
        "nested_worker_writes",
        NESTED_WORKER.replace("@OPTIONS@", "{type: 'module'}"),
        all_of(no_file("escaped"), result_lacks("wrote")),
        pyodide_only(),
        session="crash",
    ),
    # --- V8's collector: the runner exposes it to its workers, which take it off the global ---
    Attack(
        "js_reaches_the_collector",
        "import js\njs.eval('[typeof globalThis.gc, typeof self.gc].join()')",
        result_lacks("function"),
        pyodide_only(),
    ),
    # --- import() through Pyodide's runtime script, which runs under node:vm with its own hook ---
    Attack(
        "js_import_error_names_host_paths",
        "import js\ntry:\n    await js.eval(\"import('no-such-module-anywhere')\")\n    said = 'imported'\n"
        "except Exception as error:\n    said = str(error)\nsaid",
        result_lacks_any("registry.npmjs.org", "mcp-sandbox/deno", "pyodide.asm.js", "imported"),
        pyodide_only(),
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
