"""What the subprocess backend spends of a sandbox's memory limit, and matplotlib's font cache:
built once per server, each sandbox given its own copy.

Through the real server and MCP client, on each isolation tier the machine has (bubblewrap's
environment is set by its command line, landlock's by the process's)."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator

import pytest
from mcp import Client

from mcp_sandbox.settings import Settings
from tests.helpers import call, missing_tier, server_params
from tests.integration.test_isolation import tier_works

pytestmark = pytest.mark.anyio

#: 300 MB of real memory (np.ones writes every page), with matplotlib drawing.
NEEDS_300_MB = """
import resource
import numpy as np
import matplotlib.pyplot as plt
a = np.ones(300 * 2**20 // 8)
plt.plot(a[:10]); plt.savefig('output/big.png'); plt.close('all')
(int(a.sum()) * 8 // 2**20, resource.getrlimit(resource.RLIMIT_AS)[0] // 2**20)
"""
#: A first matplotlib import: whether it ran fc-list (it builds its font cache so), whether its
#: cache folder changed, and whether what it found there is another sandbox's spoiled copy.
FIRST_IMPORT = """
import os
folder = os.path.expanduser('~/.cache/matplotlib')
def files():
    return {name: open(os.path.join(folder, name), 'rb').read() for name in os.listdir(folder)}
before = files()
import matplotlib.pyplot as plt
import matplotlib.font_manager as fm
plt.plot([1, 2]); plt.savefig('output/plot.png'); plt.close('all')
spoiled = any(b'spoiled' in data for data in before.values())
(fm._get_fontconfig_fonts.cache_info().misses, files() == before, spoiled)
"""
#: Overwrite the font cache this sandbox was given, wherever it really is.
SPOIL = """
import os
folder = os.path.expanduser('~/.cache/matplotlib')
path = os.path.realpath(os.path.join(folder, os.listdir(folder)[0]))
try:
    with open(path, 'w') as file:
        file.write('{"_version": "spoiled"}')
    written = 'written'
except OSError as error:
    written = type(error).__name__
written
"""


@pytest.fixture(scope="module", params=["bubblewrap", "landlock"])
async def client(anyio_backend: str, request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    tier: str = request.param
    if (problem := tier_works(tier)) is not None:
        missing_tier(tier, problem)
    async with Client(
        server_params(MCP_SANDBOX_BACKEND="subprocess", MCP_SANDBOX_ISOLATION=tier)
    ) as connected:
        yield connected


async def test_a_program_needing_300_mb_passes_under_the_default_limit(client: Client) -> None:
    done = await call(client, NEEDS_300_MB, session_id="big", timeout=120)
    assert done["success"], done["error"]
    assert ast.literal_eval(done["result"]) == (300, Settings.model_fields["memory_mb"].default)


async def test_new_sessions_find_the_font_cache_built(client: Client) -> None:
    for session in ("first", "second"):
        done = await call(client, FIRST_IMPORT, session_id=session, timeout=120)
        assert done["success"], done["error"]
        assert ast.literal_eval(done["result"]) == (0, True, False), session


async def test_a_sandbox_cannot_spoil_the_font_cache_of_the_next(client: Client) -> None:
    spoiled = await call(client, SPOIL, session_id="spoiler")
    assert spoiled["success"], spoiled["error"]
    done = await call(client, FIRST_IMPORT, session_id="after-spoiler", timeout=120)
    assert done["success"], done["error"]
    assert ast.literal_eval(done["result"]) == (0, True, False)
