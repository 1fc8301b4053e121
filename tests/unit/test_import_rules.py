"""The import rules of docs/architecture.md, as import-linter contracts in pyproject.toml."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if lint_imports is None:
        pytest.skip("import-linter is not installed (pip install -e '.[dev]' installs it)")
    done = subprocess.run(
        [lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_server_without_redis_or_oauth_imports_neither_client() -> None:
    """redis-py and PyJWT are a twentieth and a tenth of a server's start: imported where used."""
    probe = "import sys, mcp_sandbox.app, mcp_sandbox.cli; print(sorted({'redis', 'jwt'} & set(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    from mcp_sandbox.store import RedisStore  # still exported, on first use

    assert RedisStore.__name__ == "RedisStore"
