"""One error model: every refusal is a `Refused`, exported from the package root."""

from __future__ import annotations

import mcp_sandbox
from mcp_sandbox import errors


def test_every_refusal_is_one_exported_base() -> None:
    refusals = [
        errors.InvalidRequest,
        errors.PoolUnavailable,
        errors.SessionLimitReached,
        errors.SessionElsewhere,
        errors.PrincipalLimitReached,
        errors.StoreUnavailable,
    ]
    for refusal in refusals:
        assert issubclass(refusal, mcp_sandbox.Refused)
        assert getattr(mcp_sandbox, refusal.__name__) is refusal
    assert issubclass(errors.InvalidRequest, ValueError)  # what it was before the base, for callers
    assert sorted(errors.__all__) == sorted(["Refused", *(r.__name__ for r in refusals)])
