"""A real Pyodide C extension for the tests of native code: `dummy-pyodide-ext-test` from PyPI, a
2 KB WebAssembly side module with `hello()` and `add(a, b)`. `.ci/run` fetches it into
tests/.wheels/; elsewhere it is fetched on first use, and tests that need it skip, saying why,
where it cannot be had."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

NAME = "dummy-pyodide-ext-test"
MODULE = "dummy_pyodide_ext_test"
VERSION = "0.1.0"
FOLDER = Path(__file__).resolve().parent / ".wheels"
DOWNLOAD = [
    *(
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--platform",
        "pyemscripten_2025_0_wasm32",
    ),
    *("--python-version", "3.13", "--implementation", "cp", f"{NAME}=={VERSION}", "--dest"),
]


def fetched_wheel() -> tuple[Path | None, str]:
    """The extension's wheel, fetched once into tests/.wheels/, or None and why not."""
    found = sorted(FOLDER.glob(f"{MODULE}-{VERSION}-*.whl"))
    if found:
        return found[0], ""
    FOLDER.mkdir(exist_ok=True)
    done = subprocess.run(
        [sys.executable, *DOWNLOAD, str(FOLDER)], capture_output=True, text=True, timeout=120
    )
    found = sorted(FOLDER.glob(f"{MODULE}-{VERSION}-*.whl"))
    return (found[0], "") if found else (None, done.stderr[-300:])


def native_wheel() -> Path:
    """The extension's wheel; skips the test, saying why, when it cannot be fetched."""
    wheel, why = fetched_wheel()
    if wheel is None:
        pytest.skip(f"the Pyodide C extension {NAME} could not be fetched from PyPI: {why}")
    return wheel


def packages_folder_with_the_extension(folder: Path) -> Path:
    """`folder` made a packages folder that holds the extension's wheel."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(native_wheel(), folder)
    return folder
