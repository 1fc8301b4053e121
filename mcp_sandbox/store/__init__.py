"""Where sessions' saved state lives, shared by the instances that use one store: checkpoints,
records and leases (the contract: `contract.Store`). A folder (`DirectoryStore`) or Redis
(`RedisStore`), chosen by `open_store` from the settings."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcp_sandbox.settings import Settings
from mcp_sandbox.store.codec import MAGIC
from mcp_sandbox.store.contract import (
    Lease,
    LeaseHeld,
    LeaseTaken,
    SavedState,
    SessionRecord,
    StateUnusable,
    Store,
    StoreError,
)
from mcp_sandbox.store.directory import DirectoryStore

if TYPE_CHECKING:
    from mcp_sandbox.store.redis import RedisStore

logger = logging.getLogger(__name__)

__all__ = [
    "MAGIC",
    "DirectoryStore",
    "Lease",
    "LeaseHeld",
    "LeaseTaken",
    "RedisStore",
    "SavedState",
    "SessionRecord",
    "StateUnusable",
    "Store",
    "StoreError",
    "open_store",
]


def __getattr__(name: str) -> Any:
    # redis-py is imported by a server that uses Redis only: it is a twentieth of a start.
    if name == "RedisStore":
        from mcp_sandbox.store.redis import RedisStore

        return RedisStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@asynccontextmanager
async def open_store(settings: Settings) -> AsyncIterator[Store]:
    """The store the settings name (MCP_SANDBOX_STATE_URL or MCP_SANDBOX_STATE_DIR), or a private
    folder removed at exit; closed at exit."""
    if settings.redis_url is not None:
        from mcp_sandbox.store.redis import RedisStore

        redis_store = RedisStore(
            settings.redis_url,
            max_session_bytes=settings.max_state_mb * 2**20,
            session_ttl=settings.session_ttl,
            prefix=settings.state_key_prefix,
        )
        logger.info(
            "saved sessions in %s under %r (its maxmemory bounds them, not MCP_SANDBOX_MAX_STORE_MB)",
            redis_store.where,
            settings.state_key_prefix,
        )
        try:
            try:
                await redis_store.lost_data_since()  # learns the epoch, to know a loss of data later
            except StoreError as error:
                logger.warning("%s; its epoch is read at the first session", error)
            yield redis_store
        finally:
            await redis_store.aclose()
        return
    root = settings.state_dir
    temporary = root is None
    if root is None:
        root = Path(tempfile.mkdtemp(prefix="mcp-sandbox-state-"))
    store: Store = DirectoryStore(
        root,
        max_session_bytes=settings.max_state_mb * 2**20,
        max_total_bytes=settings.max_store_mb * 2**20,
    )
    try:
        yield store
    finally:
        await store.aclose()
        if temporary:
            shutil.rmtree(root, ignore_errors=True)
