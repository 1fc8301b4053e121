"""Red team, the network: connections and datagrams to listeners the test owns."""

from __future__ import annotations

from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    INPROCESS_SHARES,
    SUBPROCESS_NETWORK,
    WRITES_DECIDE,
    Attack,
    World,
    all_of,
    attack_ids,
    failed,
    no_connection,
    no_datagram,
    on,
    port_closed,
    program,
    pyodide_only,
    result_is,
    run_attack,
)

pytestmark = pytest.mark.anyio


ATTACKS: list[Attack] = [
    # --- network, to listeners the test owns ---
    Attack(
        "fetch_host_listener",
        "import js\nawait js.fetch('http://127.0.0.1:@PORT@/')",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_connect",
        'import js\nawait js.Deno.connect(js.JSON.parse(\'{"hostname": "127.0.0.1", "port": @PORT@}\'))',
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_connect_tls",
        'import js\nawait js.Deno.connectTls(js.JSON.parse(\'{"hostname": "127.0.0.1", "port": @PORT@}\'))',
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_listen_and_serve",
        program("""
            import js
            opened = []
            where = "{hostname: '127.0.0.1', port: @CLOSED_PORT@}"
            for source in (f"Deno.listen({where})", f"Deno.serve({where}, () => new Response('x'))"):
                try:
                    js.eval(source)
                    opened.append(source)
                except Exception:
                    pass
            opened
        """),
        all_of(port_closed, result_is("[]")),
        pyodide_only(),
    ),
    Attack(
        "websocket_to_host",
        "import js, asyncio\nsocket = js.WebSocket.new('ws://127.0.0.1:@PORT@/')\n"
        "await asyncio.sleep(0.3)\nsocket.readyState",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "event_source_to_host",
        "import js, asyncio\nsource = js.EventSource.new('http://127.0.0.1:@PORT@/')\n"
        "await asyncio.sleep(0.3)\nsource.readyState",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "dns_query_to_host_udp",
        'import js\nserver = js.JSON.parse(\'{"nameServer": {"ipAddr": "127.0.0.1", "port": @UDP_PORT@}}\')\n'
        "await js.Deno.resolveDns('example.com', 'A', server)",
        all_of(failed, no_datagram),
        pyodide_only(),
    ),
    Attack(
        "dynamic_import_over_http",
        "import js\nawait js.eval(\"import('http://127.0.0.1:@PORT@/module.js')\")",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "python_socket_connect",
        "import socket\nsocket.create_connection(('127.0.0.1', @PORT@), timeout=2).close()",
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=SUBPROCESS_NETWORK, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "python_urllib",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=2).read()",
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=SUBPROCESS_NETWORK, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "deno_connect_unix_socket",
        program("""
            import js
            await js.Deno.connect(js.JSON.parse('{"transport": "unix", "path": "@TMP@/service.sock"}'))
        """),
        no_connection,
        pyodide_only(),
    ),
    Attack(
        # A network namespace does not cover sockets that live in the file system (docker.sock, ...).
        "python_unix_socket_to_host_service",
        program("""
            import socket
            client = socket.socket(socket.AF_UNIX)
            client.connect('@TMP@/service.sock')
            client.close()
        """),
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
