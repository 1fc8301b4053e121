"""The built wheel carries the Deno runner, and the installed package finds it there."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("mcp_sandbox-*.whl")
    return built


def test_wheel_contains_the_runner(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("runner.ts", "worker.ts", "deno.json"):
        assert f"mcp_sandbox/deno/{name}" in names
    assert "mcp_sandbox/backends/guest_runtime.py" in names


def test_installed_package_finds_its_own_runner(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    found = subprocess.run(
        [sys.executable, "-c", "from mcp_sandbox.backends.pyodide import runner_dir; print(runner_dir())"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(found.stdout.strip()) == tmp_path / "mcp_sandbox" / "deno"
