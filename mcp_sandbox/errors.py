"""Refusals: a call this server will not run, and why. One base, `Refused`, whose message is a
sentence for the caller; every adapter passes it on as it is (an MCP ToolError, a CLI error, a
DSPy interpreter error). Everything else a call goes through is in its result, never raised."""


class Refused(Exception):
    """A call the server will not run; the message says why and what to do."""


class InvalidRequest(Refused, ValueError):
    """A call's arguments break a limit; the message says which and how to fix it."""


class PoolUnavailable(Refused):
    """No sandbox could be had: the wait ran out, or sandboxes fail to start."""


class SessionLimitReached(Refused):
    """Every session slot is taken."""


class PrincipalLimitReached(Refused):
    """A principal is at one of its own limits (quotas.py); `setting` is the variable that sets it."""

    def __init__(self, message: str, setting: str) -> None:
        super().__init__(message)
        self.setting = setting


class SessionElsewhere(Refused):
    """Another instance sharing the state store runs the session, and kept it past the wait."""


class StoreUnavailable(Refused):
    """The state store did not answer, and the session is not live on this instance: taking it up
    without its lease could run it on two instances at once."""


__all__ = [
    "InvalidRequest",
    "PoolUnavailable",
    "PrincipalLimitReached",
    "Refused",
    "SessionElsewhere",
    "SessionLimitReached",
    "StoreUnavailable",
]
