"""Red team, tenancy: bob attacks what alice owns on one server with a tokens file, over
streamable HTTP with real MCP clients and raw HTTP. Her sessions (by every name that might
reach her scoped one, resets, her busy session), her kept-output links, her output folder, the
audit record, tokens that are almost hers, and her MCP connection's Mcp-Session-Id.

Every attack is from outside the sandbox: the boundary is the server's scoping, which is the
same code on every backend, so one backend serves (see `port`)."""

from __future__ import annotations

import hashlib
import json
import secrets
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import httpx
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from mcp_sandbox.principals import TokenTable
from tests.helpers import as_caller, call, http_server, write_tokens

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
#: A principal removed from the file while the server runs.
CAROL = "carol-token-0123456789abcdef"
#: The server's sole principal (MCP_SANDBOX_AUTH_TOKEN beside the file): one more caller.
OPERATOR = "operator-token-0123456789abcdef"
BOB_DIGEST = "sha256:" + hashlib.sha256(BOB.encode()).hexdigest()
ALICE_SECRET = "alice-only-secret"
#: alice's output, long enough to be cut (MCP_SANDBOX_MAX_OUTPUT_CHARS below) and kept behind a link.
ALICE_KEPT = "ALICE-KEPT-OUTPUT|"
#: How long one attack may take before the server counts as stuck.
ATTACK_S = 30
JSON_ACCEPT = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
#: The protocol version of the initialize handshake, whose connections have an Mcp-Session-Id.
HANDSHAKE_VERSION = "2025-06-18"

#: Session names bob tries for alice's "analysis": her scoped name itself, ways around the "/",
#: look-alikes of it, and names at and past the limits. Each is refused or is bob's own.
CRAFTED_NAMES = [
    "analysis",
    "alice/analysis",
    "/analysis",
    "alice/",
    "../alice",
    "../alice/analysis",
    "..",
    ".",
    "alice%2Fanalysis",
    "alice%2fanalysis",
    "alice\\analysis",
    "alice\u2215analysis",  # division slash
    "alice\uff0fanalysis",  # fullwidth solidus
    "alice\u2044analysis",  # fraction slash
    "\u0430lice/analysis",  # Cyrillic a
    "alice:analysis",
    "alice.analysis",
    "alice",
    " analysis",
    "analysis ",
    "analysis\n",
    "analysis\x00",
    "",
    "a" * 128,
    "a" * 129,
    "analysis" * 1000,
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tenancy")
    tokens = root / "tokens.json"
    # bob's is given as its hash, so "the hash as the token" can be tried against a real entry.
    write_tokens(tokens, {"alice": ALICE, "bob": BOB_DIGEST, "carol": CAROL})
    return {"tokens": tokens, "output": root / "output", "audit": root / "audit.jsonl"}


@pytest.fixture(scope="module")
async def port(anyio_backend: str, folders: dict[str, Path]) -> AsyncIterator[int]:
    # subprocess: the fastest backend that really keeps sessions apart (inprocess is one
    # interpreter, where bob's code could read alice's memory); the scoping under test is the
    # server's own and the same on every backend.
    async with http_server(
        "http",
        MCP_SANDBOX_BACKEND="subprocess",
        MCP_SANDBOX_AUTH_TOKENS_FILE=str(folders["tokens"]),
        MCP_SANDBOX_AUTH_TOKEN=OPERATOR,
        MCP_SANDBOX_OUTPUT_DIR=str(folders["output"]),
        MCP_SANDBOX_AUDIT_LOG=str(folders["audit"]),
        MCP_SANDBOX_MAX_OUTPUT_CHARS="1000",
    ) as (serving, _):
        yield serving


async def attempt(
    client: Client, tool: str, arguments: dict[str, Any]
) -> tuple[bool, str, dict[str, Any] | None]:
    """One bounded tool call: (refused, its text, its structured result)."""
    with anyio.fail_after(ATTACK_S):
        response = await client.call_tool(tool, arguments)
    text = "".join(getattr(block, "text", "") for block in response.content)
    return bool(response.is_error), text, response.structured_content


async def alice_holds_her_secret(alice: Client, session: str = "analysis") -> None:
    kept = await call(alice, "secret", session_id=session)
    assert kept["result"] == repr(ALICE_SECRET), kept
    assert not kept.get("session_lost") and not kept.get("session_restored"), kept


# --- sessions ---------------------------------------------------------------------------------


async def test_no_session_name_reaches_alices_session(port: int) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        assert (await call(alice, f"secret = {ALICE_SECRET!r}", session_id="analysis"))["success"]
        accepted = []
        for name in CRAFTED_NAMES:
            refused, text, result = await attempt(
                bob, "execute_python", {"code": "secret", "session_id": name}
            )
            assert ALICE_SECRET not in text, f"bob read alice's session as {name!r}: {text}"
            if refused:
                assert "session_id" in text, f"{name!r} was refused without saying why: {text}"
                continue
            assert result is not None and result["error_type"] == "NameError", (name, result)
            assert result["session_id"] == name, "an accepted name is bob's own, as he gave it"
            accepted.append(name)
        # The names bob may use are plain ones: nothing with a slash, a dot-only name or a look-alike.
        assert set(accepted) <= {"analysis", "alice:analysis", "alice.analysis", "alice", "a" * 128}, accepted
        await alice_holds_her_secret(alice)


async def test_no_reset_reaches_alices_session(port: int) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        assert (await call(alice, f"secret = {ALICE_SECRET!r}", session_id="to-reset"))["success"]
        for name in ["to-reset", "alice/to-reset", "../alice/to-reset", "alice%2Fto-reset", "alice:to-reset"]:
            refused, text, result = await attempt(bob, "reset_session", {"session_id": name})
            assert refused or (result is not None and result["existed"] is False), (name, text)
        await alice_holds_her_secret(alice, "to-reset")


async def test_a_call_on_alices_busy_session_name_does_not_wait_for_hers(port: int) -> None:
    running = anyio.Event()
    alice_done = anyio.Event()

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        if message and "alice-busy" in message:
            running.set()  # her program printed: it runs, holding her session

    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:

        async def alices_long_call() -> None:
            code = "print('alice-busy', flush=True)\nimport time\ntime.sleep(60)"
            arguments = {"code": code, "session_id": "busy", "timeout": 20}
            await alice.call_tool("execute_python", arguments, progress_callback=heard)
            alice_done.set()

        async with anyio.create_task_group() as group:
            group.start_soon(alices_long_call)
            with anyio.fail_after(ATTACK_S):
                await running.wait()
            with anyio.fail_after(10):
                theirs = await call(bob, "'bob ran'", session_id="busy")
            assert theirs["result"] == "'bob ran'", theirs
            assert not alice_done.is_set(), "bob's call ended only after alice's: it waited for hers"


# --- kept-output links ------------------------------------------------------------------------


async def test_alices_kept_output_link_reads_for_her_only(port: int) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        cut = await call(alice, f"print({ALICE_KEPT!r} * 200)", session_id="kept")
        link = cut["stdout_uri"]
        assert link is not None and link.startswith("sandbox://kept/"), cut
        whole = await alice.read_resource(link)
        assert ALICE_KEPT * 200 in whole.contents[0].text  # type: ignore[union-attr]
        call_id = link.removeprefix("sandbox://kept/").split("/")[0]
        tricks = [
            link,
            f"{link}?first=1&last=-1",
            f"{link}?first=1&first=2",
            f"{link}?principal=alice",
            f"{link}#alice",
            f"{link}/",
            f"sandbox://kept/{call_id}/stderr",
            f"sandbox://kept/{call_id}%2Fstdout",
            f"sandbox://kept/./{call_id}/stdout",
            f"sandbox://kept/../kept/{call_id}/stdout",
            f"sandbox://kept/{call_id}/../{call_id}/stdout",
            f"sandbox://alice@kept/{call_id}/stdout",
            f"sandbox://KEPT/{call_id}/stdout",
            f"sandbox://kept/alice/{call_id}/stdout",
            f"sandbox://kept/alice%2F{call_id}/stdout",
            f"sandbox://kept/{call_id.upper()}/stdout",
            "sandbox://kept/{call}/{stream}",
            "sandbox://kept/%7Bcall%7D/stdout",
        ]
        # Guesses: links are 96 random bits, so a bounded number of tries finds nothing.
        tricks += [f"sandbox://kept/{secrets.token_urlsafe(12)}/stdout" for _ in range(50)]
        for uri in tricks:
            with anyio.fail_after(ATTACK_S), pytest.raises(MCPError):
                read = await bob.read_resource(uri)
                assert ALICE_KEPT not in json.dumps(read.model_dump(mode="json")), f"bob read {uri}"
        listed = [
            (await bob.list_resources()).model_dump(mode="json"),
            (await bob.list_resource_templates()).model_dump(mode="json"),
        ]
        assert call_id not in json.dumps(listed) and "alice" not in json.dumps(listed), listed
        assert link in json.dumps((await alice.list_resources()).model_dump(mode="json")), "hers lists it"
        # Still hers after all that.
        assert ALICE_KEPT in (await alice.read_resource(link)).contents[0].text  # type: ignore[union-attr]


# --- output files -----------------------------------------------------------------------------

#: bob's program: files named to climb out of his folder, into alice's, by every way a program can.
PLANT_OUTPUT = """
import os
tried = []
for name in ['../alice/analysis/planted.txt', '../../alice/analysis/planted.txt',
             'alice/analysis/planted.txt', '..%2Falice%2Fanalysis%2Fplanted.txt']:
    try:
        path = os.path.join('output', name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, 'w').write('planted by bob')
        tried.append(name)
    except OSError as error:
        tried.append(type(error).__name__)
for link, target in [('output/up', '..'), ('output/root', '/'), ('output/alice', '../../alice')]:
    try:
        os.symlink(target, link)
    except OSError:
        pass
tried
"""


async def test_bob_lands_no_file_in_alices_output_folder(port: int, folders: dict[str, Path]) -> None:
    output = folders["output"]
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        wrote = await call(alice, "open('output/hers.txt', 'w').write('alice')", session_id="analysis")
        assert wrote["success"], wrote
        for session in ["analysis", "alice", "one-off", "..", "alice/analysis", "../alice", None]:
            arguments: dict[str, Any] = {"code": PLANT_OUTPUT}
            if session is not None:
                arguments["session_id"] = session
            refused, text, _ = await attempt(bob, "execute_python", arguments)
            assert not refused or "session_id" in text, (session, text)
    assert (output / "alice" / "analysis" / "hers.txt").read_text() == "alice"
    planted = [path for path in output.rglob("*") if path.is_file() and path.read_text() == "planted by bob"]
    assert planted, "bob's own files are copied out: the attack reached the copying"
    assert all(path.relative_to(output).parts[0] == "bob" for path in planted), planted
    assert not [path for path in output.rglob("*") if path.is_symlink()], "a link was copied out"


async def test_the_operators_session_named_alice_lands_no_file_in_alices_folder(
    port: int, folders: dict[str, Path]
) -> None:
    output = folders["output"]
    async with as_caller(port, OPERATOR) as operator:
        code = "import os\nos.makedirs('output/analysis')\nopen('output/analysis/x.txt', 'w').write('op')"
        assert (await call(operator, code, session_id="alice"))["success"]
    assert not (output / "alice" / "analysis" / "x.txt").exists(), (
        "the operator wrote into alice's session folder"
    )
    # The sole principal's folder is one no principal's name can be.
    assert (output / "_sole" / "alice" / "analysis" / "x.txt").read_text() == "op"


# --- the audit record -------------------------------------------------------------------------


async def test_each_audit_record_names_the_caller(port: int, folders: dict[str, Path]) -> None:
    async def audited(client: Client, who: str, turn: int) -> None:
        await call(client, f"'{who}-{turn}'  # audited", session_id="audited")

    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        async with anyio.create_task_group() as group:
            for turn in range(5):  # interleaved, same session name: a record must not take the other's
                for client, who in ((alice, "alice"), (bob, "bob")):
                    group.start_soon(audited, client, who, turn)
    records = [json.loads(line) for line in folders["audit"].read_text().splitlines()]
    ours = [record for record in records if record["code"].endswith("# audited")]
    assert len(ours) == 10, ours
    for record in ours:
        assert record["code"].startswith(f"'{record['principal']}-"), record
    assert all(record["principal"] in ("alice", "bob", None) for record in records)


# --- tokens -----------------------------------------------------------------------------------


async def status(port: int, authorization: str | None) -> int:
    """The status of an initialize POST to /mcp with that Authorization header."""
    headers = dict(JSON_ACCEPT)
    if authorization is not None:
        headers["Authorization"] = authorization
    async with httpx.AsyncClient(timeout=ATTACK_S) as plain:
        response = await plain.post(f"http://127.0.0.1:{port}/mcp", headers=headers, json=initialize())
    return response.status_code


def initialize() -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": HANDSHAKE_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"},
        },
    }


async def test_tokens_that_are_not_quite_a_principals_are_refused(port: int) -> None:
    assert await status(port, f"Bearer {ALICE}") == 200, "alice's own token is the control"
    refused = {
        "wrong": f"Bearer {secrets.token_urlsafe(24)}",
        "none": None,
        "no scheme": ALICE,
        "basic scheme": f"Basic {ALICE}",
        "leading space": f"Bearer  {ALICE}",
        "alice's with more": f"Bearer {ALICE}x",
        "alice's less one": f"Bearer {ALICE[:-1]}",
        "alice's with a space inside": f"Bearer {ALICE} x",
        "bob's sha256 entry as the token": f"Bearer {BOB_DIGEST}",
        "bob's hash without its prefix": f"Bearer {BOB_DIGEST.removeprefix('sha256:')}",
        "bob's hash upper-cased": f"Bearer {BOB_DIGEST.upper()}",
    }
    for why, authorization in refused.items():
        assert await status(port, authorization) == 401, why


def raw_status(port: int, header_line: bytes) -> int:
    """The status of an initialize POST sent byte for byte, so a trailing space or newline in the
    Authorization header goes out as written (httpx would refuse or trim it)."""
    body = json.dumps(initialize()).encode()
    request = (
        b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Accept: application/json, text/event-stream\r\nContent-Length: %d\r\nConnection: close\r\n"
        % (port, len(body))
    )
    with socket.create_connection(("127.0.0.1", port), timeout=ATTACK_S) as sock:
        sock.sendall(request + header_line + b"\r\n" + body)
        head = sock.recv(64)
    return int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else 0


async def test_alices_token_with_a_trailing_space_or_newline_is_refused(
    port: int, folders: dict[str, Path]
) -> None:
    token = ALICE.encode()
    header = b"Authorization: Bearer " + token
    # Whitespace at the end of a header line is not part of its value (RFC 9110 5.5): the parser
    # drops it before any code of ours, so what arrives is alice's token, exactly.
    for line in (header + b"\r\n", header + b" \r\n", header + b"\t\r\n"):
        assert await anyio.to_thread.run_sync(raw_status, port, line) == 200, line
    # Every way the whitespace could stay in the value is refused, by the parser (400) or by us (401).
    for why, line in {
        "a space, then a bare newline": header + b" \n\r\n",
        "a carriage return": header + b"\r\r\n",
        "a vertical tab": header + b"\x0b\r\n",
        "a NUL": header + b"\x00\r\n",
        "a no-break space": header + b"\xa0\r\n",
        "an escaped newline": header + b"\\n\r\n",
        "a folded line": header + b"\r\n x\r\n",
        "no token": b"Authorization: Bearer \r\n",
    }.items():
        got = await anyio.to_thread.run_sync(raw_status, port, line)
        assert got in (400, 401), (why, got)
    # And the table the server checks tokens against (the same file) knows no such token.
    table = TokenTable(folders["tokens"])
    assert table.principal(ALICE) == "alice"
    for almost in (ALICE + " ", ALICE + "\n", ALICE + "\r\n", " " + ALICE, ALICE.upper()):
        assert table.principal(almost) is None, repr(almost)


async def test_a_principal_removed_from_the_file_is_refused_from_then_on(
    port: int, folders: dict[str, Path]
) -> None:
    async with as_caller(port, CAROL) as carol:
        assert (await call(carol, "6 * 7"))["result"] == "42"
        table = json.loads(folders["tokens"].read_text())
        del table["carol"]
        write_tokens(folders["tokens"], table)
        with anyio.fail_after(ATTACK_S):
            while await status(port, f"Bearer {CAROL}") != 401:
                await anyio.sleep(0.1)
        # The connection she opened before is refused too: every request's token is checked.
        with anyio.fail_after(ATTACK_S), pytest.raises(MCPError):
            await carol.call_tool("execute_python", {"code": "6 * 7"})
    assert await status(port, f"Bearer {ALICE}") == 200, "the others stay"


# --- alice's MCP connection -------------------------------------------------------------------


def message_of(response: httpx.Response) -> dict[str, Any] | None:
    """The JSON-RPC answer in a response, as JSON or as a server-sent event."""
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in response.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                found: dict[str, Any] = json.loads(line[5:])
                if "id" in found:
                    return found
        return None
    return response.json() if response.content else None


async def test_bob_cannot_use_alices_mcp_session_id(port: int) -> None:
    url = f"http://127.0.0.1:{port}/mcp"

    def headers(token: str, session: str) -> dict[str, str]:
        return {
            **JSON_ACCEPT,
            "Authorization": f"Bearer {token}",
            "Mcp-Session-Id": session,
            "MCP-Protocol-Version": HANDSHAKE_VERSION,
        }

    def tool_call(code: str, number: int) -> dict[str, Any]:
        arguments = {"code": code, "session_id": "connected"}
        return {
            "jsonrpc": "2.0",
            "id": number,
            "method": "tools/call",
            "params": {"name": "execute_python", "arguments": arguments},
        }

    async with httpx.AsyncClient(timeout=ATTACK_S) as plain:
        opened = await plain.post(
            url, headers={**JSON_ACCEPT, "Authorization": f"Bearer {ALICE}"}, json=initialize()
        )
        assert opened.status_code == 200, opened.text
        session = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await plain.post(url, headers=headers(ALICE, session), json=initialized)).status_code == 202
        hers = await plain.post(
            url, headers=headers(ALICE, session), json=tool_call(f"secret = {ALICE_SECRET!r}", 2)
        )
        answer = message_of(hers)
        assert answer is not None and answer["result"]["structuredContent"]["success"], hers.text

        posted = await plain.post(url, headers=headers(BOB, session), json=tool_call("secret", 3))
        assert ALICE_SECRET not in posted.text
        assert posted.status_code in (403, 404), f"bob's call ran in alice's connection: {posted.text}"
        for token, allowed in ((ALICE, (200,)), (BOB, (403, 404))):
            stream_headers = {**headers(token, session), "Accept": "text/event-stream"}
            async with plain.stream("GET", url, headers=stream_headers) as stream:
                assert stream.status_code in allowed, f"{token}: the stream of alice's server messages"
        deleted = await plain.delete(url, headers=headers(BOB, session))
        assert deleted.status_code in (403, 404), "bob ended alice's connection"

        again = await plain.post(url, headers=headers(ALICE, session), json=tool_call("secret", 4))
        answer = message_of(again)
        assert answer is not None, again.text
        assert answer["result"]["structuredContent"]["result"] == repr(ALICE_SECRET), answer
        assert (await plain.delete(url, headers=headers(ALICE, session))).status_code == 200, "hers to end"
