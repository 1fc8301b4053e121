"""Faults on Redis, with real server processes (subprocess backend) on one real redis-server that
the tests stop, pause (SIGSTOP: a partition, where nothing answers) and start again on the same
port, empty (persistence off): calls go on and keep their state, checkpoints pause and resume
with one note each, and a restarted Redis's fence counter cannot let two instances run one
session. Real MCP clients; every wait is on a condition, bounded."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest
import redis.asyncio
from mcp import Client

from mcp_sandbox.store import LeaseHeld, LeaseTaken, RedisStore, SavedState, StoreError
from mcp_sandbox.store.codec import decode_state
from tests.helpers import RestartableRedis, call, http_server, restartable_redis, two_instances

pytestmark = pytest.mark.anyio

PREFIX = "mcp-sandbox:"
#: A checkpoint lands 2 s after a call (lifecycle.Timings.checkpoint_quiet), plus its own time.
SETTLE_S = 30.0
#: A call while Redis is away: the first to find out waits out one short timeout (3 s); the rest
#: fail fast. Without the fast failure a call waited 15 s, then 30 s (measured).
CALL_LIMIT_S = 5.0


@pytest.fixture
async def redis_proc(tmp_path: Path) -> AsyncIterator[RestartableRedis]:
    async with restartable_redis(tmp_path / "redis") as server:
        yield server


def on_redis(redis_url: str) -> dict[str, str]:
    """The environment of a server process keeping sessions in that Redis."""
    return {
        "MCP_SANDBOX_STATE_URL": redis_url,
        "MCP_SANDBOX_BACKEND": "subprocess",
        "MCP_SANDBOX_LEASE_SECONDS": "3",
    }


async def saved_call(url: str, session_id: str) -> int:
    """The call whose state Redis holds for the session (0: none)."""
    async with redis.asyncio.Redis.from_url(url, socket_timeout=2) as client:
        data = await client.hget(f"{PREFIX}{{{session_id}}}:data", "state")  # type: ignore[misc]
    return 0 if data is None else decode_state(session_id, data, 2**30).call


async def checkpointed(url: str, session_id: str, call: int) -> None:
    with anyio.fail_after(SETTLE_S):
        while await saved_call(url, session_id) < call:
            await anyio.sleep(0.2)


async def save_errors(port: int) -> float:
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    found = re.search(r'^mcp_sandbox_store_errors_total\{operation="save"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def step(client: Client, session_id: str, expected: int) -> dict[str, object]:
    """`x += 1` in the session, within CALL_LIMIT_S; x must be `expected` (nothing lost, nothing restored)."""
    started = time.monotonic()
    result = await call(client, "x += 1; x", session_id=session_id)
    took = time.monotonic() - started
    assert took < CALL_LIMIT_S, f"a call took {took:.1f} s"
    assert result["result"] == str(expected), result
    assert not result["session_lost"] and not result["session_restored"], result
    return result


def said(results: list[dict[str, object]], words: str) -> int:
    return sum(words in note for result in results for note in result["notes"])  # type: ignore[attr-defined]


@pytest.mark.parametrize("fault", ["stopped"])
async def test_calls_run_on_while_redis_is_away_and_checkpoints_pause_and_resume_once(
    redis_proc: RestartableRedis, fault: str
) -> None:
    """Stopped: connections refused, and it comes back empty (a restart without persistence).
    Partitioned: SIGSTOP, nothing answers, and it comes back with its data."""
    url = redis_proc.url
    with anyio.fail_after(150):
        async with (
            http_server(**on_redis(url)) as (port, _),
            Client(f"http://127.0.0.1:{port}/mcp") as client,
        ):
            first = await call(client, "x = 1; x", session_id="s")
            assert first["result"] == "1"
            await checkpointed(url, "s", 1)
            if fault == "stopped":
                await redis_proc.stop()
            else:
                redis_proc.pause()
            away: list[dict[str, object]] = []
            for x in range(2, 6):
                errors = await save_errors(port)
                away.append(await step(client, "s", x))
                with anyio.fail_after(SETTLE_S):  # its checkpoint was tried, and failed
                    while await save_errors(port) <= errors:
                        await anyio.sleep(0.2)
            assert said(away, "checkpoints are paused") == 1, away
            assert "after call 1" in next(n for r in away for n in r["notes"])  # type: ignore[attr-defined]
            if fault == "stopped":
                await redis_proc.start()
            else:
                redis_proc.resume()
            back = [await step(client, "s", 6)]
            await checkpointed(url, "s", 6)
            back.append(await step(client, "s", 7))
            assert said(back, "checkpoints resumed") == 1, back
            assert said(back, "paused") == 0, back
            await checkpointed(url, "s", 7)
            if fault == "stopped":  # the lease Redis lost is held again by the instance running the session
                async with redis.asyncio.Redis.from_url(url) as redis_client:
                    assert await redis_client.exists(f"{PREFIX}{{s}}:lease")


async def test_a_restarted_redis_lets_no_old_lease_outrank_a_new_one(redis_proc: RestartableRedis) -> None:
    """Redis restarted empty: its fence counter starts again. An instance that held the session
    with fence 3 and took no note (paused) must neither keep it nor write over the instance that
    took it after the restart with fence 1; and one that renews first takes it again, fenced
    above every later lease."""
    a = RedisStore(redis_proc.url, max_session_bytes=2**20, session_ttl=600)
    b = RedisStore(redis_proc.url, max_session_bytes=2**20, session_ttl=600)
    state = SavedState("subprocess", "b1", b"a's state", call=5)
    try:
        with anyio.fail_after(60):
            for _ in range(2):
                await a.release_lease(await a.acquire_lease("s", "a", 30))
            old = await a.acquire_lease("s", "a", 30)
            assert old.fence == 3
            await a.acquire_lease("t", "a", 30)
            t_lease = await a.acquire_lease("t", "a", 30)
            await redis_proc.stop()
            await redis_proc.start()
            for store in (a, b):  # past their pooled connections' failure, and the pause after it
                with anyio.fail_after(10):
                    while True:
                        try:
                            await store.read_record("nothing")
                            break
                        except StoreError:
                            await anyio.sleep(0.2)
            new = await b.acquire_lease("s", "b", 30)
            assert new.fence == 1 and new.taken_from is None
            with pytest.raises(LeaseTaken):
                await a.save("s", state, old)
            with pytest.raises(LeaseTaken):
                await a.write_record("s", 6, "a", old)
            with pytest.raises(LeaseTaken):
                await a.renew_lease(old, 30)
            await b.save("s", SavedState("subprocess", "b1", b"b's state", call=1), new)
            assert (await b.load("s")).payload == b"b's state"  # type: ignore[union-attr]
            # Session t: nobody took it since the restart; its holder's renewal takes it again.
            with pytest.raises(StoreError, match="lost this instance's lease"):
                await a.save("t", state, t_lease)
            retaken = await a.renew_lease(t_lease, 30)
            assert retaken.retaken and retaken.fence == t_lease.fence
            assert await a.save("t", state, retaken) > 0
            with pytest.raises(LeaseHeld):
                await b.acquire_lease("t", "b", 30)
            await a.release_lease(retaken)
            assert (await b.acquire_lease("t", "b", 30)).fence > retaken.fence
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_partition_keeps_two_instances_serving_their_own_sessions(
    redis_proc: RestartableRedis,
) -> None:
    url = redis_proc.url
    with anyio.fail_after(180):
        async with two_instances(**on_redis(url)) as (first, second):
            a, b = first.client, second.client
            assert (await call(a, "x = 1; x", session_id="sa"))["result"] == "1"
            assert (await call(b, "x = 101; x", session_id="sb"))["result"] == "101"
            await checkpointed(url, "sa", 1)
            await checkpointed(url, "sb", 1)
            redis_proc.pause()
            away = {"a": [await step(a, "sa", 2)], "b": [await step(b, "sb", 102)]}
            for x in range(3, 6):
                away["a"].append(await step(a, "sa", x))
                away["b"].append(await step(b, "sb", 100 + x))
            assert (
                said(away["a"], "checkpoints are paused") == 1
                and said(away["b"], "checkpoints are paused") == 1
            )
            redis_proc.resume()
            back = {"a": [await step(a, "sa", 6)], "b": [await step(b, "sb", 106)]}
            await checkpointed(url, "sa", 6)
            await checkpointed(url, "sb", 6)
            back["a"].append(await step(a, "sa", 7))
            back["b"].append(await step(b, "sb", 107))
            assert said(back["a"], "checkpoints resumed") == 1 and said(back["b"], "checkpoints resumed") == 1
            # Each session's lease is its own instance's: a call for it on the other is handed over.
            moved = await call(b, "x", session_id="sa")
            assert moved["result"] == "7" and moved["session_restored"], moved


async def test_a_store_knows_when_redis_lost_its_data(tmp_path: Path) -> None:
    """The epoch: an instance that knew Redis before a restart without persistence finds its data
    lost, and so does one started after; a restart with persistence (AOF) loses nothing."""

    async def lost_since(store: RedisStore) -> float | None:
        with anyio.fail_after(10):  # past its pooled connections' failure, and the pause after it
            while True:
                try:
                    return await store.lost_data_since()
                except StoreError:
                    await anyio.sleep(0.2)

    async with (
        restartable_redis(tmp_path / "empty") as empty,
        restartable_redis(tmp_path / "kept", appendonly=True) as kept,
    ):
        stores = {
            server: RedisStore(server.url, max_session_bytes=2**20, session_ttl=600)
            for server in (empty, kept)
        }
        later = RedisStore(empty.url, max_session_bytes=2**20, session_ttl=600)
        try:
            with anyio.fail_after(60):
                for server, store in stores.items():
                    assert await lost_since(store) is None
                    await store.write_record("s", 1, "a")
                    await server.stop()
                    await server.start()
                restarted = time.time()
                lost = await lost_since(stores[empty])
                assert lost is not None and abs(lost - restarted) < 10, (lost, restarted)
                assert await stores[empty].read_record("s") is None
                assert await lost_since(later) == lost  # an instance started after the loss hears of it
                assert await lost_since(stores[kept]) is None
                assert await stores[kept].read_record("s") is not None
        finally:
            for store in (*stores.values(), later):
                await store.aclose()


async def ready(port: int) -> None:
    """Wait until the instance's /readyz answers 200: its store answers again."""
    async with httpx.AsyncClient() as client:
        with anyio.fail_after(SETTLE_S):
            while (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code != 200:
                await anyio.sleep(0.2)


async def test_a_session_first_seen_after_redis_lost_its_data_is_said_lost(
    redis_proc: RestartableRedis,
) -> None:
    """Session s ran on instance A, which was killed; then Redis restarted without persistence.
    Instance B, which never saw s, cannot tell it from a new session, and says it may be lost
    rather than start it fresh without a word."""
    url = redis_proc.url
    with anyio.fail_after(180):
        async with (
            http_server(**on_redis(url)) as (first, first_process),
            http_server(**on_redis(url)) as (second, _),
            Client(f"http://127.0.0.1:{second}/mcp") as b,
        ):
            async with Client(f"http://127.0.0.1:{first}/mcp") as a:
                assert (await call(a, "x = 1; x", session_id="s"))["result"] == "1"
            await checkpointed(url, "s", 1)
            first_process.kill()
            await first_process.wait()
            await redis_proc.stop()
            await redis_proc.start()
            await ready(second)
            moved = await call(b, "'x' in globals()", session_id="s")
            assert moved["result"] == "False", moved
            assert moved["session_lost"] and not moved["session_restored"], moved
            assert any("lost its data" in note for note in moved["notes"]), moved


async def test_a_session_not_live_here_waits_for_the_store_and_is_refused_not_run_twice(
    redis_proc: RestartableRedis,
) -> None:
    """Redis away: the instance running session s runs on; the other, for which s is not live,
    does not take it up without its lease (two copies of s would answer in turn), and says why."""
    url = redis_proc.url
    with anyio.fail_after(120):
        async with two_instances(**on_redis(url)) as (first, second):
            a, b = first.client, second.client
            assert (await call(a, "x = 1; x", session_id="s"))["result"] == "1"
            await redis_proc.stop()
            refused = await b.call_tool("execute_python", {"code": "x = 100; x", "session_id": "s"})
            text = " ".join(getattr(part, "text", "") for part in refused.content)
            assert refused.is_error and "cannot be reached to take it up" in text, text
            await step(a, "s", 2)
            await redis_proc.start()
            await ready(second.port)
            moved = await call(b, "x", session_id="s")
            assert moved["result"] == "2" and moved["session_restored"], moved
