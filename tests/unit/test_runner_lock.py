"""The runner's npm packages are pinned by its deno.lock: every deno command given the runner's
deno.json reads it frozen, so a package whose integrity differs from it is refused."""

from __future__ import annotations

import json

from mcp_sandbox.backends.pyodide import RUNNER_DIR, pyodide_version


def test_the_runner_config_uses_its_lock_frozen() -> None:
    config = json.loads((RUNNER_DIR / "deno.json").read_text(encoding="utf-8"))
    assert config["lock"] == {"path": "./deno.lock", "frozen": True}


def test_the_lock_pins_the_pyodide_the_config_imports() -> None:
    lock = json.loads((RUNNER_DIR / "deno.lock").read_text(encoding="utf-8"))
    version = pyodide_version()
    assert lock["specifiers"] == {f"npm:pyodide@{version}": version}, (
        "the lock is out of date: in mcp_sandbox/backends/pyodide run "
        "`deno cache --frozen=false --config deno.json runner.ts worker.ts snapshot.ts`"
    )
    assert lock["npm"][f"pyodide@{version}"]["integrity"].startswith("sha512-")
