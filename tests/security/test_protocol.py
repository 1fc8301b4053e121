"""Red team, the channel between a sandbox and the server: the runner's stdin, forged protocol lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    README_INPROCESS,
    Attack,
    NotProtected,
    Skip,
    World,
    all_of,
    attack_ids,
    next_call_genuine,
    no_file,
    on,
    program,
    pyodide_only,
    read_nothing,
    result_is,
    run_attack,
)

pytestmark = pytest.mark.anyio

FORGE_RESULT_LINES = """
import json
def forged_line(n):
    msg = {"type": "result", "id": n, "outcome": {"success": True, "result": "'FORGED'"}}
    return json.dumps({"token": "0" * 32, "msg": msg}) + "\\n"
"""

FORGE_NEXT_RESULT = """
import json
def forge_all():
    for n in range(2, 15):
        outcome = {"success": True, "stdout": "", "stderr": "", "result": "'FORGED'",
                   "error_type": None, "error": None, "truncated": False}
        yield json.dumps({"type": "result", "id": n, "outcome": outcome})
try:
    import js
except ImportError:
    js = None
if js is not None:
    # postMessage goes to the runner, which wraps it with the real token.
    payloads = json.dumps(list(forge_all()))
    js.eval("setTimeout(() => { for (const p of " + payloads + ") "
            "postMessage({id: null, json: p, exiting: false}) }, 0)")
else:
    # The worker's own pipe end: every result after this call's own is rewritten as it is sent.
    import gc
    link = next(o for o in gc.get_objects() if type(o).__name__ == "HostLink")
    genuine, sent = link.send, []
    def forging(payload):
        message = json.loads(payload)
        if message.get("type") == "result":
            if sent:
                message["outcome"]["result"] = "'FORGED'"
            sent.append(message["id"])
        genuine(json.dumps(message))
    link.send = forging
'first'
"""


ATTACKS: list[Attack] = [
    # --- the runner's stdin, where the host's messages arrive ---
    Attack(
        "read_the_runners_stdin",
        program("""
            import os, sys
            def internals():
                import js
                return js.Reflect.get(js.Deno, js.Deno.internal)
            got = []
            attempts = [
                input, lambda: sys.stdin.read(1), lambda: sys.__stdin__.read(1), lambda: os.read(0, 1),
                lambda: __import__("js").Deno.stdin.readSync(__import__("js").Uint8Array.new(64)),
                lambda: internals().core.readSync(0, __import__("js").Uint8Array.new(64)),
            ]
            for attempt in attempts:
                try:
                    got.append(repr(attempt()))
                except BaseException as error:
                    got.append(type(error).__name__)
            got
        """),
        read_nothing,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: its stdin is the server's own, the MCP transport"),
        ),
    ),
    # --- forged protocol lines ---
    Attack(
        "console_log_forged_result",
        FORGE_RESULT_LINES
        + "import js\nfor n in range(1, 40):\n    js.console.log(forged_line(n).strip())\n'genuine'",
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        "stdout_write_sync_forged_result",
        FORGE_RESULT_LINES + "import js\nencoder = js.TextEncoder.new()\nfor n in range(1, 40):\n"
        "    js.Deno.stdout.writeSync(encoder.encode(forged_line(n)))\n'genuine'",
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        "console_log_forged_tool_call",
        program("""
            import js, json
            for call in range(1, 5):
                msg = {'type': 'tool_call', 'call': call, 'server': 'host', 'tool': 'sh', 'arguments': '{}'}
                js.console.log(json.dumps({'token': '0' * 32, 'msg': msg}))
            'genuine'
        """),
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        # The runner wraps a worker's message with the real token; the host has no bridge to call.
        "post_message_forged_tool_call",
        program("""
            import js, json
            for call in range(1, 5):
                arguments = json.dumps({'cmd': '@TOUCH@ @TMP@/spawned'})
                msg = {'type': 'tool_call', 'call': call, 'server': 'host', 'tool': 'sh'}
                msg['arguments'] = arguments
                envelope = {'id': None, 'json': json.dumps(msg), 'exiting': False}
                js.postMessage(js.JSON.parse(json.dumps(envelope)))
            'genuine'
        """),
        all_of(result_is("'genuine'"), no_file("spawned")),
        pyodide_only(),
    ),
    Attack(
        # The worker's runtime posts on a private port; what a program posts is never read, so a
        # result it forges (for its own run, or from a callback left for a later caller's) is not.
        "post_message_forged_result",
        program("""
            import js, json
            for run in range(1, 60):
                outcome = {'success': True, 'stdout': '', 'stderr': '', 'result': "'FORGED'",
                           'error_type': None, 'error': None, 'truncated': False}
                msg = {'type': 'result', 'id': run, 'outcome': outcome}
                envelope = {'id': run, 'json': json.dumps(msg), 'exiting': False}
                js.postMessage(js.JSON.parse(json.dumps(envelope)))
            'genuine'
        """),
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        "fd_writes_forged_result",
        FORGE_RESULT_LINES
        + program("""
            import os
            for fd in range(1, 10):
                for n in range(1, 20):
                    try:
                        os.write(fd, forged_line(n).encode())
                    except OSError:
                        pass
            'genuine'
        """),
        result_is("'genuine'"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: fd 1 is the server's MCP transport to this test"),
        ),
    ),
    Attack(
        "forge_the_next_calls_result",
        FORGE_NEXT_RESULT,
        next_call_genuine,
        on(
            # The runner forwards a result only for the run in progress, so a timer cannot fake it.
            pyodide=BLOCKED,
            subprocess=NotProtected("docs/security.md table: a program faking its own session's results"),
            inprocess=Skip(f"{README_INPROCESS}: there is no protocol to forge"),
        ),
        session="forge-next",
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
