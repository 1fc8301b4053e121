"""What `mcp-sandbox doctor` checks for the pyodide backend: Deno, and Pyodide in the cache."""

from __future__ import annotations

import sys

import anyio

from mcp_sandbox.backends.base import SandboxStartError
from mcp_sandbox.backends.pyodide import find_deno, pyodide_version
from mcp_sandbox.checks import Check, Status
from mcp_sandbox.settings import Settings


async def checks(settings: Settings) -> list[Check]:
    return [await check_deno(settings), check_pyodide_cache(settings)]


def untried(settings: Settings) -> str | None:
    # Trying it uncached would fetch Pyodide, which is the job of `mcp-sandbox fetch`.
    return None if check_pyodide_cache(settings).status == "ok" else "Pyodide is not cached"


async def check_deno(settings: Settings) -> Check:
    # Only the pyodide backend needs Deno; `auto` falls back to subprocess without it.
    severity: Status = "failed" if settings.backend == "pyodide" else "warning"
    deno = find_deno(settings)
    if deno is None:
        if settings.deno_path is not None:
            return Check(
                "Deno",
                severity,
                f"MCP_SANDBOX_DENO_PATH={settings.deno_path} is not an executable file",
                "point MCP_SANDBOX_DENO_PATH at a Deno binary, or unset it to use the `deno` package's",
            )
        return Check(
            "Deno",
            severity,
            "not found (the `deno` package provides it)",
            f"{sys.executable} -m pip install 'deno>=2.5,<3', or set MCP_SANDBOX_DENO_PATH",
        )
    try:
        with anyio.fail_after(20):
            done = await anyio.run_process([str(deno), "--version"], check=False)
    except (OSError, TimeoutError) as error:
        return Check("Deno", severity, f"{deno} does not run: {error}", "reinstall it: pip install -U deno")
    if done.returncode != 0:
        return Check("Deno", severity, f"{deno} --version failed", "reinstall it: pip install -U deno")
    version = done.stdout.decode(errors="replace").split("\n", 1)[0].split(" (", 1)[0]
    return Check("Deno", "ok", f"{version} at {deno}")


def check_pyodide_cache(settings: Settings) -> Check:
    try:
        version = pyodide_version()
    except SandboxStartError as error:
        return Check(
            "Pyodide", "failed", str(error), "reinstall mcp-sandbox: its Deno runner files are incomplete"
        )
    # Where PyodideBackend.prepare() has Deno keep it.
    deno_dir = settings.cache_dir / "deno"
    if not any((deno_dir / "npm").glob(f"*/pyodide/{version}")):
        return Check(
            "Pyodide",
            "warning",
            f"{version} is not cached in {deno_dir} yet (the first start fetches it from the npm registry)",
            "run `mcp-sandbox fetch` once, where the npm registry is reachable",
        )
    snapshot = any(settings.cache_dir.glob(f"pyodide-{version}-*.snapshot"))
    return Check(
        "Pyodide",
        "ok",
        f"{version} cached in {deno_dir}" + ("" if snapshot else " (no memory snapshot yet: slower starts)"),
    )
