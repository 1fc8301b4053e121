import os

import pytest

# Tests never fetch from the Pyodide CDN: the default package set is off unless a test turns it on
# with an index of its own (tests/package_index.py). Servers the tests start inherit this.
os.environ.setdefault("MCP_SANDBOX_DEFAULT_PACKAGES", "")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


def missing_tier(tier: str, problem: str) -> None:
    """A test needs isolation `tier`, which this machine lacks: skip, saying why, unless the
    machine is known to have it (CI sets MCP_SANDBOX_TEST_EXPECT_TIERS), where that is a failure."""
    if tier in os.environ.get("MCP_SANDBOX_TEST_EXPECT_TIERS", "").split(","):
        pytest.fail(f"isolation {tier} should work on this machine, and does not: {problem}")
    pytest.skip(f"this machine does not offer isolation {tier}: {problem}")
