"""What the server logs about a call reaches the client that made it, as MCP log messages, at the
level that client asked for, and nobody else: real MCP clients in memory, on the in-process backend,
where a program stuck in a C call outlives its interrupt and the server logs that it killed it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.types import METHOD_NOT_FOUND, LoggingMessageNotificationParams

from mcp_sandbox.app import App
from mcp_sandbox.server import build_server
from mcp_sandbox.settings import Settings
from tests.helpers import call

pytestmark = [
    pytest.mark.anyio,
    # Logging is deprecated at 2026-07-28 (SEP-2577): the client's setLevel says so each time.
    pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
]

#: Sleeps in C past its timeout, so the interrupt cannot stop it and its sandbox is killed.
STUCK = "import time\ntime.sleep(1)"
#: What the server logs (WARNING, mcp_sandbox.backends.base) when it kills that sandbox.
KILLED = "ignored the interrupt"


@pytest.fixture
async def server(anyio_backend: str) -> AsyncIterator[MCPServer]:
    settings = Settings(backend="inprocess", pool_size=3, interrupt_grace=0.2, default_packages="")
    async with App(settings) as app:
        yield build_server(app)


class Heard:
    """A client's log messages, as its logging callback receives them."""

    def __init__(self) -> None:
        self.messages: list[LoggingMessageNotificationParams] = []

    async def __call__(self, params: LoggingMessageNotificationParams) -> None:
        self.messages.append(params)

    def of_the_kill(self) -> list[LoggingMessageNotificationParams]:
        return [m for m in self.messages if KILLED in str(m.data)]


async def stuck(client: Client) -> None:
    result = await call(client, STUCK, timeout=0.2)
    assert result["status"] == "timeout", result


def kills_logged(caplog: pytest.LogCaptureFixture) -> int:
    """How many kills the server logged (so a client that heard none did not for lack of one)."""
    return sum(KILLED in record.getMessage() for record in caplog.records)


async def test_a_client_that_set_a_level_hears_what_the_server_logged_about_its_call(
    server: MCPServer,
) -> None:
    heard = Heard()
    async with Client(server, mode="legacy", logging_callback=heard) as client:
        assert client.server_capabilities.logging is not None
        await client.set_logging_level("warning")
        await stuck(client)
    [kill] = heard.of_the_kill()
    assert kill.level == "warning" and kill.logger == "mcp_sandbox.backends.base", kill
    assert kill.data == "inprocess sandbox ignored the interrupt for 0.2 s; killing it"


async def test_no_other_client_hears_of_a_call_neither_one_that_set_no_level_nor_one_that_set_any(
    server: MCPServer, caplog: pytest.LogCaptureFixture
) -> None:
    asked, silent, listening = Heard(), Heard(), Heard()

    async def quiet_call_meanwhile(client: Client) -> None:
        # Runs while the others' sandboxes are killed, and logs nothing of its own.
        assert (await call(client, "import time\ntime.sleep(1)\n'done'", timeout=5))["result"] == "'done'"

    with caplog.at_level(logging.WARNING, logger="mcp_sandbox"):
        async with (
            Client(server, mode="legacy", logging_callback=asked) as asking,
            Client(server, mode="legacy", logging_callback=silent) as not_asking,
            Client(server, mode="legacy", logging_callback=listening) as asking_for_all,
        ):
            await asking.set_logging_level("warning")
            await asking_for_all.set_logging_level("debug")
            async with anyio.create_task_group() as group:
                group.start_soon(stuck, asking)
                group.start_soon(stuck, not_asking)  # its own kill: it never set a level, so none
                group.start_soon(quiet_call_meanwhile, asking_for_all)
    assert kills_logged(caplog) == 2
    assert len(asked.of_the_kill()) == 1, asked.messages
    assert silent.messages == [], "a level one session set is not another's"
    assert listening.messages == [], "another call's records are not this call's"


async def test_records_below_the_clients_level_are_not_sent(
    server: MCPServer, caplog: pytest.LogCaptureFixture
) -> None:
    heard = Heard()
    with caplog.at_level(logging.WARNING, logger="mcp_sandbox"):
        async with Client(server, mode="legacy", logging_callback=heard) as client:
            await client.set_logging_level("error")
            await stuck(client)
    assert kills_logged(caplog) == 1
    assert heard.messages == []


async def test_at_2026_07_28_each_request_opts_in_with_its_meta_and_set_level_is_gone(
    server: MCPServer, caplog: pytest.LogCaptureFixture
) -> None:
    opted_in, not_opted_in = Heard(), Heard()
    options: dict[str, Any] = {"mode": "2026-07-28"}
    with caplog.at_level(logging.WARNING, logger="mcp_sandbox"):
        async with (
            Client(server, logging_callback=opted_in, log_level="warning", **options) as client,
            Client(server, logging_callback=not_opted_in, **options) as other,
        ):
            with pytest.raises(MCPError) as raised:
                await other.set_logging_level("debug")
            assert raised.value.error.code == METHOD_NOT_FOUND
            await stuck(client)
            await stuck(other)
    assert kills_logged(caplog) == 2
    [kill] = opted_in.of_the_kill()
    assert kill.logger == "mcp_sandbox.backends.base"
    assert not_opted_in.messages == []
