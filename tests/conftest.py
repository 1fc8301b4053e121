import os

import pytest

# Tests never fetch from the Pyodide CDN: the default package set is off unless a test turns it on
# with an index of its own (tests/package_index.py). Servers the tests start inherit this.
os.environ.setdefault("MCP_SANDBOX_DEFAULT_PACKAGES", "")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
