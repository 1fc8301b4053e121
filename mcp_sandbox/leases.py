"""This instance's leases on its sessions, so instances sharing a state folder never run one
session at once: taken before a call, renewed in the background while the session is live,
given up once it is not."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import anyio

from mcp_sandbox.errors import SessionElsewhere
from mcp_sandbox.lifecycle import Session, SessionState
from mcp_sandbox.pool import ReadyPool
from mcp_sandbox.store import LeaseHeld, LeaseTaken, Store, StoreError

logger = logging.getLogger(__name__)

#: How often a call waiting for a session another instance holds asks for the lease again, for
#: the first seconds: a handover takes a checkpoint's time, well under a second when idle.
HANDOVER_POLL_S = 0.1
HANDOVER_WAIT_S = 3.0
#: How often an instance looks for asks to hand its sessions over.
ASKS_INTERVAL_S = 0.25


class Leases:
    """The leases of the sessions in `sessions` (a Sessions's registry), held as `instance`
    for MCP_SANDBOX_LEASE_SECONDS at a time. Without a store there is nothing to share, and
    every method does nothing."""

    def __init__(
        self,
        store: Store | None,
        seconds: float,
        instance: str,
        sessions: Mapping[str, Session],
        ready_pool: ReadyPool,
    ) -> None:
        self._store = store
        self._seconds = seconds
        self._instance = instance
        self._sessions = sessions
        self._ready_pool = ready_pool

    @property
    def on(self) -> bool:
        return self._store is not None

    async def hold(self, session: Session) -> None:
        """Make sure this instance holds the session's lease (its lock held), waiting up to
        MCP_SANDBOX_LEASE_SECONDS for another instance's to run out. A sandbox kept from before
        another instance ran the session is given back: its state is older than the store's.
        Raises SessionElsewhere."""
        if self._store is None:
            return
        store, seconds = self._store, self._seconds
        held = session.lease
        if held is not None and held.expires - time.time() > seconds / 2:
            return  # renewed in the background; nobody can have taken it
        started = time.monotonic()
        deadline, asked = started + seconds + 1, False
        while True:
            try:
                lease = await store.acquire_lease(session.session_id, self._instance, seconds)
                break
            except LeaseHeld as error:
                if not asked:
                    # The holder checkpoints the session and lets go once its running call, if any, ends.
                    await store.ask_for(session.session_id, error.owner, self._instance)
                    asked = True
                if time.monotonic() >= deadline:
                    raise SessionElsewhere(
                        f"session {session.session_id!r} is running on another instance of this server "
                        f"({error}), which did not hand it over in time (a call still running there, or "
                        "state a checkpoint cannot carry); send each session's calls to one instance "
                        "(docs/deploy.md: hash on Mcp-Param-Session-Id and Mcp-Session-Id), or retry"
                    ) from None
                soon = time.monotonic() - started < HANDOVER_WAIT_S
                await anyio.sleep(HANDOVER_POLL_S if soon else min(1.0, seconds / 10))
            except StoreError as error:
                logger.warning("session %r runs without a lease: %s", session.session_id, error)
                session.lease = None
                return
        session.lease = lease
        if lease.taken_from is not None:
            session.moved_from = lease.taken_from
        taken_meanwhile = held is None or lease.token != held.token
        if taken_meanwhile and session.executor is not None:
            # Another instance may have run it since: the store's state is the one to go on from.
            await self._give_back(session)

    async def asked(self) -> list[str]:
        """The sessions other instances asked this one to hand over since it last looked."""
        if self._store is None:
            return []
        try:
            return await self._store.asks(self._instance)
        except StoreError as error:
            logger.warning("the asks for this instance's sessions could not be read: %s", error)
            return []

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

    async def renew_forever(self) -> None:
        """Renew the leases of live sessions every third of MCP_SANDBOX_LEASE_SECONDS, forever (run
        it in a task). A lease found taken (this instance stalled past it) gives its sandbox up."""
        if self._store is None:
            return
        store, seconds = self._store, self._seconds
        while True:
            await anyio.sleep(seconds / 3)
            for session in list(self._sessions.values()):
                lease = session.lease
                if lease is None:
                    continue
                try:
                    renewed = await store.renew_lease(lease, seconds)
                except LeaseTaken:
                    logger.warning("session %r was taken over by another instance", session.session_id)
                    if session.lease is lease:
                        session.lease = None
                    if not session.lock.locked() and session.executor is not None:
                        await self._give_back(session)
                except StoreError as error:
                    logger.warning("session %r: %s", session.session_id, error)
                else:
                    if session.lease is lease:
                        session.lease = renewed

    async def _give_back(self, session: Session) -> None:
        executor = session.to(SessionState.MOVED)
        assert executor is not None
        await self._ready_pool.release(executor)
