"""Command line: `mcp-sandbox` (stdio server) and `mcp-sandbox serve ...`."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from typing import Any, Literal

import anyio
import uvicorn
from pydantic import ValidationError

from mcp_sandbox import __version__
from mcp_sandbox.backends.base import SandboxStartError
from mcp_sandbox.backends.pyodide import PyodideBackend, find_deno, pyodide_version
from mcp_sandbox.bridge.config import BridgeConfigError
from mcp_sandbox.http_auth import BearerAuth
from mcp_sandbox.packages import PackageError, default_index_url, warm_packages
from mcp_sandbox.server import App, build_server
from mcp_sandbox.settings import Settings

logger = logging.getLogger("mcp_sandbox")

Transport = Literal["stdio", "sse", "http"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcp-sandbox",
        description="An MCP server that runs Python in a sandbox. With no command, serves MCP over stdio.",
    )
    parser.add_argument("--version", action="version", version=f"mcp-sandbox {__version__}")
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="run the MCP server", description="Run the MCP server.")
    serve.add_argument("--transport", choices=["stdio", "sse", "http"], default="stdio")
    serve.add_argument("--host", default="127.0.0.1", help="address for sse/http (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port for sse/http (default 8000)")
    serve.add_argument(
        "--backend",
        choices=["auto", "pyodide", "subprocess", "inprocess"],
        help="overrides MCP_SANDBOX_BACKEND (inprocess: trusted code only)",
    )
    serve.add_argument("--policy", choices=["off", "strict"], help="overrides MCP_SANDBOX_POLICY")
    serve.add_argument(
        "--bridge-config",
        metavar="FILE",
        help="upstream MCP servers file; overrides MCP_SANDBOX_BRIDGE_CONFIG",
    )
    serve.add_argument("--pool-size", type=int, help="overrides MCP_SANDBOX_POOL_SIZE")
    serve.add_argument(
        "--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="overrides MCP_SANDBOX_LOG_LEVEL"
    )
    warmup = commands.add_parser(
        "warmup",
        help="fetch Pyodide, and Pyodide packages, for offline use",
        description="Fetch Pyodide into the cache and, with --packages, packages of the Pyodide "
        "distribution (with their dependencies) into the packages folder, so sandboxes load them offline.",
    )
    warmup.add_argument("--packages", default="", help="comma-separated, e.g. numpy,pandas,matplotlib")
    warmup.add_argument("--index-url", help="where to fetch them (default: the Pyodide CDN for this version)")
    return parser


async def warm_up(settings: Settings, packages: list[str], index_url: str | None) -> None:
    deno = find_deno(settings)
    if deno is None:
        raise SandboxStartError("no Deno found: the pyodide backend cannot be warmed up")
    async with anyio.create_task_group() as group:
        # Only prepare() is used here, which starts no tasks.
        backend = PyodideBackend(settings, group, deno)
    await backend.prepare()
    print(f"Pyodide {pyodide_version()} is in {settings.cache_dir}", file=sys.stderr)
    if packages:
        url = index_url or default_index_url(pyodide_version())
        folder = settings.packages_folder
        print(f"fetching into {folder} from {url}", file=sys.stderr)
        fetched = await anyio.to_thread.run_sync(warm_packages, backend.lock_file(), packages, folder, url)
        print(f"{len(fetched)} package files fetched", file=sys.stderr)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(settings: Settings, transport: Transport, host: str, port: int) -> None:
    async with App(settings) as app:
        server = build_server(app)
        if transport == "stdio":
            await server.run_stdio_async()
            return
        if transport == "sse":
            logger.info("serving MCP over SSE at http://%s:%d/sse", host, port)
            web_app: Any = server.sse_app(host=host)
        else:
            logger.info("serving MCP over streamable HTTP at http://%s:%d/mcp", host, port)
            web_app = server.streamable_http_app(host=host)
        if settings.auth_token is not None:
            web_app = BearerAuth(web_app, settings.auth_token.get_secret_value())
        config = uvicorn.Config(web_app, host=host, port=port, log_level=settings.log_level.lower())
        await uvicorn.Server(config).serve()


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    overrides: dict[str, Any] = {
        name: value
        for name in ("backend", "policy", "bridge_config", "pool_size", "log_level")
        if (value := getattr(args, name, None)) is not None
    }
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        sys.exit(f"mcp-sandbox: invalid setting: {problems}")
    logging.basicConfig(
        level=settings.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.command == "warmup":
        names = [name.strip() for name in args.packages.split(",") if name.strip()]
        try:
            anyio.run(warm_up, settings, names, args.index_url)
        except (SandboxStartError, PackageError) as error:
            sys.exit(f"mcp-sandbox warmup: {error}")
        return
    transport: Transport = getattr(args, "transport", "stdio")
    host: str = getattr(args, "host", "127.0.0.1")
    port: int = getattr(args, "port", 8000)
    if transport != "stdio" and not _is_loopback(host) and settings.auth_token is None:
        logger.warning(
            "LISTENING ON %s WITHOUT A TOKEN: anyone who can reach this address can run code here. "
            "Set MCP_SANDBOX_AUTH_TOKEN to require Authorization: Bearer <token>.",
            host,
        )
    try:
        anyio.run(serve, settings, transport, host, port)
    except (SandboxStartError, BridgeConfigError) as error:
        sys.exit(f"mcp-sandbox: {error}")
    except KeyboardInterrupt:
        pass
