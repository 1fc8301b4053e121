"""`mcp-sandbox doctor`: what works on this machine, what does not, and how to fix it.

Each check is one function returning a `Check`; `run_checks` yields them in the order printed.
Nothing here changes the machine: the backends are tried with `1 + 1` and thrown away.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import anyio
from pydantic import ValidationError

import mcp_sandbox
from mcp_sandbox.backends.registry import AUTO, AUTO_ORDER, BACKENDS
from mcp_sandbox.bridge.config import BridgeConfigError, StdioUpstream, Upstream, load_bridge_config
from mcp_sandbox.bridge.upstreams import connect_upstream, list_all_tools
from mcp_sandbox.checks import Check, Status
from mcp_sandbox.sandbox import Sandbox
from mcp_sandbox.settings import Settings

#: Seconds a backend gets to start and answer `1 + 1`; a warm machine needs about one.
BACKEND_TIMEOUT = 60.0
#: Seconds an upstream gets to connect and list its tools.
UPSTREAM_TIMEOUT = 15.0


def validation_message(error: ValidationError) -> str:
    """Which settings are wrong and why, on one line, by the names a user sets them with."""
    return "; ".join(
        f"MCP_SANDBOX_{'_'.join(map(str, problem['loc'])).upper()}: {problem['msg']}"
        for problem in error.errors()
    )


def check_settings(overrides: dict[str, Any]) -> tuple[Check, Settings | None]:
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        return (
            Check(
                "settings",
                "failed",
                validation_message(error),
                "correct or unset that variable (in the environment or .env)",
            ),
            None,
        )
    dotenv = " and .env" if Path(".env").is_file() else ""
    return Check("settings", "ok", f"read from MCP_SANDBOX_* variables{dotenv}"), settings


def check_python() -> Check:
    # Always new enough: mcp-sandbox installs and imports only on 3.11+ (pyproject's requires-python).
    version = ".".join(map(str, sys.version_info[:3]))
    return Check("Python", "ok", f"{version} at {sys.executable}")


async def check_backend(settings: Settings, name: str) -> Check:
    """Start the backend for real and run `1 + 1`; nothing of the server's setup is used."""
    trial = settings.model_copy(
        update={
            "backend": name,
            "pool_size": 0,
            "bridge_config": None,
            "audit_log": None,
            "save_code": None,
            "output_dir": None,
            "start_timeout": BACKEND_TIMEOUT,
            "default_packages": "",
        }
    )
    started = time.monotonic()
    try:
        with anyio.fail_after(BACKEND_TIMEOUT):
            async with Sandbox(settings=trial) as sandbox:
                result = await sandbox.run("1 + 1", timeout=10)
    except TimeoutError:
        problem = f"did not start and answer within {BACKEND_TIMEOUT:g} s"
    except Exception as error:  # noqa: BLE001 - any failure means unusable, and is reported, not raised
        problem = str(error) or type(error).__name__
    else:
        if result.success and result.result == "2":
            seconds = time.monotonic() - started
            return Check(f"{name} backend", "ok", f"1 + 1 = 2 in {seconds:.1f} s: {BACKENDS[name].summary}")
        problem = f"1 + 1 gave {result.error_type or result.result}: {result.error or ''}".strip(": ")
    return Check(f"{name} backend", "failed", problem[:300], BACKENDS[name].fix)


def judge_backends(settings: Settings, checks: dict[str, Check]) -> list[Check]:
    """A backend that does not work fails the doctor only when the server as configured needs it:
    it is the configured one, or (auto) none of those auto tries works."""
    usable = {name for name, check in checks.items() if check.status == "ok"}
    judged = []
    for name, check in checks.items():
        if check.status == "ok":
            judged.append(check)
            continue
        if settings.backend == AUTO:
            needed = name in AUTO_ORDER and not usable & set(AUTO_ORDER)
            later = AUTO_ORDER[AUTO_ORDER.index(name) + 1 :] if name in AUTO_ORDER else ()
            instead = next((other for other in later if other in usable), None)
            fallback = f" (auto falls back to {instead})" if instead else ""
        else:
            needed, fallback = settings.backend == name, ""
        status: Status = "failed" if needed else "warning"
        judged.append(Check(check.name, status, check.detail + fallback, check.fix))
    return judged


async def check_upstream(name: str, upstream: Upstream) -> Check:
    where = (
        " ".join([upstream.command, *upstream.args]) if isinstance(upstream, StdioUpstream) else upstream.url
    )
    try:
        with anyio.fail_after(UPSTREAM_TIMEOUT):
            async with connect_upstream(upstream) as client:
                count = len(await list_all_tools(client))
    except TimeoutError:
        problem = f"no answer within {UPSTREAM_TIMEOUT:g} s"
    except Exception as error:  # noqa: BLE001 - an unreachable upstream is reported, whatever the cause
        problem = _innermost(error)
    else:
        return Check(f"upstream {name}", "ok", f"reachable, {count} tools ({where})")
    return Check(
        f"upstream {name}",
        "failed",
        f"unreachable: {problem} ({where})"[:300],
        "start it or correct its entry; for a command, try running it yourself",
    )


def _innermost(error: BaseException) -> str:
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return str(error) or type(error).__name__


def check_packages_folder(settings: Settings) -> Check:
    folder = settings.packages_folder
    if not folder.is_dir():
        return Check(
            "packages folder",
            "ok",
            f"{folder} is not there yet (the pyodide backend makes it at start, and fetches "
            "MCP_SANDBOX_DEFAULT_PACKAGES into it)",
        )
    if not os.access(folder, os.R_OK | os.X_OK):
        return Check("packages folder", "failed", f"{folder} is not readable", f"chmod u+rx {folder}")
    files = [path for path in folder.iterdir() if path.suffix in (".whl", ".zip", ".tar")]
    return Check("packages folder", "ok", f"{folder}: {len(files)} package file{'s' * (len(files) != 1)}")


async def run_checks(settings: Settings, names: list[str]) -> AsyncGenerator[Check, None]:
    """Every check, in the order printed, of the backends `names` and the rest; the backends are
    tried one after another."""
    yield check_python()
    for name in names:
        for check in await BACKENDS[name].checks(settings):
            yield check
    backends: dict[str, Check] = {}
    for name in names:
        entry = BACKENDS[name]
        if (reason := entry.untried(settings)) is not None:
            backends[name] = Check(f"{name} backend", "failed", f"not tried: {reason}", entry.fix)
        else:
            backends[name] = await check_backend(settings, name)
    for check in judge_backends(settings, backends):
        yield check
    if settings.bridge_config is None:
        yield Check("bridge config", "ok", "none (MCP_SANDBOX_BRIDGE_CONFIG is not set; it is optional)")
    else:
        try:
            config = load_bridge_config(settings.bridge_config)
        except BridgeConfigError as error:
            yield Check(
                "bridge config", "failed", str(error), "correct the file, or unset MCP_SANDBOX_BRIDGE_CONFIG"
            )
        else:
            count = len(config.servers)
            yield Check(
                "bridge config", "ok", f"{settings.bridge_config}: {count} upstream{'s' * (count != 1)}"
            )
            for name, upstream in config.servers.items():
                yield await check_upstream(name, upstream)
    yield check_packages_folder(settings)


def server_command() -> list[str]:
    """How this very installation is started: the `mcp-sandbox` script in use, or `python -m`."""
    script = Path(sys.argv[0])
    if script.name.startswith("mcp-sandbox") and script.is_file():
        return [os.path.abspath(script)]
    found = shutil.which("mcp-sandbox")
    # Only a script beside this interpreter is surely this installation.
    if found is not None and Path(found).parent == Path(sys.executable).parent:
        return [os.path.abspath(found)]
    # Not resolved: a virtual environment's python is a link that must stay inside it.
    return [os.path.abspath(sys.executable), "-m", "mcp_sandbox"]


def claude_desktop_config() -> dict[str, Any]:
    command, *args = server_command()
    entry: dict[str, Any] = {"command": command}
    if args:
        entry["args"] = args
    # Claude Desktop starts the server elsewhere, without this shell's variables or .env file.
    env = {
        name: value
        for name, value in sorted(os.environ.items())
        if name.startswith("MCP_SANDBOX_") and name != "MCP_SANDBOX_AUTH_TOKEN"
    }
    if env:
        entry["env"] = env
    return {"mcpServers": {"python-sandbox": entry}}


def http_client_config(settings: Settings, host: str = "127.0.0.1", port: int = 8000) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": "http", "url": f"http://{host}:{port}/mcp"}
    if settings.auth_token is not None:
        entry["headers"] = {"Authorization": "Bearer <MCP_SANDBOX_AUTH_TOKEN>"}
    return {"mcpServers": {"python-sandbox": entry}}


def package_location() -> Path:
    return Path(mcp_sandbox.__file__).resolve().parent
