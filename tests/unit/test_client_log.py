"""client_log's forwarding without MCP: which records a call's client is sent, in what order, and
that a client that reads slowly, or not at all, never holds the call up."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import pytest

from mcp_sandbox.client_log import FLUSH_S, QUEUE_SIZE, LogEntry, forwarding_to, install

pytestmark = pytest.mark.anyio

logger = logging.getLogger("mcp_sandbox.test_client_log")


@pytest.fixture(autouse=True)
def logging_everything() -> None:
    install()
    logger.setLevel(logging.DEBUG)


class Sent:
    """What the client was sent."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []

    async def __call__(self, entry: LogEntry) -> None:
        self.entries.append(entry)

    @property
    def messages(self) -> list[str]:
        return [entry.message for entry in self.entries]


@pytest.fixture
async def background(anyio_backend: str) -> AsyncIterator[anyio.abc.TaskGroup]:
    """A task group that outlives the calls, as the ready pool's and the checkpoints' do."""
    async with anyio.create_task_group() as group:
        yield group
        group.cancel_scope.cancel()


async def test_the_calls_records_at_or_above_its_level_are_sent_in_order_and_none_after() -> None:
    sent = Sent()
    async with forwarding_to(sent, "notice"):
        logger.debug("debug")
        logger.info("info")  # below notice
        logger.warning("first %s", "warning")
        logging.getLogger("elsewhere").error("not the server's")
        logger.error("then an error")
    logger.error("after the call")
    await anyio.sleep(0.05)
    assert sent.messages == ["first warning", "then an error"]
    assert [(entry.level, entry.logger) for entry in sent.entries] == [
        ("warning", "mcp_sandbox.test_client_log"),
        ("error", "mcp_sandbox.test_client_log"),
    ]


async def test_nothing_is_sent_to_a_client_that_asked_for_no_level() -> None:
    sent = Sent()
    async with forwarding_to(sent, None):
        logger.critical("unheard")
    assert sent.entries == []


async def test_tasks_and_threads_started_during_a_call_are_not_the_call(
    background: anyio.abc.TaskGroup,
) -> None:
    sent = Sent()
    logged = anyio.Event()

    async def checkpoint_later() -> None:
        logger.warning("a background task that inherited the call's context")
        logged.set()

    async with forwarding_to(sent, "debug"):
        background.start_soon(checkpoint_later)
        await logged.wait()
        await anyio.to_thread.run_sync(logger.warning, "a worker thread")
        logger.warning("the call itself")
    assert sent.messages == ["the call itself"]


async def test_two_calls_side_by_side_each_get_their_own() -> None:
    first, second = Sent(), Sent()

    async def run(sent: Sent, name: str) -> None:
        async with forwarding_to(sent, "debug"):
            for step in range(3):
                logger.info("%s %d", name, step)
                await anyio.sleep(0.01)

    async with anyio.create_task_group() as group:
        group.start_soon(run, first, "first")
        group.start_soon(run, second, "second")
    assert first.messages == ["first 0", "first 1", "first 2"]
    assert second.messages == ["second 0", "second 1", "second 2"]


async def test_a_full_queue_drops_records_and_the_last_message_counts_them() -> None:
    sent = Sent()
    async with forwarding_to(sent, "debug"):
        # Logged without yielding, so the sender takes none before the queue is full.
        for number in range(QUEUE_SIZE + 7):
            logger.info("record %d", number)
    assert sent.messages[:-1] == [f"record {number}" for number in range(QUEUE_SIZE)]
    note = sent.entries[-1]
    assert note.level == "warning" and note.message.startswith("7 log messages about this call were dropped")


async def test_a_client_that_takes_nothing_holds_no_call_up() -> None:
    async def never_taken(entry: LogEntry) -> None:
        await anyio.sleep_forever()

    started = time.monotonic()
    with anyio.fail_after(FLUSH_S + 5):
        async with forwarding_to(never_taken, "debug"):
            for number in range(QUEUE_SIZE * 3):
                logger.info("record %d", number)
                await anyio.lowlevel.checkpoint()
    assert time.monotonic() - started < FLUSH_S + 0.5


async def test_the_calls_own_error_passes_as_it_is() -> None:
    with pytest.raises(ValueError, match="the call's own"):
        async with forwarding_to(Sent(), "debug"):
            raise ValueError("the call's own")
