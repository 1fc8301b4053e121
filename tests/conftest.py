import os

import pytest

# Tests never fetch from the Pyodide CDN: the default package set is off unless a test turns it on
# with an index of its own (tests/package_index.py). Servers the tests start inherit this.
os.environ.setdefault("MCP_SANDBOX_DEFAULT_PACKAGES", "")


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


#: The slowest test files, slowest first (per-file time from `pytest --junitxml`, all workers):
#: run first, so that with `--dist loadfile` no worker is left alone with a long file at the end.
SLOWEST_FIRST = [
    "tests/integration/test_checkpoints.py",
    "tests/integration/test_cli.py",
    "tests/security/test_resources.py",
    "tests/security/test_cohosting.py",
    "tests/integration/test_bridge.py",
    "tests/integration/test_execute_python.py",
    "tests/integration/test_dspy.py",
    "tests/integration/test_isolation.py",
    "tests/integration/test_instances.py",
    "tests/integration/test_faults.py",
    "tests/security/test_sessions.py",
    "tests/integration/test_store_faults.py",
    "tests/integration/test_cohosting.py",
    "tests/integration/test_native_code.py",
    "tests/security/test_processes.py",
    "tests/security/test_host_secrets.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: n for n, path in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(SLOWEST_FIRST)))
