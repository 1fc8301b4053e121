"""The official MCP conformance suite (npm @modelcontextprotocol/conformance) against the real server
over streamable HTTP, at both protocol versions the SDK speaks: 0.1.x at 2025-11-25, the 0.2 alphas
at 2026-07-28. `.ci/run` installs both under tests/.conformance, with Node 22 from npm where the
machine's Node is older; the scenarios expected to fail, each needing the suite's fixture server, are
listed with their reasons in tests/conformance/."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from tests.helpers import http_server

pytestmark = pytest.mark.anyio

TESTS = Path(__file__).resolve().parents[1]
INSTALLED = TESTS / ".conformance"
#: Each protocol version: the suite's options for it.
VERSIONS = {
    "2025-11-25": ["--suite", "all", "--spec-version", "2025-11-25"],
    "2026-07-28": ["--suite", "all", "--spec-version", "2026-07-28"],
}
NEEDS_NODE = 22


def node() -> str | None:
    """A Node of NEEDS_NODE or newer: the one .ci/run installed, else the machine's."""
    for candidate in (INSTALLED / "node" / "node_modules" / ".bin" / "node", shutil.which("node")):
        if candidate is None or not Path(candidate).exists():
            continue
        found = subprocess.run([str(candidate), "--version"], capture_output=True, text=True, check=False)
        major = re.match(r"v(\d+)\.", found.stdout)
        if major is not None and int(major.group(1)) >= NEEDS_NODE:
            return str(candidate)
    return None


def suite(version: str) -> list[str]:
    """The command that runs the suite for `version`; skips, saying why, where it is missing."""
    cli = INSTALLED / version / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    if not cli.exists():
        pytest.skip(
            f"the conformance suite for {version} is not installed in {INSTALLED} (.ci/run installs it)"
        )
    runtime = node()
    if runtime is None:
        pytest.skip(f"the conformance suite needs Node {NEEDS_NODE} or newer (npm install node@{NEEDS_NODE})")
    return [runtime, str(cli), "server", *VERSIONS[version]]


@pytest.fixture(scope="module")
async def server(anyio_backend: str) -> AsyncIterator[str]:
    """The real server over streamable HTTP, on the default backend: its MCP endpoint."""
    async with http_server() as (port, _):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("version", sorted(VERSIONS))
async def test_every_scenario_passes_but_those_needing_the_suites_fixtures(
    version: str, server: str, tmp_path: Path
) -> None:
    command = suite(version)
    expected = TESTS / "conformance" / f"expected-failures-{version}.yml"
    with anyio.fail_after(300):
        done = await anyio.run_process(
            [*command, "--url", server, "--expected-failures", str(expected), "--output-dir", str(tmp_path)],
            check=False,
        )
    report = done.stdout.decode(errors="replace")
    summary = report[report.rfind("=== SUMMARY ===") :]
    assert done.returncode == 0, summary + done.stderr.decode(errors="replace")[-2000:]
    assert re.search(r"Total: [1-9]\d* passed", summary), summary
