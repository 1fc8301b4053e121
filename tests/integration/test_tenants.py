"""Callers are tenants: over streamable HTTP with MCP_SANDBOX_AUTH_TOKENS_FILE, each caller is the
principal its token names, and what one principal owns the other cannot reach."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.shared.exceptions import MCPError

from tests.helpers import as_caller, call, http_server, server_env, state_file
from tests.issuer import ISSUER, RESOURCE, Issuer, write_jwks

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
CAROL = "carol-token-0123456789abcdef"
#: Long enough to be cut (MCP_SANDBOX_MAX_OUTPUT_CHARS below), so it is kept behind a link.
LONG_PRINT = "print('x' * 5000)"


def write_tokens(path: Path, table: dict[str, str]) -> None:
    path.write_text(json.dumps(table), encoding="utf-8")
    path.chmod(0o600)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tenants")
    tokens = root / "tokens.json"
    # bob's is given as its hash: the file need not hold his secret.
    write_tokens(tokens, {"alice": ALICE, "bob": "sha256:" + hashlib.sha256(BOB.encode()).hexdigest()})
    return {
        "tokens": tokens,
        "output": root / "output",
        "audit": root / "audit.jsonl",
        "state": root / "state",
    }


@pytest.fixture(scope="module")
async def port(anyio_backend: str, folders: dict[str, Path]) -> AsyncIterator[int]:
    async with http_server(
        "http",
        MCP_SANDBOX_AUTH_TOKENS_FILE=str(folders["tokens"]),
        MCP_SANDBOX_OUTPUT_DIR=str(folders["output"]),
        MCP_SANDBOX_AUDIT_LOG=str(folders["audit"]),
        MCP_SANDBOX_STATE_DIR=str(folders["state"]),
        MCP_SANDBOX_MAX_OUTPUT_CHARS="1000",
        MCP_SANDBOX_BACKEND="subprocess",
    ) as (serving, _):
        yield serving


async def neither_reads_nor_resets_the_other(alice: Client, bob: Client) -> None:
    """alice and bob both name a session "analysis": bob sees none of alice's, and his reset
    ends only his own."""
    assert (await call(alice, "secret = 'alice-only'", session_id="analysis"))["success"]
    seen = await call(bob, "print(secret)", session_id="analysis")
    assert seen["error_type"] == "NameError", seen
    assert seen["session_id"] == "analysis"
    reset = await bob.call_tool("reset_session", {"session_id": "analysis"})
    assert reset.structured_content is not None
    assert reset.structured_content["existed"] is True, "bob's own session (made by his print) is reset"
    again = await bob.call_tool("reset_session", {"session_id": "analysis"})
    assert again.structured_content is not None and again.structured_content["existed"] is False
    kept = await call(alice, "secret", session_id="analysis")
    assert kept["result"] == "'alice-only'", kept
    assert not kept.get("session_lost") and not kept.get("session_restored"), kept


async def test_the_same_session_name_is_two_sessions_and_neither_reads_or_resets_the_other(
    port: int, folders: dict[str, Path]
) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        await neither_reads_nor_resets_the_other(alice, bob)
    # Its checkpoint is stored under the principal's name for it, once the session is idle.
    with anyio.fail_after(30):
        while not state_file(folders["state"], "alice/analysis").exists():
            await anyio.sleep(0.1)
    assert not state_file(folders["state"], "analysis").exists()


async def test_a_kept_output_link_reads_only_for_its_principal(port: int) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
        cut = await call(alice, LONG_PRINT, session_id="kept")
        link = cut["stdout_uri"]
        assert link is not None, cut
        whole = await alice.read_resource(link)
        assert whole.contents[0].text == "x" * 5000 + "\n"  # type: ignore[union-attr]
        with pytest.raises(MCPError, match="nothing is kept as"):
            await bob.read_resource(link)
        # Listing shows each principal its own kept outputs, and nothing of the other's.
        assert link in [str(resource.uri) for resource in (await alice.list_resources()).resources]
        bobs = await call(bob, LONG_PRINT, session_id="kept")
        listed = [str(resource.uri) for resource in (await bob.list_resources()).resources]
        assert bobs["stdout_uri"] in listed and link not in listed, listed


async def test_output_files_and_audit_records_carry_the_principal(
    port: int, folders: dict[str, Path]
) -> None:
    async with as_caller(port, BOB) as bob:
        wrote = await call(bob, "open('output/report.txt', 'w').write('bob')", session_id="files")
        assert wrote["success"], wrote
    assert (folders["output"] / "bob" / "files" / "report.txt").read_text() == "bob"
    records = [json.loads(line) for line in folders["audit"].read_text().splitlines()]
    assert {"bob"} <= {record["principal"] for record in records if record["session_id"] == "files"}


async def test_an_unknown_token_is_refused_and_a_principal_added_to_the_file_is_let_in(
    port: int, folders: dict[str, Path]
) -> None:
    url = f"http://127.0.0.1:{port}/mcp"
    async with httpx.AsyncClient() as plain:
        for headers in ({}, {"Authorization": f"Bearer {CAROL}"}, {"Authorization": ALICE}):
            response = await plain.post(url, headers=headers, json={})
            assert response.status_code == 401, headers
    table = json.loads(folders["tokens"].read_text())
    write_tokens(folders["tokens"], {**table, "carol": CAROL})
    async with as_caller(port, CAROL) as carol:
        assert (await call(carol, "6 * 7"))["result"] == "42"


def test_a_tokens_file_others_can_read_keeps_the_server_from_starting(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, {"alice": ALICE})
    tokens.chmod(0o644)
    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", "1"],
        env=server_env(MCP_SANDBOX_AUTH_TOKENS_FILE=str(tokens)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "readable by its owner only" in done.stderr and "chmod 600" in done.stderr, done.stderr


async def test_a_tokens_file_that_breaks_while_serving_keeps_the_principals_it_had(
    anyio_backend: str, tmp_path: Path
) -> None:
    tokens = tmp_path / "tokens.json"
    write_tokens(tokens, {"alice": ALICE})
    async with http_server(
        "http", MCP_SANDBOX_AUTH_TOKENS_FILE=str(tokens), MCP_SANDBOX_BACKEND="inprocess"
    ) as (
        serving,
        process,
    ):
        tokens.write_text("{not json", encoding="utf-8")
        async with as_caller(serving, ALICE) as alice:
            assert (await call(alice, "1 + 1"))["result"] == "2"
        assert process.returncode is None


@pytest.fixture(scope="module")
def issuer() -> Issuer:
    return Issuer()


@pytest.fixture(scope="module")
async def oauth_port(
    anyio_backend: str, issuer: Issuer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[int]:
    jwks = write_jwks(tmp_path_factory.mktemp("oauth") / "jwks.json", issuer)
    async with http_server(
        "http",
        MCP_SANDBOX_AUTH_JWKS=str(jwks),
        MCP_SANDBOX_AUTH_ISSUER=ISSUER,
        MCP_SANDBOX_AUTH_RESOURCE_URL=RESOURCE,
        MCP_SANDBOX_BACKEND="subprocess",
    ) as (serving, _):
        yield serving


async def test_with_the_issuers_jwts_the_same_session_name_is_two_sessions(
    oauth_port: int, issuer: Issuer
) -> None:
    async with (
        as_caller(oauth_port, issuer.token("alice")) as alice,
        as_caller(oauth_port, issuer.token("bob")) as bob,
    ):
        await neither_reads_nor_resets_the_other(alice, bob)
    # A new token of the same subject is the same principal: alice's session is still hers.
    async with as_caller(oauth_port, issuer.token("alice", scope="later")) as alice_again:
        assert (await call(alice_again, "secret", session_id="analysis"))["result"] == "'alice-only'"


async def test_a_caller_without_a_good_jwt_is_refused_and_told_where_to_get_one(
    oauth_port: int, issuer: Issuer
) -> None:
    url = f"http://127.0.0.1:{oauth_port}/mcp"
    refused = {
        "no token": None,
        "expired": issuer.token("alice", lifetime_s=-120),
        "for another server": issuer.token("alice", audience="https://other.test/mcp"),
        "of another issuer's key": Issuer(issuer.kid).token("alice"),
    }
    async with httpx.AsyncClient() as plain:
        for why, token in refused.items():
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            response = await plain.post(url, headers=headers, json={})
            assert response.status_code == 401, why
            challenge = response.headers["www-authenticate"]
            assert "resource_metadata=" in challenge, challenge
        metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
        # The challenge names this server's public URL; the path is served here.
        metadata = (await plain.get(f"http://127.0.0.1:{oauth_port}" + httpx.URL(metadata_url).path)).json()
    assert metadata["resource"] == RESOURCE
    assert [server.rstrip("/") for server in metadata["authorization_servers"]] == [ISSUER]


def test_a_key_set_that_cannot_be_used_or_an_issuer_left_out_keeps_the_server_from_starting(
    tmp_path: Path,
) -> None:
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    complete = {"MCP_SANDBOX_AUTH_ISSUER": ISSUER, "MCP_SANDBOX_AUTH_RESOURCE_URL": RESOURCE}
    for env, says in (
        ({"MCP_SANDBOX_AUTH_JWKS": str(tmp_path / "jwks.json"), **complete}, "not a usable JSON Web Key Set"),
        ({"MCP_SANDBOX_AUTH_JWKS": str(tmp_path / "jwks.json")}, "needs MCP_SANDBOX_AUTH_ISSUER"),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", "1"],
            env=server_env(**env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode != 0
        assert says in done.stderr, done.stderr


async def test_over_sse_too_each_principal_has_its_own_session_of_a_name(
    anyio_backend: str, folders: dict[str, Path]
) -> None:
    async with http_server(
        "sse", MCP_SANDBOX_AUTH_TOKENS_FILE=str(folders["tokens"]), MCP_SANDBOX_BACKEND="inprocess"
    ) as (serving, _):
        url = f"http://127.0.0.1:{serving}/sse"
        async with (
            Client(sse_client(url, headers={"Authorization": f"Bearer {ALICE}"})) as alice,
            Client(sse_client(url, headers={"Authorization": f"Bearer {BOB}"})) as bob,
        ):
            await neither_reads_nor_resets_the_other(alice, bob)
