"""Callers are tenants: over streamable HTTP with MCP_SANDBOX_AUTH_TOKENS_FILE, each caller is the
principal its token names, and what one principal owns the other cannot reach."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.helpers import call, http_server, server_env, state_file

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


@asynccontextmanager
async def as_caller(port: int, token: str) -> AsyncIterator[Client]:
    http_client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with (
        http_client,
        Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http_client)) as client,
    ):
        yield client


async def test_the_same_session_name_is_two_sessions_and_neither_reads_or_resets_the_other(
    port: int, folders: dict[str, Path]
) -> None:
    async with as_caller(port, ALICE) as alice, as_caller(port, BOB) as bob:
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
