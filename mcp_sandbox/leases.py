"""This instance's leases on its sessions, so instances sharing a state folder never run one
session at once: taken before a call, renewed in the background while the session is live,
given up once it is not."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Mapping
from enum import Enum

import anyio

from mcp_sandbox.errors import SessionElsewhere, StoreUnavailable
from mcp_sandbox.lifecycle import Saved, Session
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import Lease, LeaseHeld, LeaseTaken, Store, StoreError

logger = logging.getLogger(__name__)

#: How often a call waiting for a session another instance holds asks for the lease again, for
#: the first seconds: a handover takes a checkpoint's time, well under a second when idle.
HANDOVER_POLL_S = 0.1
HANDOVER_WAIT_S = 3.0
#: A call waits at least this long for a handover, however short the lease: a holder under load
#: takes seconds to checkpoint. An ask not answered within ASK_AGAIN_S is made again (a Redis
#: restarted without its data forgot it).
HANDOVER_MIN_WAIT_S = 10.0
ASK_AGAIN_S = 1.0
#: How often an instance looks for asks to hand its sessions over.
ASKS_INTERVAL_S = 0.25
#: How long a call for a session not live here waits for an unreachable store (a Redis restarting)
#: before it is refused, and how often it looks.
STORE_WAIT_S = 10.0
STORE_POLL_S = 0.25
#: After the store lost its data, how long past a third of a lease a session not live here waits
#: for its holder to take its lease again: a holder that found Redis gone looks again within 2 s.
RETAKE_MARGIN_S = 3.0


class Leases:
    """The leases of the sessions in `sessions` (a Sessions's registry), held as `instance`
    for MCP_SANDBOX_LEASE_SECONDS at a time, on `store`. Without a store there is nothing to share, and
    every method does nothing. A lease says whether a sandbox here may run its session; the
    sandbox itself is the owner's (`sandboxes.Sandboxes`), told when another instance took it."""

    def __init__(
        self, store: Store | None, settings: Settings, instance: str, sessions: Mapping[str, Session]
    ) -> None:
        self._store = store
        #: A store that can lose a lease before its holder hears of it (Redis restarted without its
        #: data): each call renews its lease first, so no other instance took the session up meanwhile.
        self._renew_each_call = settings.redis_url is not None
        self._seconds = settings.lease_seconds
        self._instance = instance
        self._sessions = sessions
        self._asks_failing = False
        #: Sessions whose lease another instance took while a call ran here: their sandbox holds a
        #: state the other may have moved past, given back before they run again. (The store's
        #: record cannot always say so: a Redis restarted without its data forgets it.)
        self._taken: weakref.WeakSet[Session] = weakref.WeakSet()

    @property
    def on(self) -> bool:
        return self._store is not None

    @property
    def renew_interval(self) -> float:
        """How often live sessions' leases are renewed: a third of a lease."""
        return self._seconds / 3

    async def hold(self, session: Session) -> bool:
        """Make sure this instance holds the session's lease (its lock held), waiting up to
        MCP_SANDBOX_LEASE_SECONDS for another instance's to run out. Whether the sandbox the
        session has here is stale (another instance ran it since: the store's state is newer),
        for the owner to give back. A session live here runs on while the store cannot be
        reached; one that is not waits for the store up to STORE_WAIT_S. Raises SessionElsewhere
        and StoreUnavailable."""
        if self._store is None:
            return False
        stale = session in self._taken  # another instance took its lease while a call ran here
        if stale:
            self._taken.discard(session)
            session.lease = None
        held = session.lease
        if held is not None:
            renewed = await self._renew_held(session, held)
            if renewed is not None:
                return False
            stale = True  # another instance ran it: its sandbox here holds an older state
        live_here = session.executor is not None and not stale
        lease = await self._acquire(session, live_here)
        if lease is None:
            return stale  # live here, the store unreachable: it runs on without a lease
        session.lease = lease
        if lease.taken_from is not None:
            session.moved_from = lease.taken_from
        taken_meanwhile = held is None or lease.token != held.token
        # Another instance may have run it since: the store's state is the one to go on from.
        return stale or (taken_meanwhile and live_here and await self._ran_elsewhere(session, lease))

    async def _renew_held(self, session: Session, held: Lease) -> Lease | None:
        """Renew a lease this instance holds, rather than acquire one, so a lease that ran out
        while the store could not be reached, or that the store lost (restarted empty), stays
        this instance's if nobody took the session since: its sandbox holds the latest state.
        The lease it holds now; None when another instance took it."""
        assert self._store is not None
        if not self._renew_each_call and held.expires - time.time() > self._seconds / 2:
            return held  # renewed in the background; nobody can have taken it
        try:
            renewed = await self._store.renew_lease(held, self._seconds)
        except LeaseTaken:
            session.lease = None
            return None
        except StoreError as error:
            logger.warning("session %r runs on without renewing its lease: %s", session.session_id, error)
            return held
        session.lease = renewed
        if renewed.retaken:
            self._retaken(session)  # the call's own checkpoint carries its state again
        return renewed

    async def _acquire(self, session: Session, live_here: bool) -> Lease | None:
        """Take the session's lease, asking its holder to hand it over and waiting for that;
        None when the store cannot be reached and the session is live here (its sandbox holds
        its latest state: its lease is renewed once the store answers again)."""
        assert self._store is not None
        store, seconds = self._store, self._seconds
        if not live_here:
            await self._let_holders_retake(store, seconds)
        started = time.monotonic()
        deadline, asked_at = started + max(seconds, HANDOVER_MIN_WAIT_S) + 1, -ASK_AGAIN_S
        while True:
            try:
                return await store.acquire_lease(session.session_id, self._instance, seconds)
            except LeaseHeld as error:
                if time.monotonic() - asked_at >= ASK_AGAIN_S:
                    # The holder checkpoints the session and lets go once its running call, if any, ends.
                    await store.ask_for(session.session_id, error.owner, self._instance)
                    asked_at = time.monotonic()
                if time.monotonic() >= deadline:
                    raise _elsewhere(session, error) from None
                soon = time.monotonic() - started < HANDOVER_WAIT_S
                await anyio.sleep(HANDOVER_POLL_S if soon else min(1.0, seconds / 10))
            except StoreError as error:
                if live_here:
                    logger.warning("session %r runs on without a lease: %s", session.session_id, error)
                    return None
                # Not live here: another instance may run it, which only its lease would say.
                if time.monotonic() - started >= STORE_WAIT_S:
                    raise StoreUnavailable(
                        f"session {session.session_id!r} is not running on this instance, and the store "
                        f"of saved sessions cannot be reached to take it up ({error}); retry shortly"
                    ) from None
                await anyio.sleep(STORE_POLL_S)

    async def _let_holders_retake(self, store: Store, seconds: float) -> None:
        """After the store lost its data (Redis restarted without it), the instances running
        sessions take their leases again at their next renewal, within a third of a lease: a
        session not live here is taken up only after that, so it is asked for, not run fresh."""
        try:
            since = await store.lost_data_since()
        except StoreError:
            return  # the lease's acquisition says what to do
        if since is not None and (wait := since + seconds / 3 + RETAKE_MARGIN_S - time.time()) > 0:
            await anyio.sleep(wait)

    async def _ran_elsewhere(self, session: Session, lease: Lease) -> bool:
        """Whether another instance may have run the session since this one's sandbox took it up,
        now that this instance holds a new lease on it: the lease was taken from another owner,
        or the store's record names another. A session that ran here without a lease (the store
        unreachable) and that nobody else ran keeps its sandbox, which holds its latest state."""
        if lease.taken_from is not None:
            return True
        try:
            record = await self._store.read_record(session.session_id) if self._store else None
        except StoreError:
            return True  # not known: the store's state is the safe one to go on from
        return record is not None and record.owner != self._instance

    def _retaken(self, session: Session) -> None:
        """The store had lost the session's lease, and with it its checkpoint and record (a Redis
        restarted without its data); this instance took the lease again, and its sandbox holds
        the session's state: the session is checkpointed again, and its record written again."""
        logger.warning(
            "session %r: the store had lost its lease and its checkpoint (restarted without its data?); "
            "the lease is taken again, and the session checkpointed anew",
            session.session_id,
        )
        session.saved, session.recorded, session.refusal = Saved(), -1, None

    async def asked(self) -> list[str]:
        """The sessions other instances asked this one to hand over since it last looked."""
        if self._store is None:
            return []
        try:
            asks = await self._store.asks(self._instance)
        except StoreError as error:
            if not self._asks_failing:  # said once, not four times a second while the store is away
                logger.warning("the asks for this instance's sessions could not be read: %s", error)
            self._asks_failing = True
            return []
        self._asks_failing = False
        return asks

    async def release(self, session: Session) -> None:
        lease, session.lease = session.lease, None
        if lease is not None and self._store is not None:
            await self._store.release_lease(lease)

    async def take_for_reset(self, session_id: str) -> None:
        """Before a reset deletes the session's saved state: make sure no other instance runs it
        (this one holds its lease, or can take it), deleting the state under the lease taken.
        Raises SessionElsewhere."""
        known = self._sessions.get(session_id)
        if self._store is None or (known is not None and known.lease is not None):
            return
        try:
            lease = await self._store.acquire_lease(session_id, self._instance, self._seconds)
        except LeaseHeld as error:
            raise SessionElsewhere(
                f"session {session_id!r} is running on another instance of this server ({error}); "
                "reset it through that instance, or once it has stopped"
            ) from None
        except StoreError:
            return
        await self._store.delete(session_id)
        await self._store.release_lease(lease)

    async def renew(self, session: Session) -> Renewal | None:
        """Renew a live session's lease (every `renew_interval`, in a task). A lease found taken
        (this instance stalled past it) loses the session's sandbox: now if it is idle (said as
        TAKEN, for the owner to give back), else before its next call (`hold`)."""
        lease = session.lease
        if self._store is None or lease is None:
            return None
        try:
            renewed = await self._store.renew_lease(lease, self._seconds)
        except LeaseTaken:
            logger.warning("session %r was taken over by another instance", session.session_id)
            if session.lease is lease:
                session.lease = None
            if session.lock.locked():
                self._taken.add(session)  # a call runs in its sandbox: given back at the next
                return None
            return Renewal.TAKEN
        except StoreError as error:
            logger.warning("session %r: %s", session.session_id, error)
            return None
        if session.lease is not lease:
            return None
        session.lease = renewed
        if not renewed.retaken:
            return None
        self._retaken(session)
        return Renewal.RETAKEN


class Renewal(Enum):
    """What renewing a lease found, for the session's sandbox and checkpoints."""

    #: Another instance took the idle session up: its sandbox here holds an older state.
    TAKEN = "taken"
    #: The store had lost the lease and this instance took it again: its checkpoint went with it.
    RETAKEN = "retaken"


def _elsewhere(session: Session, error: LeaseHeld) -> SessionElsewhere:
    return SessionElsewhere(
        f"session {session.session_id!r} is running on another instance of this server "
        f"({error}), which did not hand it over in time (a call still running there, or "
        "state a checkpoint cannot carry); send each session's calls to one instance "
        "(docs/deploy.md: hash on Mcp-Param-Session-Id and Mcp-Session-Id), or retry"
    )
