"""Sessions' saved state in Redis (`MCP_SANDBOX_STATE_URL=redis://...`), through redis-py's asyncio
client; the contract is `contract.Store`'s.

Keys, each starting with the prefix (`MCP_SANDBOX_STATE_KEY_PREFIX`) and the session's name in
braces (so a session's keys share a Redis Cluster slot):

- `{session}:data`: a hash of the session's checkpoint (`state`, as `codec` encodes it) and
  record (`record`), each beside the fence it was written under (`state_fence`, `record_fence`).
  It expires `margin` seconds after the session would (`session_ttl`), counted from its latest
  write, acquisition or renewal, so an abandoned session's keys vanish without a sweep.
- `{session}:lease`: the lease, `SET ... PX`, gone when it runs out unrenewed.
- `{session}:fence`: a hash of the fence counter (`counter`, only ever incremented) and the last
  lease acquired (`owner`, `token`, `fence`), which outlives the lease so that a lease taken over
  names its former owner, and an owner whose lease ran out unnoticed keeps its token. It expires
  a margin after the data, never before it, and survives `delete`, so fences only grow.

- `epoch`: a random id and the time it was set, kept without a TTL. An instance remembers the one
  it first saw; finding it gone or another means Redis lost its data since (restarted without
  persistence, flushed), which `lost_data_since` reports so a session first seen after that is
  said to be lost, not taken for a new one.

Every read-decide-write is one Lua script, so two instances never both take a lease and a fenced
write never lands. Redis's own `maxmemory` bounds the whole (MCP_SANDBOX_MAX_STORE_MB does not
apply here: docs/deploy.md).
"""

from __future__ import annotations

import inspect
import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import Awaitable
from typing import TypeVar

import anyio
import redis.asyncio
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from mcp_sandbox.store.codec import decode_record, decode_state, encode_record, encode_state
from mcp_sandbox.store.contract import (
    DAMAGED_RECORD,
    Lease,
    LeaseHeld,
    LeaseTaken,
    SavedState,
    SessionRecord,
    StateUnusable,
    StoreError,
)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Arg = str | int | bytes

#: Seconds a connection may take to open, a command to answer (a checkpoint of hundreds of MB
#: included), and a command that carries no state (a lease, a record, the asks): an unreachable
#: Redis is an error within these, never a hang.
CONNECT_TIMEOUT = 3.0
COMMAND_TIMEOUT = 15.0
SMALL_COMMAND_TIMEOUT = 3.0
#: After Redis did not answer in time, every call fails at once for this long, then one call looks
#: (a PING that must answer within PROBE_TIMEOUT) while the others still fail at once: a Redis cut
#: off (a partition: nothing answers) costs a session's calls nothing, where each would otherwise
#: wait out the timeouts above. A failure that took less than SLOW_FAILURE_S (a connection refused
#: or closed: Redis down or restarting) pauses nothing: the next call tries again, so an instance
#: never thinks Redis away while it is back (and another instance takes sessions up).
UNREACHABLE_PAUSE = 2.0
PROBE_TIMEOUT = 1.0
SLOW_FAILURE_S = 0.5
#: An ask for a session is kept this long for its holder, which looks several times a second.
ASKS_LIFETIME_MS = 60_000
#: Asks one look takes at most; the rest wait for the next look.
ASKS_AT_ONCE = 1000

# KEYS: data, fence. ARGV: field (state or record), value, fence (-1: no lease), data ttl ms,
# fence ttl ms. Refused (0) when another lease was acquired since, or the stored value is newer;
# (-1) when the lease is from before Redis lost the session's keys (restarted empty) and nobody
# took the session since: its holder's next renewal takes it again. A fence above the counter is
# never written, so an old lease cannot outrank the leases taken after such a loss.
_WRITE = """
local fence = tonumber(ARGV[3])
if fence >= 0 then
  local counter = tonumber(redis.call('HGET', KEYS[2], 'counter'))
  if not counter and fence > 0 then return -1 end
  counter = counter or 0
  local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[1] .. '_fence')) or 0
  if fence ~= counter or fence < stored then return 0 end
else
  fence = 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], ARGV[1] .. '_fence', fence)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ARGV[5]) end
return 1
"""

# KEYS: lease, fence, data. ARGV: owner, a new token, lease ms, data ttl ms, fence ttl ms.
# {'held', owner, ms left} or {'ok', token, fence, taken from or ''}.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held then
  local ok, lease = pcall(cjson.decode, held)
  if ok and type(lease) == 'table' and lease.owner ~= ARGV[1] then
    return {'held', lease.owner, redis.call('PTTL', KEYS[1])}
  end
end
local last = redis.call('HMGET', KEYS[2], 'owner', 'token', 'fence')
local token, fence, taken_from = ARGV[2], 0, ''
if last[1] == ARGV[1] and last[2] and tonumber(last[3]) then
  token, fence = last[2], tonumber(last[3])  -- its own, run out unnoticed: nobody took it since
else
  fence = redis.call('HINCRBY', KEYS[2], 'counter', 1)
  if last[1] then taken_from = last[1] end
  redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'token', token, 'fence', fence)
end
redis.call('SET', KEYS[1], cjson.encode({owner = ARGV[1], token = token, fence = fence}), 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {'ok', token, fence, taken_from}
"""

# KEYS: lease, fence, data. ARGV: owner, token, fence, lease ms, data ttl ms, fence ttl ms.
# 1; 0 when another lease was acquired since; 2 when Redis had lost the session's keys (restarted
# empty, or they expired) and nobody took it since: the lease is taken again with its token and
# fence, and the counter goes on from that fence, so every later lease is fenced above it.
_RENEW = """
local last = redis.call('HMGET', KEYS[2], 'token', 'fence', 'counter')
local answer = 1
if not last[3] and redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[2], 'counter', ARGV[3], 'owner', ARGV[1], 'token', ARGV[2], 'fence', ARGV[3])
  answer = 2
elseif last[1] ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], cjson.encode({owner = ARGV[1], token = ARGV[2], fence = tonumber(ARGV[3])}),
  'PX', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[6])
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return answer
"""

# KEYS: lease, fence. ARGV: token. The counter stays.
_RELEASE = """
if redis.call('HGET', KEYS[2], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HDEL', KEYS[2], 'owner', 'token', 'fence')
end
return 1
"""


class RedisStore:
    """Saved states, records and leases in one Redis database.

    `max_session_bytes` caps one state (before compression); `session_ttl` is how long an idle
    session lives, and its keys live `margin` seconds longer.
    """

    def __init__(
        self,
        url: str,
        *,
        max_session_bytes: int,
        session_ttl: float,
        prefix: str = "mcp-sandbox:",
        margin: float = 300.0,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        #: Names the server in messages without the URL's password.
        self.where = f"Redis at {parts.hostname or 'localhost'}:{parts.port or 6379}"
        self.max_session_bytes = max_session_bytes
        self.prefix = prefix
        self._data_ms = int((session_ttl + margin) * 1000)
        self._fence_ms = int((session_ttl + 2 * margin) * 1000)
        self._client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
            url,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=COMMAND_TIMEOUT,
            # One retry on a new connection (a pooled one Redis closed), then an error at once; a
            # timeout is not retried (it would only be waited out twice).
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.exceptions.ConnectionError,)),
        )
        #: Redis could not be reached: calls fail at once until then (monotonic; 0: reachable).
        self._down_until = 0.0
        self._down_reason = ""
        self._probing = False
        #: The last command failed: warned once, and once more when one succeeds.
        self._failing = False
        self._write = self._client.register_script(_WRITE)
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        #: The epoch this instance knows (None: not read yet), and when the data was lost, if it was.
        self._epoch: str | None = None
        self._lost_at: float | None = None
        self._session_ttl = session_ttl

    def key(self, session_id: str, kind: str) -> str:
        """The key of one of the session's three: data, lease or fence."""
        return f"{self.prefix}{{{session_id}}}:{kind}"

    async def _ask(self, doing: str, command: Awaitable[_T], timeout: float = SMALL_COMMAND_TIMEOUT) -> _T:
        """The command's answer; its failure as StoreError, saying what could not be done."""
        try:
            await self._reachable(doing)
        except StoreError:
            _discard(command)
            raise
        started = time.monotonic()
        try:
            with anyio.fail_after(timeout):
                answer = await command
        except redis.exceptions.ResponseError as error:
            if str(error).startswith("OOM"):
                raise StoreError(
                    f"{self.where} is full (its maxmemory), so {doing} failed; end sessions you no longer "
                    "need (reset_session), or give Redis more memory"
                ) from error
            raise StoreError(f"{doing} failed: {self.where} answered {error}") from error
        except (redis.exceptions.RedisError, OSError) as error:  # TimeoutError is an OSError
            raise self._unreachable(doing, error, started) from error
        self._reached()
        return answer

    async def _reachable(self, doing: str) -> None:
        """Raise StoreError at once while Redis is known unreachable: for UNREACHABLE_PAUSE seconds
        after it could not be reached, then while one call looks (a PING answered within
        PROBE_TIMEOUT, or it is unreachable for another pause)."""
        if not self._down_until:
            return
        if time.monotonic() < self._down_until or self._probing:
            raise StoreError(f"{doing} failed: {self.where} could not be reached ({self._down_reason})")
        self._probing = True
        started = time.monotonic()
        try:
            with anyio.fail_after(PROBE_TIMEOUT):
                await self._client.ping()
        except (redis.exceptions.RedisError, OSError) as error:
            raise self._unreachable(doing, error, started) from error
        finally:
            self._probing = False
        self._reached()

    def _reached(self) -> None:
        self._down_until = 0.0
        if self._failing:
            self._failing = False
            logger.warning("%s answers again", self.where)

    def _unreachable(self, doing: str, error: BaseException, started: float) -> StoreError:
        """Redis could not be reached: if finding out took time, the calls of the next
        UNREACHABLE_PAUSE seconds fail at once."""
        if isinstance(error, TimeoutError) and not str(error):
            error = TimeoutError("no answer in time")
        if not self._failing:
            logger.warning("%s could not be reached (%s)", self.where, error)
        self._failing = True
        if time.monotonic() - started >= SLOW_FAILURE_S:
            if not self._down_until:
                logger.warning(
                    "store calls fail at once, and %s is tried again every %g s",
                    self.where,
                    UNREACHABLE_PAUSE,
                )
            self._down_until = time.monotonic() + UNREACHABLE_PAUSE
        self._down_reason = str(error)
        return StoreError(f"{doing} failed: {self.where} could not be reached ({error})")

    async def save(self, session_id: str, state: SavedState, lease: Lease | None = None) -> int:
        data = encode_state(
            session_id, state, lease.fence if lease is not None else 0, self.max_session_bytes
        )
        await self._fenced_write(
            session_id, "state", data, lease, "the session's state could not be written:"
        )
        return len(data)

    async def write_record(self, session_id: str, call: int, owner: str, lease: Lease | None = None) -> None:
        record = encode_record(session_id, call, owner, lease.fence if lease is not None else 0)
        await self._fenced_write(
            session_id, "record", record, lease, "the session's record could not be written:"
        )

    async def _fenced_write(
        self, session_id: str, field: str, value: bytes, lease: Lease | None, doing: str
    ) -> None:
        keys = [self.key(session_id, "data"), self.key(session_id, "fence")]
        fence = lease.fence if lease is not None else -1
        args: list[_Arg] = [field, value, fence, self._data_ms, self._fence_ms]
        timeout = COMMAND_TIMEOUT if field == "state" else SMALL_COMMAND_TIMEOUT
        doing = f"writing the session's {field}"
        written = await self._ask(doing, self._write(keys=keys, args=args), timeout)
        if written == -1:
            raise StoreError(
                f"{doing} failed: {self.where} lost this instance's lease on the session (restarted "
                "without its data?); it is taken again at its next renewal"
            )
        if not written:
            raise LeaseTaken(f"session {session_id!r} is run by another instance now")

    async def load(self, session_id: str) -> SavedState | None:
        doing = "reading the session's state"
        await self._reachable(doing)
        started = time.monotonic()
        try:
            with anyio.fail_after(COMMAND_TIMEOUT):
                data = await self._client.hget(self.key(session_id, "data"), "state")
        except redis.exceptions.ResponseError as error:
            raise StateUnusable(f"it is not a state of this version of mcp-sandbox ({error})") from error
        except (redis.exceptions.RedisError, OSError) as error:
            raise self._unreachable(doing, error, started) from error
        self._reached()
        if data is None:
            return None
        return decode_state(session_id, _bytes(data), self.max_session_bytes)

    async def read_record(self, session_id: str) -> SessionRecord | None:
        key, doing = self.key(session_id, "data"), "reading the session's record"
        await self._reachable(doing)
        started = time.monotonic()
        try:
            with anyio.fail_after(SMALL_COMMAND_TIMEOUT):
                data = await self._client.hget(key, "record")
        except redis.exceptions.ResponseError:
            return DAMAGED_RECORD  # not a hash of ours
        except (redis.exceptions.RedisError, OSError) as error:
            raise self._unreachable(doing, error, started) from error
        self._reached()
        return None if data is None else decode_record(session_id, _bytes(data))[0]

    async def delete(self, session_id: str) -> None:
        await self._ask(
            "deleting the session's saved state", self._client.delete(self.key(session_id, "data"))
        )

    async def delete_checkpoint(self, session_id: str) -> None:
        key = self.key(session_id, "data")
        await self._ask(
            "deleting the session's checkpoint",
            self._client.hdel(key, "state", "state_fence"),
        )

    async def delete_older_than(self, seconds: float, keep: set[str]) -> int:
        """None: every key expires on its own, a margin after its session would."""
        return 0

    async def acquire_lease(self, session_id: str, owner: str, seconds: float) -> Lease:
        keys = [self.key(session_id, kind) for kind in ("lease", "fence", "data")]
        args: list[_Arg] = [owner, secrets.token_hex(8), _ms(seconds), self._data_ms, self._fence_ms]
        answer = await self._ask("taking the session's lease", self._acquire(keys=keys, args=args))
        status, *rest = answer
        if status == b"held":
            holder, left = rest
            raise LeaseHeld(holder.decode(), time.time() + max(0, int(left)) / 1000)
        token, fence, taken_from = rest
        return Lease(
            session_id, owner, token.decode(), time.time() + seconds, int(fence), taken_from.decode() or None
        )

    async def renew_lease(self, lease: Lease, seconds: float) -> Lease:
        keys = [self.key(lease.session_id, kind) for kind in ("lease", "fence", "data")]
        args: list[_Arg] = [
            lease.owner,
            lease.token,
            lease.fence,
            _ms(seconds),
            self._data_ms,
            self._fence_ms,
        ]
        answer = await self._ask("renewing the session's lease", self._renew(keys=keys, args=args))
        if not answer:
            raise LeaseTaken(f"session {lease.session_id!r} is run by another instance now")
        return Lease(
            lease.session_id,
            lease.owner,
            lease.token,
            time.time() + seconds,
            lease.fence,
            retaken=answer == 2,
        )

    async def release_lease(self, lease: Lease) -> None:
        keys = [self.key(lease.session_id, kind) for kind in ("lease", "fence")]
        try:
            await self._ask("giving the session's lease up", self._release(keys=keys, args=[lease.token]))
        except StoreError as error:
            logger.warning("session %r: %s; it runs out on its own", lease.session_id, error)

    async def ask_for(self, session_id: str, holder: str, asker: str) -> None:
        key = self._asks_key(holder)
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.sadd(key, session_id)
                pipe.pexpire(key, ASKS_LIFETIME_MS)  # left for a holder that stopped: gone on its own
                await self._ask(f"asking {holder} for the session", pipe.execute())
        except StoreError as error:
            logger.warning("session %r: %s", session_id, error)

    async def asks(self, holder: str) -> list[str]:
        taken: list[bytes] | None = await self._ask(
            "reading the asks for this instance's sessions",
            self._client.spop(self._asks_key(holder), ASKS_AT_ONCE),  # type: ignore[arg-type]
        )
        return [member.decode() for member in taken or []]

    async def lost_data_since(self) -> float | None:
        # A new epoch is written only when none is there; whoever writes it after knowing another says so.
        key = f"{self.prefix}epoch"
        raw = await self._ask("reading the store's epoch", self._client.get(key))
        if raw is None:
            mine = {"id": secrets.token_hex(8), "since": time.time(), "after_loss": self._epoch is not None}
            await self._ask("writing the store's epoch", self._client.set(key, json.dumps(mine), nx=True))
            raw = await self._ask("reading the store's epoch", self._client.get(key))
        try:
            epoch = json.loads(raw or b"")
            found, since, after_loss = str(epoch["id"]), float(epoch["since"]), bool(epoch["after_loss"])
        except (ValueError, KeyError, TypeError):
            return self._lost_at  # not ours to judge: someone wrote the key; what was known stands
        if found != self._epoch:
            if self._epoch is not None or (after_loss and time.time() - since <= self._session_ttl):
                self._lost_at = since
                logger.warning(
                    "%s lost its data (restarted without persistence, or flushed) by %s: sessions "
                    "that ran before then start fresh, said as session_lost (docs/deploy.md)",
                    self.where,
                    time.strftime("%H:%M:%S", time.localtime(since)),
                )
            self._epoch = found
        if self._lost_at is not None and time.time() - self._lost_at > self._session_ttl:
            self._lost_at = None  # every session from before then has expired
        return self._lost_at

    def _asks_key(self, holder: str) -> str:
        return f"{self.prefix}asks:{holder}"

    async def aclose(self) -> None:
        await self._client.aclose()

    def __repr__(self) -> str:
        return f"RedisStore({self.where}, prefix={self.prefix!r})"


def _discard(command: Awaitable[object]) -> None:
    """A command not sent: its coroutine closed unawaited, without a warning."""
    if inspect.iscoroutine(command):
        command.close()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _bytes(value: bytes | str) -> bytes:
    # The client answers bytes (no decode_responses); its types allow str too.
    return value.encode() if isinstance(value, str) else value
