"""The two CPython backends (subprocess, inprocess): pandas and numpy, and the strict policy."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from tests.helpers import call, server_params

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module", params=["subprocess", "inprocess"])
def backend(request: pytest.FixtureRequest) -> str:
    """The CPython backends only; `client` is the conformance suite's (tests/integration/conftest.py)."""
    name: str = request.param
    return name


@pytest.fixture(scope="module")
async def strict_client(anyio_backend: str, backend: str) -> AsyncIterator[Client]:
    params = server_params(MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_POLICY="strict")
    async with Client(params) as connected:
        yield connected


async def test_pandas_and_numpy_work_and_a_dataframe_reads_as_a_table(client: Client, backend: str) -> None:
    code = "import numpy as np, pandas as pd\npd.DataFrame({'x': np.arange(3), 'y': ['a', 'b', 'c']})"
    result = await call(client, code)
    assert result["success"] is True, result
    assert result["backend"] == backend
    assert result["result"].splitlines()[0].split() == ["x", "y"]
    assert "2  c" in result["result"]


async def test_a_big_dataframe_is_shown_bounded(client: Client) -> None:
    result = await call(client, "import pandas as pd\npd.DataFrame({'n': range(100_000)})")
    assert "..." in result["result"] and len(result["result"]) < 5_000


async def test_a_dataframe_persists_in_a_session(client: Client) -> None:
    await call(client, "import pandas as pd\ndf = pd.DataFrame({'v': [1, 2, 3]})", session_id="frames")
    result = await call(client, "df['v'].sum()", session_id="frames")
    assert result["result"] in {"6", "np.int64(6)"}


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os\nos.listdir('/')", "import of 'os'"),
        ("from subprocess import run", "import from 'subprocess'"),
        ("x = 1\nopen('/etc/passwd').read()", "line 2: 'open'"),
        ("().__class__.__bases__[0].__subclasses__()", "'__subclasses__'"),
        ("f = eval\nf('1')", "'eval'"),
    ],
)
async def test_strict_policy_rejects_before_running(strict_client: Client, code: str, reason: str) -> None:
    result = await call(strict_client, code, session_id="strict")
    assert result["success"] is False and result["error_type"] == "Rejected", result
    assert reason in result["error"] and "MCP_SANDBOX_POLICY=strict" in result["error"]
    assert result["session_id"] == "strict" and result["session_lost"] is False


async def test_strict_policy_lets_analysis_code_run(strict_client: Client) -> None:
    code = "import math\nimport numpy as np\nimport pandas as pd\n"
    code += "int(pd.Series(np.arange(4)).sum()) + math.floor(1.5)"
    result = await call(strict_client, code)
    assert result["result"] == "7", result
    syntax = await call(strict_client, "def broken(:")
    assert syntax["error_type"] == "SyntaxError"


async def test_strict_policy_is_not_a_boundary(strict_client: Client, tmp_path: Path) -> None:
    # What docs/security.md says: allowed libraries still read files the policy never sees; the sandbox's
    # limits hold, not this. (A file every tier lets Python read: its environment's own config.)
    config = Path(sys.prefix) / "pyvenv.cfg"
    if not config.is_file():
        pytest.skip("the server's Python is not a virtual environment (no pyvenv.cfg to read)")
    code = f"import numpy as np\nstr(np.loadtxt({str(config)!r}, dtype=str, delimiter='='))"
    result = await call(strict_client, code)
    assert result["success"] is True and "home" in result["result"], result
