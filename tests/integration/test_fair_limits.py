"""Limits per principal, over streamable HTTP with a tokens file: each limit refuses the call
past it with a message that names the setting and only the caller's own numbers, and a flood of
one principal's calls leaves another's calls running."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.helpers import as_caller, call, http_server, write_tokens

pytestmark = pytest.mark.anyio

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
CAROL = "carol-token-0123456789abcdef"
#: Alice's flood: this many calls at once, each holding its sandbox until the test releases it.
FLOOD = 16
#: A flood call: the time it got its sandbox (the one clock of the machine), then a wait for the
#: release file in data/.
HOLD = (
    "import os, time\n"
    "print(time.monotonic())\n"
    "deadline = time.monotonic() + 100\n"
    "while not os.path.exists('data/release') and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
    "assert os.path.exists('data/release'), 'never released'\n"
)
STARTED = "import time; print(time.monotonic())"
#: What the MCP SDK puts before a tool's error message.
SDK_PREFIX = "Error executing tool execute_python: "


async def tool(client: Client, code: str, **arguments: Any) -> tuple[bool, str, dict[str, Any] | None]:
    """execute_python: (refused, the refusal's text, the structured result)."""
    response = await client.call_tool("execute_python", {"code": code, **arguments})
    text = " ".join(getattr(block, "text", "") for block in response.content)
    return response.is_error, text.removeprefix(SDK_PREFIX), response.structured_content


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fair") / "tokens.json"
    write_tokens(path, {"alice": ALICE, "bob": BOB, "carol": CAROL})
    return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fair-data")
    folder.chmod(0o755)  # a server run as root runs its workers as other users (MCP_SANDBOX_WORKER_UIDS)
    return folder


@pytest.fixture(scope="module")
async def limited(anyio_backend: str, tokens: Path) -> AsyncIterator[int]:
    """Four sessions in all (so two for each principal, the default share), five calls a minute."""
    async with http_server(
        "http",
        MCP_SANDBOX_AUTH_TOKENS_FILE=str(tokens),
        MCP_SANDBOX_BACKEND="subprocess",
        MCP_SANDBOX_MAX_SESSIONS="4",
        MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE="5",
    ) as (port, _):
        yield port


@pytest.fixture(scope="module")
async def flooded(anyio_backend: str, tokens: Path, data_dir: Path) -> AsyncIterator[int]:
    """Alice may have FLOOD calls running at once (the test uses its refusal to know her flood
    is all in), and each principal one session holding a sandbox."""
    async with http_server(
        "http",
        MCP_SANDBOX_AUTH_TOKENS_FILE=str(tokens),
        MCP_SANDBOX_BACKEND="subprocess",
        MCP_SANDBOX_DATA_DIR=str(data_dir),
        MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS=str(FLOOD),
        MCP_SANDBOX_PRINCIPAL_MAX_LIVE_SANDBOXES="1",
        MCP_SANDBOX_MAX_TIMEOUT="120",
    ) as (port, _):
        yield port


async def test_a_principal_gets_half_the_sessions_and_the_other_half_stays_free(limited: int) -> None:
    async with as_caller(limited, ALICE) as alice, as_caller(limited, BOB) as bob:
        for name in ("one", "two"):
            assert (await call(alice, "1", session_id=name))["success"]
        refused, text, _ = await tool(alice, "1", session_id="three")
        assert refused
        assert text == (
            "alice has 2 sessions open, the most MCP_SANDBOX_PRINCIPAL_MAX_SESSIONS allows; call "
            "reset_session on one you no longer need, or wait for idle ones to expire (600 s)"
        )
        for name in ("one", "two"):  # bob's two are still there for him
            assert (await call(bob, "2", session_id=name))["result"] == "2"
        reset = await alice.call_tool("reset_session", {"session_id": "one"})
        assert reset.structured_content is not None and reset.structured_content["existed"] is True
        assert (await call(alice, "3", session_id="three"))["result"] == "3"


async def test_calls_past_a_principals_minute_are_refused_and_no_one_elses(limited: int) -> None:
    async with as_caller(limited, CAROL) as carol, as_caller(limited, BOB) as bob:
        for number in range(5):
            assert (await call(carol, f"{number}"))["success"]
        refused, text, _ = await tool(carol, "5")
        assert refused
        assert text.startswith(
            "carol made 5 calls in the last minute, the most MCP_SANDBOX_PRINCIPAL_CALLS_PER_MINUTE "
            "allows; try again in "
        ), text
        assert "alice" not in text and "bob" not in text
        assert (await call(bob, "6 * 7"))["result"] == "42"


async def test_a_principals_sessions_holding_a_sandbox_are_limited(flooded: int) -> None:
    async with as_caller(flooded, BOB) as bob:
        assert (await call(bob, "x = 1", session_id="first"))["success"]
        refused, text, _ = await tool(bob, "1", session_id="second")
        assert refused
        assert text.startswith(
            "bob has 1 sessions holding a sandbox, the most MCP_SANDBOX_PRINCIPAL_MAX_LIVE_SANDBOXES "
            "allows; reset one you no longer need"
        ), text
        assert (await call(bob, "x", session_id="first"))["result"] == "1", "the live one goes on"
        assert (await call(bob, "'no session'"))["success"], "a call without a session holds none"
        await bob.call_tool("reset_session", {"session_id": "first"})
        assert (await call(bob, "2", session_id="second"))["result"] == "2"
        await bob.call_tool("reset_session", {"session_id": "second"})


async def test_a_flood_from_alice_leaves_bobs_calls_running(flooded: int, data_dir: Path) -> None:
    """Alice sends FLOOD calls at once, each holding its sandbox until released; once all are in
    (her next call is refused at MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS), bob calls, with and
    without a session. His calls run and finish while all of hers still hold or wait for a
    sandbox, and his call got a sandbox before some of hers that were waiting when it came:
    served in turn, not behind her whole flood."""
    release = data_dir / "release"
    flood: list[dict[str, Any]] = []
    retried = 0

    async def flood_call() -> None:
        nonlocal retried
        for _ in range(50):  # a probe running at that moment refuses it: it comes again
            refused, text, result = await tool(alice, HOLD, timeout=110)
            if not refused:
                assert result is not None
                flood.append(result)
                return
            assert "MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS" in text, text
            retried += 1
        raise AssertionError("a flood call was refused 50 times")

    async with (
        as_caller(flooded, ALICE) as alice,
        as_caller(flooded, BOB) as bob,
        anyio.create_task_group() as group,
    ):
        # Her probe runs in a session of its own, which holds its sandbox: it never waits behind her flood.
        assert (await call(alice, "1", session_id="probe"))["success"]
        try:
            for _ in range(FLOOD):
                group.start_soon(flood_call)
            with anyio.fail_after(60):
                for _ in range(1000):
                    refused, text, _ = await tool(alice, "1", session_id="probe")
                    if refused:
                        break
                else:
                    raise AssertionError("alice's flood never reached her limit")
            assert text == (
                f"alice has {FLOOD} calls running, the most MCP_SANDBOX_PRINCIPAL_MAX_RUNNING_CALLS "
                "allows; wait for one to finish"
            )
            with anyio.fail_after(60):
                alone = await call(bob, STARTED)
                in_session = await call(bob, STARTED, session_id="during-the-flood")
            assert alone["success"] and in_session["success"], (alone, in_session)
            assert flood == [], "the flood was still on while bob's calls ran"
            await bob.call_tool("reset_session", {"session_id": "during-the-flood"})
            await alice.call_tool("reset_session", {"session_id": "probe"})
        finally:
            release.touch()
    try:
        assert len(flood) == FLOOD and all(result["success"] for result in flood), flood
        bob_started = float(alone["stdout"])
        alice_started = sorted(float(result["stdout"]) for result in flood)
        after_bob = [started for started in alice_started if started > bob_started]
        assert after_bob, (
            f"all {FLOOD} of alice's calls got a sandbox before bob's did ({retried} retried): "
            f"first come, first served"
        )
        print(f"alice's calls that got a sandbox after bob's did: {len(after_bob)} of {FLOOD}")
    finally:
        release.unlink(missing_ok=True)
