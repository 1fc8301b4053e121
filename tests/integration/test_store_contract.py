"""The store contract (mcp_sandbox/store/contract.py), held by every store: the directory store in
a temporary folder, and the Redis store on a real redis-server of its own (skipped, saying why,
where redis-server is missing). Two store objects on one folder or one Redis are two instances."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest
import redis.asyncio

from mcp_sandbox.store import (
    DirectoryStore,
    Lease,
    LeaseHeld,
    LeaseTaken,
    RedisStore,
    SavedState,
    SessionRecord,
    StateUnusable,
    Store,
    StoreError,
)
from tests.helpers import free_port, redis_server

pytestmark = pytest.mark.anyio

STATE = SavedState("pyodide", "build-1", b"\x00" * 100_000 + b"state" * 1000, call=3, lost=("open files",))
SESSION_TTL = 600.0


@pytest.fixture(scope="module")
async def redis_url(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with redis_server(tmp_path_factory.mktemp("redis")) as url:
        yield url


class Backing:
    """One store's backing (a folder, or a Redis and a key prefix of the test's own): stores on
    it, and its raw value of a session's state, to damage."""

    def __init__(self, kind: str, tmp_path: Path, redis_url: str | None) -> None:
        self.kind, self._folder, self._url = kind, tmp_path / "state", redis_url
        self.prefix = f"test-{secrets.token_hex(4)}:"
        self._opened: list[Store] = []

    def store(self, session_mb: int = 8) -> Store:
        store: Store
        if self.kind == "directory":
            store = DirectoryStore(self._folder, max_session_bytes=session_mb * 2**20, max_total_bytes=2**30)
        else:
            assert self._url is not None
            store = RedisStore(
                self._url, max_session_bytes=session_mb * 2**20, session_ttl=SESSION_TTL, prefix=self.prefix
            )
        self._opened.append(store)
        return store

    def client(self) -> redis.asyncio.Redis:
        assert self._url is not None
        return redis.asyncio.Redis.from_url(self._url)

    async def raw_state(self, session_id: str) -> bytes:
        if self.kind == "directory":
            (path,) = (self._folder / "sessions").glob("*.state")
            return path.read_bytes()
        async with self.client() as client:
            value: bytes = await client.hget(f"{self.prefix}{{{session_id}}}:data", "state")  # type: ignore[misc]
            return value

    async def put_raw_state(self, session_id: str, data: bytes) -> None:
        """Overwrite the session's stored state behind the store's back (as damage, or an attacker)."""
        if self.kind == "directory":
            (path,) = (self._folder / "sessions").glob("*.state")
            path.write_bytes(data)
            return
        async with self.client() as client:
            await client.hset(f"{self.prefix}{{{session_id}}}:data", "state", data)  # type: ignore[misc]

    async def close(self) -> None:
        for store in self._opened:
            await store.aclose()


@pytest.fixture(params=["directory", "redis"])
def store_kind(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """Which store, and the Redis URL for Redis (its server started only when a test needs it)."""
    return request.param, request.getfixturevalue("redis_url") if request.param == "redis" else None


@pytest.fixture
async def backing(store_kind: tuple[str, str | None], tmp_path: Path) -> AsyncIterator[Backing]:
    made = Backing(store_kind[0], tmp_path, store_kind[1])
    yield made
    await made.close()


async def run_out(store: Store, session_id: str, owner: str) -> Lease:
    """`owner` takes the session's lease once the lease on it has run out (polled, bounded)."""
    with anyio.fail_after(10):
        while True:
            try:
                return await store.acquire_lease(session_id, owner, 30)
            except LeaseHeld:
                await anyio.sleep(0.05)


async def test_a_saved_state_comes_back_whole(backing: Backing) -> None:
    store = backing.store()
    stored = await store.save("agent:1", STATE)
    assert stored < len(STATE.payload) / 10, "mostly empty memory compresses"
    assert await store.load("agent:1") == STATE
    assert await store.load("another") is None
    assert await backing.store().load("agent:1") == STATE, "another instance reads it too"


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda data: data[: len(data) // 2], "cut short"),
        (lambda data: data[:-10] + bytes(b ^ 0xFF for b in data[-10:]), "do not match their hash"),
        (lambda data: b"something else entirely\n" + data, "not a state file"),
    ],
    ids=["truncated", "tampered", "foreign"],
)
async def test_a_damaged_state_is_refused_with_the_reason(
    backing: Backing, damage: Callable[[bytes], bytes], said: str
) -> None:
    store = backing.store()
    await store.save("s", STATE)
    await backing.put_raw_state("s", damage(await backing.raw_state("s")))
    with pytest.raises(StateUnusable, match=said):
        await store.load("s")


async def test_another_sessions_state_put_in_its_place_is_refused(backing: Backing) -> None:
    store = backing.store()
    await store.save("attacker", SavedState("pyodide", "build-1", b"attacker's", call=1))
    attackers = await backing.raw_state("attacker")
    await store.delete("attacker")
    await store.save("victim", STATE)
    await backing.put_raw_state("victim", attackers)
    with pytest.raises(StateUnusable, match="another session"):
        await store.load("victim")


async def test_a_state_over_the_cap_is_refused_and_the_last_one_stays(backing: Backing) -> None:
    store = backing.store(session_mb=1)
    await store.save("s", STATE)
    with pytest.raises(StoreError, match="MCP_SANDBOX_MAX_STATE_MB"):
        await store.save("s", SavedState("pyodide", "b", os.urandom(2 * 2**20), call=4))
    assert await store.load("s") == STATE


async def test_a_record_holds_a_sessions_latest_call_until_it_is_deleted(backing: Backing) -> None:
    store = backing.store()
    assert await store.read_record("s") is None, "a session that never ran has no record"
    await store.write_record("s", 3, "host:1:ab")
    assert await store.read_record("s") == SessionRecord(3, "host:1:ab")
    await store.save("s", STATE)
    await store.delete_checkpoint("s")
    assert await store.load("s") is None
    assert await store.read_record("s") == SessionRecord(3, "host:1:ab"), "the record stays"
    await store.delete("s")
    await store.delete("s")  # twice is fine
    assert await store.read_record("s") is None and await store.load("s") is None


async def test_a_held_lease_keeps_other_instances_out_until_released(backing: Backing) -> None:
    a, b = backing.store(), backing.store()
    lease = await a.acquire_lease("s", "instance-a", 30)
    with pytest.raises(LeaseHeld) as held:
        await b.acquire_lease("s", "instance-b", 30)
    assert held.value.owner == "instance-a" and "instance-a" in str(held.value)
    assert held.value.expires > time.time() + 20
    assert (await b.acquire_lease("other", "instance-b", 30)).owner == "instance-b", "leases are per session"
    await a.release_lease(lease)
    taken = await b.acquire_lease("s", "instance-b", 30)
    assert taken.owner == "instance-b" and taken.taken_from is None, "given up, not taken over"
    assert taken.fence > lease.fence


async def test_a_lease_that_ran_out_is_taken_over_and_its_old_holder_learns_it(backing: Backing) -> None:
    a, b = backing.store(), backing.store()
    old = await a.acquire_lease("s", "instance-a", 0.2)
    new = await run_out(b, "s", "instance-b")
    assert new.token != old.token and new.taken_from == "instance-a" and new.fence > old.fence
    with pytest.raises(LeaseTaken):
        await a.renew_lease(old, 30)
    await a.release_lease(old)  # not its lease any more: changes nothing
    with pytest.raises(LeaseHeld):
        await a.acquire_lease("s", "instance-a", 30)
    assert await b.save("s", STATE, new) > 0 and await b.load("s") == STATE
    renewed = await b.renew_lease(new, 60)
    assert renewed.same(new) and renewed.fence == new.fence and renewed.expires > new.expires


async def test_an_owner_that_ran_out_unnoticed_keeps_its_token_and_fence(backing: Backing) -> None:
    """Nobody took it meanwhile, so the sandbox the owner kept is still the session's latest."""
    store = backing.store()
    first = await store.acquire_lease("s", "instance-a", 0.1)
    await anyio.sleep(max(0.0, first.expires - time.time()) + 0.1)  # past its end
    again = await store.acquire_lease("s", "instance-a", 30)
    assert (again.token, again.fence) == (first.token, first.fence) and again.expires > first.expires
    assert again.taken_from is None
    renewed = await store.renew_lease(again, 60)
    assert renewed.token == first.token and renewed.expires > again.expires


async def test_a_renewal_that_crosses_the_owners_own_acquire_is_no_loss(backing: Backing) -> None:
    """The background renewal and a call's acquire both belong to the one owner."""
    store = backing.store()
    first = await store.acquire_lease("s", "instance-a", 30)
    assert (await store.acquire_lease("s", "instance-a", 60)).same(first)
    assert (await store.renew_lease(first, 30)).token == first.token
    assert await store.save("s", STATE, first) > 0


async def test_an_instance_whose_lease_was_taken_cannot_overwrite_the_newer_state(backing: Backing) -> None:
    """Fencing: the paused instance's writes are refused from the moment the lease is taken, before
    and after the new holder writes, and what the new holder wrote stays."""
    a, b = backing.store(), backing.store()
    old = await a.acquire_lease("s", "instance-a", 0.2)
    await a.save("s", SavedState("pyodide", "build-1", b"after call 1", call=1), old)
    await a.write_record("s", 1, "instance-a", old)
    new = await run_out(b, "s", "instance-b")
    stale = SavedState("pyodide", "build-1", b"after call 2, on the paused instance", call=2)
    with pytest.raises(LeaseTaken):
        await a.save("s", stale, old)
    newer = SavedState("pyodide", "build-1", b"after call 2, on instance b", call=2)
    await b.save("s", newer, new)
    await b.write_record("s", 2, "instance-b", new)
    with pytest.raises(LeaseTaken):
        await a.save("s", stale, old)
    with pytest.raises(LeaseTaken):
        await a.write_record("s", 3, "instance-a", old)
    assert await b.load("s") == newer
    assert await b.read_record("s") == SessionRecord(2, "instance-b")


async def test_redis_keys_expire_a_margin_after_the_session_would(backing: Backing) -> None:
    if backing.kind != "redis":
        pytest.skip("only Redis expires keys; the directory store's sweep is tests/unit/test_leases.py")
    store = backing.store()
    lease = await store.acquire_lease("s", "instance-a", 30)
    await store.save("s", STATE, lease)
    await store.write_record("s", 3, "instance-a", lease)
    async with backing.client() as client:
        ttl = {
            kind: await client.pttl(f"{backing.prefix}{{s}}:{kind}") for kind in ("data", "fence", "lease")
        }
        assert sorted(key.decode() for key in await client.keys(f"{backing.prefix}*")) == sorted(
            f"{backing.prefix}{{s}}:{kind}" for kind in ("data", "fence", "lease")
        ), "a session's three keys, under the store's prefix"
    assert 20_000 < ttl["lease"] <= 30_000
    assert SESSION_TTL * 1000 < ttl["data"] <= (SESSION_TTL + 300) * 1000
    assert ttl["fence"] > ttl["data"], "the fence outlives the state it guards"


async def test_an_unreachable_redis_is_a_store_error_at_once() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", max_session_bytes=2**20, session_ttl=SESSION_TTL)
    calls: list[Callable[[], Awaitable[object]]] = [
        lambda: store.save("s", STATE),
        lambda: store.load("s"),
        lambda: store.read_record("s"),
        lambda: store.write_record("s", 1, "instance-a"),
        lambda: store.acquire_lease("s", "instance-a", 30),
        lambda: store.delete("s"),
    ]
    try:
        with anyio.fail_after(5):
            for call in calls:
                with pytest.raises(StoreError, match="could not be reached"):
                    await call()
            await store.release_lease(Lease("s", "instance-a", "t", time.time() + 30, 1))  # never raises
    finally:
        await store.aclose()


async def test_an_ask_for_a_session_reaches_its_holder_once(backing: Backing) -> None:
    holder, other, asker = backing.store(), backing.store(), backing.store()
    assert await holder.asks("holder") == []
    await asker.ask_for("s1", "holder", "asker")
    await asker.ask_for("s1", "holder", "asker")  # asked twice, heard once
    await asker.ask_for("s2", "holder", "asker")
    await asker.ask_for("s3", "someone-else", "asker")
    assert sorted(await holder.asks("holder")) == ["s1", "s2"]
    assert await holder.asks("holder") == [], "an ask is heard once"
    assert await other.asks("someone-else") == ["s3"]
