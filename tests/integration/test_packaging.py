"""The built wheel carries the Deno runner, and, installed in a new environment, runs code on pyodide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
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
    for name in (
        "runner.ts",
        "worker.ts",
        "recycle.ts",
        "checkpoint.ts",
        "protocol.ts",
        "options.ts",
        "modules.ts",
        "snapshot.ts",
        "script.ts",
        "rewrites.ts",
        "instance.ts",
        "linker.ts",
        "no-binary/pyodide.asm.wasm",
        "deno.json",
        "deno.lock",
    ):
        assert f"mcp_sandbox/backends/pyodide/{name}" in names
    assert "mcp_sandbox/guest/__init__.py" in names and "mcp_sandbox/protocol.py" in names


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment in which the wheel, and nothing from the checkout, is mcp_sandbox.

    Installing its dependencies from PyPI (numpy, pandas, the 40 MB Deno binary) would take
    minutes, so they come from this test's own environment instead: a .pth file appends its
    site-packages *after* the new environment's own, so the wheel's mcp_sandbox is found first;
    a .pth line only adds a folder, so the editable install's own .pth there (which would put
    the checkout on sys.path) is not run. The `deno` package's binary is linked into the new
    bin/, where installing the `deno` wheel would put it and where its finder looks.
    """
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", str(wheel)]
    subprocess.run(install, check=True, timeout=120)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dependencies = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    (Path(site) / "zz_dependencies.pth").write_text("\n".join(dependencies) + "\n", encoding="utf-8")
    (venv / "bin" / "deno").symlink_to(Path(sysconfig.get_path("scripts")) / "deno")
    return venv


def outside_the_checkout() -> dict[str, str]:
    """This environment without anything that could point Python at the checkout or the dev venv."""
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    return {
        name: value
        for name, value in os.environ.items()
        if name not in dropped and not name.startswith("MCP_SANDBOX_")
    }


def test_the_wheel_provides_mcp_sandbox_and_its_runner(venv: Path, tmp_path: Path) -> None:
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import json, mcp_sandbox; from mcp_sandbox.backends.pyodide import RUNNER_DIR; "
            "print(json.dumps([mcp_sandbox.__file__, str(RUNNER_DIR)]))",
        ],
        cwd=tmp_path,
        env=outside_the_checkout(),
        capture_output=True,
        text=True,
        check=True,
    )
    package, runner = map(Path, json.loads(where.stdout))
    assert package.is_relative_to(venv) and runner.is_relative_to(venv), (package, runner)
    assert runner == package.parent / "backends" / "pyodide"


def test_the_installed_command_runs_code_on_pyodide(venv: Path, tmp_path: Path) -> None:
    # The start-up log says which runner files Deno runs; the sandbox itself learns no host path.
    code = "import js, sys\nprint(js.location)\nsys.platform, sum(range(10))\n"
    done = subprocess.run(
        [str(venv / "bin" / "mcp-sandbox"), "run", "-"],
        input=code,
        cwd=tmp_path,
        env={**outside_the_checkout(), "MCP_SANDBOX_BACKEND": "pyodide", "MCP_SANDBOX_LOG_LEVEL": "INFO"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert f"runner in {venv}/" in done.stderr and "/mcp_sandbox/backends/pyodide" in done.stderr, done.stderr
    location, value = done.stdout.splitlines()
    assert location == "None"
    assert value == "('emscripten', 45)"
