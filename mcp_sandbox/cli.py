"""Command line: `mcp-sandbox` (the stdio server), `serve`, `run`, `doctor` and `fetch`.

`serve` and `run` take every setting as a flag, made from the Settings model (its names, help
and choices) by pydantic-settings; a flag wins over MCP_SANDBOX_* variables and .env.
"""

from __future__ import annotations

import argparse
import ipaddress
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import uvicorn
from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from mcp_sandbox import logs, tracing
from mcp_sandbox.app import App
from mcp_sandbox.backends.base import ExecutorHooks, SandboxStartError
from mcp_sandbox.backends.pyodide import PyodideBackend, find_deno, pyodide_version
from mcp_sandbox.backends.registry import BACKENDS
from mcp_sandbox.bridge.config import BridgeConfigError
from mcp_sandbox.checks import Check
from mcp_sandbox.doctor import (
    check_settings,
    claude_desktop_config,
    http_client_config,
    package_location,
    run_checks,
    validation_message,
)
from mcp_sandbox.errors import Refused
from mcp_sandbox.packages import PackageError, fetch_packages
from mcp_sandbox.principals import FirstOf, JwksError, StaticTokens, TokensFileError, TokenTable, Verifier
from mcp_sandbox.result import ExecutionResult
from mcp_sandbox.sandbox import Sandbox
from mcp_sandbox.server import build_server
from mcp_sandbox.settings import Settings
from mcp_sandbox.version import __version__
from mcp_sandbox.web import OneMessagePerPost, RoutingSessionId

logger = logging.getLogger("mcp_sandbox")

Transport = Literal["stdio", "sse", "http"]

#: Exit status of `run` when the program could not be run at all (1 is the program failing).
RUN_IMPOSSIBLE = 2
#: Failures whose message is already a sentence for the user.
EXPECTED_ERRORS = (
    SandboxStartError,
    BridgeConfigError,
    PackageError,
    TokensFileError,
    JwksError,
    Refused,
)

SETTINGS_NOTE = (
    "Every setting can also come from an MCP_SANDBOX_* environment variable or a .env file in the "
    "working directory (see .env.example)."
)


class CliError(Exception):
    """A problem to report as one line on stderr, with an exit status."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _settings_flags(parser: argparse.ArgumentParser) -> CliSettingsSource[Settings]:
    """Every setting as a flag of `parser`; the source reads them back from the parsed arguments."""
    return CliSettingsSource(Settings, root_parser=parser, cli_kebab_case=True, cli_hide_none_type=True)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, CliSettingsSource[Settings]]]:
    parser = argparse.ArgumentParser(
        prog="mcp-sandbox",
        description="An MCP server whose tool execute_python runs Python in a sandbox (Deno + Pyodide by "
        "default). With no command, serves MCP over stdio, which is what Claude Desktop starts.",
        epilog="Start with `mcp-sandbox doctor`: it checks this machine and prints a client config. "
        + SETTINGS_NOTE,
    )
    parser.add_argument("--version", action="version", version=f"mcp-sandbox {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run the MCP server (stdio, streamable HTTP or SSE)",
        description="Run the MCP server: over stdio (the default), streamable HTTP at /mcp, or SSE at /sse. "
        "HTTP and SSE listen on 127.0.0.1 unless told otherwise; set MCP_SANDBOX_AUTH_TOKEN before "
        "binding any other address.",
        epilog=SETTINGS_NOTE,
    )
    serve.add_argument("--transport", choices=["stdio", "sse", "http"], default="stdio", help="default stdio")
    serve.add_argument("--host", default="127.0.0.1", help="address for sse/http (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port for sse/http (default 8000)")
    run = commands.add_parser(
        "run",
        help="run a Python program in the sandbox and print what it prints",
        description="Run a Python program in the sandbox, with the same limits and result as the "
        "execute_python tool: its stdout goes to stdout, its stderr to stderr, the value of its final "
        "expression is printed like a REPL, and on failure the error and traceback go to stderr. "
        "Exit status: 0 when the program succeeded, 1 when it failed (an exception, a timeout, a memory "
        "limit), 2 when it could not be run.",
        epilog=SETTINGS_NOTE,
    )
    run.add_argument("file", metavar="FILE", help="the program, or - to read it from standard input")
    doctor_command = commands.add_parser(
        "doctor",
        help="check this machine and print client configs",
        description="Check what mcp-sandbox needs, one line each with a fix for each problem: Python, "
        "Deno, the Pyodide cache, each backend (started for real, running 1 + 1), user namespaces, the "
        "bridge config and each upstream server in it, the packages folder. Then print a Claude Desktop "
        "config for this installation and a streamable HTTP client config. Exit status 1 when something "
        "the configured backend needs does not work.",
        epilog=SETTINGS_NOTE,
    )
    doctor_command.add_argument(
        "--backend",
        choices=list(BACKENDS),
        help="check only this backend and what it needs, as the configured one; the others are not started",
    )
    fetch = commands.add_parser(
        "fetch",
        aliases=["warmup"],
        help="fetch Pyodide, and Pyodide packages, for offline use",
        description="Fetch Pyodide into the cache, and packages of the Pyodide distribution (the default "
        "set, MCP_SANDBOX_DEFAULT_PACKAGES, or --packages; with their dependencies) into the packages "
        "folder, each checked against its sha256, so sandboxes load them offline.",
        epilog=SETTINGS_NOTE,
    )
    fetch.add_argument(
        "--packages",
        help="comma-separated, e.g. numpy,pandas,matplotlib (default: MCP_SANDBOX_DEFAULT_PACKAGES; "
        "an empty string: none)",
    )
    fetch.add_argument(
        "--index-url",
        help="where to fetch them (default: MCP_SANDBOX_PACKAGE_INDEX_URL, else the Pyodide CDN for this "
        "version)",
    )
    return parser, {"serve": _settings_flags(serve), "run": _settings_flags(run)}


@asynccontextmanager
async def showing_progress(label: str) -> AsyncIterator[None]:
    """A spinner with the seconds so far on a terminal (one line each way in a log), so a first
    download that takes a minute does not look stuck."""
    started = time.monotonic()
    terminal = sys.stderr.isatty()

    async def spin() -> None:
        for frame in itertools.cycle("|/-\\"):
            print(
                f"\r{frame} {label} {time.monotonic() - started:.0f} s ", end="", file=sys.stderr, flush=True
            )
            await anyio.sleep(0.25)

    if not terminal:
        print(f"{label} ...", file=sys.stderr, flush=True)
    async with anyio.create_task_group() as group:
        if terminal:
            group.start_soon(spin)
        try:
            yield
        finally:
            group.cancel_scope.cancel()
            if terminal:
                # Blank the spinner's line, so what follows (done, or the error) replaces it.
                print(f"\r{' ' * (len(label) + 12)}\r", end="", file=sys.stderr, flush=True)
    print(f"{label}: done in {time.monotonic() - started:.1f} s", file=sys.stderr)


async def fetch(settings: Settings, packages: list[str]) -> None:
    deno = find_deno(settings)
    if deno is None:
        raise SandboxStartError(
            "no Deno found, so Pyodide cannot be fetched: install the `deno` package "
            "(pip install deno) or set MCP_SANDBOX_DENO_PATH"
        )
    async with anyio.create_task_group() as group:
        # Only prepare() is used here, which starts no tasks.
        backend = PyodideBackend(settings, ExecutorHooks(tools=None), group, deno)
    async with showing_progress(f"Pyodide {pyodide_version()}: fetching (once) and preparing"):
        await backend.prepare()
    print(f"Pyodide {pyodide_version()} is in {settings.cache_dir}", file=sys.stderr)
    if packages:
        source = backend.package_source()
        print(f"fetching into {source.folder} from {source.index_url}", file=sys.stderr)
        fetched = await anyio.to_thread.run_sync(fetch_packages, source, packages)
        print(f"{len(fetched)} package files fetched", file=sys.stderr)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def token_verifier(settings: Settings) -> Verifier | None:
    """Who a bearer token names: the one MCP_SANDBOX_AUTH_TOKEN (the sole principal), the tokens
    file's principals, and an OAuth issuer's subjects (None: no token is asked for). Raises
    TokensFileError or JwksError when a file cannot be used."""
    verifiers: list[Verifier] = []
    if settings.auth_token is not None or settings.auth_tokens_file is not None:
        table = TokenTable(settings.auth_tokens_file) if settings.auth_tokens_file is not None else None
        single = settings.auth_token.get_secret_value() if settings.auth_token is not None else None
        verifiers.append(StaticTokens(single, table))
    if settings.auth_jwks is not None:
        assert settings.auth_issuer is not None and settings.auth_resource_url is not None  # Settings checks
        # Imported here: PyJWT and cryptography cost a server without OAuth a tenth of its start.
        from mcp_sandbox.oauth import JwtVerifier

        verifiers.append(JwtVerifier(settings.auth_jwks, settings.auth_issuer, settings.auth_resource_url))
    if not verifiers:
        return None
    return verifiers[0] if len(verifiers) == 1 else FirstOf(verifiers)


async def serve(
    settings: Settings, transport: Transport, host: str, port: int, verifier: Verifier | None
) -> None:
    """Serve MCP on `transport`; over HTTP, every request needs a bearer token `verifier` accepts
    (None: no token is asked for)."""
    tracing.configure()
    if transport == "stdio":
        await _serve_stdio(settings)
        return
    async with App(settings) as app:
        server = build_server(app, verifier)
        if transport == "sse":
            logger.info("serving MCP over SSE at http://%s:%d/sse", host, port)
            web_app: Any = server.sse_app(host=host)
        else:
            logger.info("serving MCP over streamable HTTP at http://%s:%d/mcp", host, port)
            web_app = OneMessagePerPost(
                server.streamable_http_app(host=host, stateless_http=settings.stateless_http)
            )
            if settings.stateless_http:
                web_app = RoutingSessionId(web_app)
        # JSON lines: uvicorn's loggers write through the root's handler (else uvicorn's own text).
        log_config = None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG
        config = uvicorn.Config(
            web_app, host=host, port=port, log_level=settings.log_level.lower(), log_config=log_config
        )
        await _WebServer(config).serve()


async def _serve_stdio(settings: Settings) -> None:
    """Serve until stdin ends, or SIGINT or SIGTERM arrives: either way the App closes, as over
    HTTP (sessions that ran since their last checkpoint are saved, sandboxes and folders removed)."""
    stop = anyio.CancelScope()
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_at_first, signals, stop)
            async with App(settings) as app:
                with stop:  # a signal during start-up leaves it cancelled before it is entered
                    await build_server(app).run_stdio()
            group.cancel_scope.cancel()


class _WebServer(uvicorn.Server):
    """Stops serving on SIGINT or SIGTERM and returns, so the App closes: sessions that ran since
    their last checkpoint are saved and their leases given up (uvicorn itself would raise the
    signal again on return, ending the process before that)."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


async def run_program(settings: Settings, code: str) -> int:
    """Run one program as `execute_python` would and print its result like a terminal session.
    Ctrl-C stops it as a cancelled call would, closes its sandbox, and exits 130 quietly."""
    # Handled here until the sandbox is closed: asyncio's own handler cancels the task once, a
    # cancel that a program's stop can absorb, and raises KeyboardInterrupt mid-close at a second.
    with anyio.open_signal_receiver(signal.SIGINT) as ctrl_c:
        async with Sandbox(settings=settings) as sandbox:
            with anyio.CancelScope() as running:
                async with anyio.create_task_group() as group:
                    group.start_soon(_cancel_at_first, ctrl_c, running)
                    result = await sandbox.run(code)
                    group.cancel_scope.cancel()
    if running.cancel_called:  # the program was stopped (its result says Cancelled): nothing to print
        return 130
    print_result(result)
    return 0 if result.success else 1


async def _cancel_at_first(signals: AsyncIterator[signal.Signals], scope: anyio.CancelScope) -> None:
    async for _ in signals:
        scope.cancel()
        return


def print_result(result: ExecutionResult) -> None:
    sys.stdout.write(result.stdout)
    if result.result is not None:
        # A REPL shows the value on a line of its own.
        if result.stdout and not result.stdout.endswith("\n"):
            sys.stdout.write("\n")
        print(result.result)
    sys.stdout.flush()
    sys.stderr.write(result.stderr)
    if not result.success:
        if result.stderr and not result.stderr.endswith("\n"):
            sys.stderr.write("\n")
        error = (result.error or "").rstrip("\n")
        print(
            error if result.error_type and result.error_type in error else f"{result.error_type}: {error}",
            file=sys.stderr,
        )
    for file in result.files:
        copied = (
            f", copied to {file.saved_to}" if file.saved_to else " (set MCP_SANDBOX_OUTPUT_DIR to keep it)"
        )
        print(
            f"mcp-sandbox: the program wrote output/{file.name} ({file.size} bytes){copied}", file=sys.stderr
        )
    if result.truncated:
        print("mcp-sandbox: note: output was cut to MCP_SANDBOX_MAX_OUTPUT_CHARS", file=sys.stderr)
    for note in result.notes:
        print(f"mcp-sandbox: note: {note}", file=sys.stderr)


def read_program(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"no such file: {name}", RUN_IMPOSSIBLE) from None
    except OSError as error:
        raise CliError(f"cannot read {name}: {error.strerror}", RUN_IMPOSSIBLE) from None
    except UnicodeDecodeError:
        raise CliError(f"{name} is not UTF-8 text", RUN_IMPOSSIBLE) from None


async def doctor(overrides: dict[str, Any], only: str | None = None) -> int:
    """Print every check as it completes, then the client configs; 1 when a required check failed.
    `only`: the one backend to check, as if configured."""
    print(f"mcp-sandbox {__version__} at {package_location()}")
    settings_check, settings = check_settings(overrides)
    checks = [settings_check]
    print_check(settings_check)
    if settings is not None:
        if only is not None:
            settings = settings.model_copy(update={"backend": only})
        async for check in run_checks(settings, [only] if only else list(BACKENDS)):
            print_check(check)
            checks.append(check)
    failed = [check.name for check in checks if check.status == "failed"]
    warned = [check.name for check in checks if check.status == "warning"]
    print()
    print("Claude Desktop: add this to claude_desktop_config.json")
    print(json.dumps(claude_desktop_config(), indent=2))
    print()
    if settings is not None:
        print("Streamable HTTP: run `mcp-sandbox serve --transport http`, then give your client")
        print(json.dumps(http_client_config(settings), indent=2))
        print()
    if failed:
        print(f"FAILED: {', '.join(failed)}; see the fix under each.")
        return 1
    print("Ready" + (f", with warnings: {', '.join(warned)}." if warned else "."))
    return 0


def print_check(check: Check) -> None:
    mark = {"ok": "✓", "warning": "!", "failed": "✗"}[check.status]
    try:
        mark.encode(sys.stdout.encoding or "ascii")
    except (UnicodeEncodeError, LookupError):
        mark = {"ok": "ok  ", "warning": "WARN", "failed": "FAIL"}[check.status]
    print(f"{mark} {check.name:<20} {check.detail}")
    if check.fix and check.status != "ok":
        print(f"  {'':<20} fix: {check.fix}")


def _settings(args: argparse.Namespace, flags: CliSettingsSource[Settings] | None) -> Settings:
    """The settings: flags (for serve and run), then MCP_SANDBOX_* variables and .env."""
    if getattr(args, "auth_token", None) is not None:
        raise CliError("set the token in MCP_SANDBOX_AUTH_TOKEN, not on the command line (it shows in ps)")
    try:
        if flags is None:
            return Settings()
        settings = Settings(_cli_settings_source=flags(parsed_args=args))
    except ValidationError as error:
        raise CliError(f"invalid setting: {validation_message(error)}", RUN_IMPOSSIBLE) from None
    if args.command == "run":
        # One program: one sandbox, started when it is needed, and no other kept ready; no
        # packages fetched in the background either: the program ends long before a download.
        update: dict[str, Any] = {"pool_size": 0, "default_packages": ""}
        if getattr(args, "timeout", None) is not None:
            update["max_timeout"] = max(settings.max_timeout, settings.timeout)
        settings = settings.model_copy(update=update)
    return settings


def _configure_logging(settings: Settings, command: str) -> None:
    # The server logs what it does; the other commands print their own, and say only what is wrong.
    quiet = {"serve": "INFO", "doctor": "CRITICAL"}.get(command, "WARNING")
    level = settings.log_level if "log_level" in settings.model_fields_set else quiet
    layout = (
        "%(asctime)s %(levelname)s %(name)s: %(message)s"
        if command == "serve"
        else ("mcp-sandbox: %(levelname)s: %(message)s")
    )
    logs.configure(level, layout, json_lines=command == "serve" and settings.log_format == "json")


def _dispatch(args: argparse.Namespace, flags: dict[str, CliSettingsSource[Settings]]) -> int:
    command: str = {"warmup": "fetch", None: "serve"}.get(args.command, args.command)
    if command == "doctor":
        logging.basicConfig(level=logging.CRITICAL, stream=sys.stderr)
        return anyio.run(doctor, {}, args.backend)
    if command == "run":
        code = read_program(args.file)
    settings = _settings(args, flags.get(command) if args.command else None)
    _configure_logging(settings, command)
    if command == "run":
        return anyio.run(run_program, settings, code)
    if command == "fetch":
        update: dict[str, Any] = {}
        if args.packages is not None:
            update["default_packages"] = args.packages
        if args.index_url is not None:
            update["package_index_url"] = args.index_url
        try:
            # Through the model, so the flags are checked as the variables are.
            settings = Settings.model_validate({**settings.model_dump(exclude_unset=True), **update})
        except ValidationError as error:
            raise CliError(f"invalid setting: {validation_message(error)}") from None
        anyio.run(fetch, settings, settings.default_package_names)
        return 0
    transport: Transport = getattr(args, "transport", "stdio")
    host: str = getattr(args, "host", "127.0.0.1")
    port: int = getattr(args, "port", 8000)
    # Read here, before anything starts: a tokens file that cannot be used is refused at once.
    verifier = token_verifier(settings) if transport != "stdio" else None
    if transport != "stdio" and not _is_loopback(host) and verifier is None:
        logger.warning(
            "LISTENING ON %s WITHOUT A TOKEN: anyone who can reach this address can run code here. "
            "Set MCP_SANDBOX_AUTH_TOKEN to require Authorization: Bearer <token>.",
            host,
        )
    anyio.run(serve, settings, transport, host, port, verifier)
    return 0


def _innermost(error: BaseException) -> BaseException:
    """The one error inside task-group wrappers, which say nothing to a user."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error


def main(argv: list[str] | None = None) -> None:
    parser, flags = _parser()
    args = parser.parse_args(argv)
    try:
        status = _dispatch(args, flags)
    except KeyboardInterrupt:
        status = 130
    except BaseException as raised:  # every failure ends as one line, never a traceback
        error = _innermost(raised)
        if isinstance(error, KeyboardInterrupt):
            status = 130
        elif isinstance(error, SystemExit):
            raise error from None
        elif isinstance(error, CliError):
            status = _fail(str(error), error.status)
        elif isinstance(error, EXPECTED_ERRORS):
            status = _fail(str(error), RUN_IMPOSSIBLE if args.command == "run" else 1)
        elif isinstance(error, BrokenPipeError):
            # The reader went away (`mcp-sandbox run x.py | head`); nothing left to say.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            status = 1
        else:
            logger.debug("unexpected error", exc_info=error)
            status = _fail(
                f"unexpected error: {type(error).__name__}: {error} (MCP_SANDBOX_LOG_LEVEL=DEBUG: where)",
                1,
            )
    if status == 130 or args.command == "run":
        _exit_now(status)
    sys.exit(status)


def _exit_now(status: int) -> None:
    """Exit once the output is out: the App has closed its sandboxes by now, and the interpreter's
    teardown of every module it imported (1.7 s of CPU here, several times that under load) serves
    nobody, least of all a person who pressed Ctrl-C."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # the reader went away, or the stream is closed: nothing more can be said
    logging.shutdown()
    os._exit(status)


def _fail(message: str, status: int) -> int:
    print(f"mcp-sandbox: {message}", file=sys.stderr)
    return status
