"""The red team's harness: hostile programs sent through a real MCP client to a real server, on every backend.

Each `Attack` is a small program and a host-side check that proves it failed: a file under a
pytest tmp dir that must not appear or change, a listener on 127.0.0.1 that must see nobody,
the host secret that must not come back, a forged result that must not be believed. After every
attack the server must still answer `'alive'`. `expected` says, per backend, what docs/security.md
promises: `Blocked`, `Contained` (a given error_type, and the server keeps serving),
`NotProtected` (documented: run it and assert that it works, so the docs stay true) or
`Skip` (not run: unsafe where it is not contained, or meaningless there).

The attacks are in tables by category, one test module each (tests/security/test_*.py); the
servers they run against are tests/security/conftest.py's fixtures.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.abc
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp_sandbox.backends.subprocess.confine import landlock_abi
from mcp_sandbox.backends.subprocess.isolation import python_readable_by_anyone
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import DirectoryStore, SavedState
from tests.helpers import TEST_ENV, free_port, state_file

REPO = Path(__file__).resolve().parents[2]
SECRET = TEST_ENV["MCP_SANDBOX_TEST_SECRET"]
MAX_OUTPUT_CHARS = 32_768
MAX_CODE_CHARS = 200_000
CANARY_TEXT = "canary-original-contents"
VICTIM_TEXT = "victim-original-contents"
OUTSIDE_TEXT = "outside-the-data-folder-secret"
MODULE_TEXT = "module-outside-the-sandbox"
FORGED = "'FORGED'"
TOUCH = shutil.which("touch") or "/usr/bin/touch"
HOSTNAME = socket.gethostname()
OS_RELEASE = os.uname().release
IS_ROOT = os.getuid() == 0
SSH_KEY_TEXT = "-----BEGIN OPENSSH PRIVATE KEY----- red-team-fake-key"
#: The host's own /etc/shadow (its first line), where this test can read it.
SHADOW_LINE = Path("/etc/shadow").read_text().splitlines()[0] if os.access("/etc/shadow", os.R_OK) else ""
#: Files every Pyodide sandbox loads: writing one would taint every later sandbox.
POISON_TARGETS = [
    REPO / "mcp_sandbox" / "backends" / "pyodide" / "runner.ts",
    REPO / "mcp_sandbox" / "backends" / "pyodide" / "worker.ts",
    REPO / "mcp_sandbox" / "backends" / "pyodide" / "protocol.ts",
    *sorted((Path.home() / ".cache" / "mcp-sandbox" / "deno" / "npm").glob("*/pyodide/*/pyodide.asm.js"))[:1],
]

BACKENDS = ("pyodide", "subprocess", "subprocess-landlock", "subprocess-none", "inprocess")
#: How each column's server is started: the subprocess backend at each isolation tier.
SERVER_SETTINGS = {
    # V8's optimizing tier as shipped (TEST_ENV turns it off elsewhere): attacks meet the code users run.
    "pyodide": {"MCP_SANDBOX_BACKEND": "pyodide", "MCP_SANDBOX_PYODIDE_TIER_UP": "true"},
    "subprocess": {"MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_ISOLATION": "bubblewrap"},
    "subprocess-landlock": {"MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_ISOLATION": "landlock"},
    "subprocess-none": {"MCP_SANDBOX_BACKEND": "subprocess", "MCP_SANDBOX_ISOLATION": "none"},
    "inprocess": {"MCP_SANDBOX_BACKEND": "inprocess"},
}
MEMORY_ERRORS = frozenset({"MemoryLimit", "MemoryError", "SandboxCrash"})
#: Inside another session's saved state; must never reach a sandbox.
STATE_MARKER = "saved-state-of-another-session"
#: MCP_SANDBOX_MAX_STATE_MB of the red team's servers.
STATE_CAP_MB = 16


# --- outcomes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blocked:
    """The attack fails: its host check holds and the server keeps serving."""


@dataclass(frozen=True)
class Contained:
    """The call ends with one of `error_types`, the host check holds, the server keeps serving."""

    error_types: frozenset[str]


@dataclass(frozen=True)
class NotProtected:
    """Documented as not protected: run it and assert that it gets through."""

    why: str


@dataclass(frozen=True)
class Skip:
    """Not run: unsafe where it is not contained, or meaningless on that backend."""

    why: str


@dataclass(frozen=True)
class IfIsolated:
    """`isolated` where the server says its workers have no network (unshare works), else `shared`."""

    isolated: Outcome
    shared: Outcome


@dataclass(frozen=True)
class ByWorkerUid:
    """Isolation none, where the outcome turns on the worker's uid: `server`, the server's own
    (not root); as root, a uid of its own (MCP_SANDBOX_WORKER_UIDS): `own`, or `own_reading`
    when it keeps CAP_DAC_READ_SEARCH to load a Python other users cannot read."""

    server: Outcome
    own: Outcome
    own_reading: Outcome

    def pick(self, backend: str) -> Outcome:
        if not IS_ROOT:
            return self.server
        return self.own if python_readable_by_anyone() else self.own_reading


Outcome = Blocked | Contained | NotProtected | Skip | IfIsolated | ByWorkerUid
BLOCKED = Blocked()


def contained(*error_types: str) -> Contained:
    return Contained(frozenset(error_types))


CRASH = contained("SandboxCrash")
TIMEOUT = contained("Timeout")
MEMORY = Contained(MEMORY_ERRORS)
JS_ONLY = Skip("pyodide only: JavaScript and Deno exist only there")
SUBPROCESS_ONLY = Skip("rlimits are the subprocess backend's mechanism; pyodide and inprocess have none")
README_SUBPROCESS = "docs/security.md table: on subprocess, host files and programs are not protected"
README_INPROCESS = "docs/security.md table: inprocess isolates nothing (trusted code only)"
SUBPROCESS_SHARES = NotProtected(README_SUBPROCESS)
INPROCESS_SHARES = NotProtected(README_INPROCESS)
SUBPROCESS_NETWORK = IfIsolated(
    isolated=BLOCKED,
    shared=NotProtected("docs/security.md table: subprocess network is not protected without unshare"),
)
INPROCESS_UNSAFE = Skip(f"{README_INPROCESS}; running it would harm the test server itself")
README_NONE = "docs/security.md table: with isolation none a worker shares what its uid can reach"
#: With isolation none: host files and processes are as safe as the worker's uid makes them.
READS_DECIDE = ByWorkerUid(
    server=NotProtected(README_NONE), own=BLOCKED, own_reading=NotProtected(README_NONE)
)
WRITES_DECIDE = ByWorkerUid(server=NotProtected(README_NONE), own=BLOCKED, own_reading=BLOCKED)
#: Landlock ABI 6 keeps signals inside the sandbox; before it, only the worker's uid does.
LANDLOCK_SCOPES_SIGNALS = landlock_abi() >= 6


def program(text: str) -> str:
    """An attack's source, written indented in this file."""
    return textwrap.dedent(text).strip("\n")


def on(
    *,
    pyodide: Outcome,
    subprocess: Outcome,
    inprocess: Outcome,
    landlock: Outcome | None = None,
    unconfined: Outcome | None = None,
) -> dict[str, Outcome]:
    """`subprocess` is the bubblewrap tier's outcome, and the other tiers' unless given:
    `landlock` (Landlock + seccomp) and `unconfined` (isolation none)."""
    return {
        "pyodide": pyodide,
        "subprocess": subprocess,
        "subprocess-landlock": landlock if landlock is not None else subprocess,
        "subprocess-none": unconfined if unconfined is not None else subprocess,
        "inprocess": inprocess,
    }


def everywhere(outcome: Outcome) -> dict[str, Outcome]:
    return dict.fromkeys(BACKENDS, outcome)


def pyodide_only(outcome: Outcome = BLOCKED) -> dict[str, Outcome]:
    return on(pyodide=outcome, subprocess=JS_ONLY, inprocess=JS_ONLY)


#: A system call the seccomp filter refuses (bubblewrap and landlock); isolation none has none.
SECCOMP_REFUSES = on(
    pyodide=BLOCKED,
    subprocess=BLOCKED,
    unconfined=Skip("isolation none filters no system calls (docs/security.md)"),
    inprocess=Skip(f"{README_INPROCESS}: it would be the server's own"),
)


# --- the host's side of one attack ------------------------------------------------------------


@dataclass(frozen=True)
class World:
    """Host folders the server is started with (one server per backend shares them)."""

    data: Path
    output: Path
    #: The server's HOME, with an SSH key in it.
    home: Path
    #: MCP_SANDBOX_STATE_DIR, holding another session's saved state ("victim").
    state: Path
    victim_state: bytes


def victim_state_path(world: World) -> Path:
    return state_file(world.state, "victim")


@dataclass
class Reply:
    is_error: bool
    text: str
    result: dict[str, Any] | None

    def get(self, name: str) -> Any:
        return None if self.result is None else self.result.get(name)

    def dump(self) -> str:
        return json.dumps(self.result) if self.result is not None else self.text

    def summary(self) -> str:
        return self.dump()[:1500]


@dataclass
class Host:
    client: Client
    world: World
    tmp: Path
    session: str | None
    port: int
    udp_port: int
    closed_port: int
    connections: list[str] = field(default_factory=list)
    datagrams: list[bytes] = field(default_factory=list)
    victims: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def victim(self) -> subprocess.Popen[bytes]:
        """A host process of the server's user that sandboxed code should neither see nor signal."""
        if not self.victims:
            self.victims.append(subprocess.Popen(["sleep", "60"]))
        return self.victims[0]

    @property
    def canary(self) -> Path:
        return self.tmp / "canary.txt"

    def render(self, code: str) -> str:
        tokens = {
            "@TMP@": str(self.tmp),
            "@CANARY@": str(self.canary),
            "@PORT@": str(self.port),
            "@UDP_PORT@": str(self.udp_port),
            "@CLOSED_PORT@": str(self.closed_port),
            "@DATA@": str(self.world.data),
            "@HOME@": str(self.world.home),
            "@STATE@": str(self.world.state),
            "@VICTIM_PID@": str(self.victim().pid) if "@VICTIM_PID@" in code else "",
            "@TOUCH@": TOUCH,
            "@POISON@": repr([str(path) for path in POISON_TARGETS]),
        }
        for token, value in tokens.items():
            code = code.replace(token, value)
        return code


Check = Callable[[Host, Reply], Awaitable[str | None]]


async def send(client: Client, code: str, session: str | None, timeout: float | None = 5) -> Reply:
    arguments: dict[str, Any] = {"code": code}
    if timeout is not None:
        arguments["timeout"] = timeout
    if session is not None:
        arguments["session_id"] = session
    # The tool's own timeout bounds the program; this bounds a server that stops answering.
    with anyio.fail_after((timeout or 30) + 45):
        response = await client.call_tool("execute_python", arguments)
    text = "".join(getattr(block, "text", "") for block in response.content)
    return Reply(bool(response.is_error), text, response.structured_content)


@asynccontextmanager
async def attack_host(client: Client, world: World, tmp: Path, session: str | None) -> AsyncIterator[Host]:
    (tmp / "canary.txt").write_text(CANARY_TEXT)
    (tmp / "secret.mjs").write_text(f"export const s = {MODULE_TEXT!r};\n")
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    udp = await anyio.create_udp_socket(local_host="127.0.0.1")
    # A host service on a Unix socket, as docker.sock or a database would be.
    unix = await anyio.create_unix_listener(tmp / "service.sock")
    host = Host(
        client,
        world,
        tmp,
        session,
        port=listener.extra(anyio.abc.SocketAttribute.local_port),
        udp_port=udp.extra(anyio.abc.SocketAttribute.local_port),
        closed_port=free_port(),
    )

    async def note(stream: anyio.abc.SocketStream | anyio.abc.UNIXSocketStream) -> None:
        host.connections.append("connected")
        await stream.aclose()

    async def receive() -> None:
        async for datagram, _ in udp:
            host.datagrams.append(datagram)

    async with listener, udp, unix, anyio.create_task_group() as group:
        group.start_soon(listener.serve, note)
        group.start_soon(unix.serve, note)
        group.start_soon(receive)
        try:
            yield host
        finally:
            group.cancel_scope.cancel()
            for victim in host.victims:
                victim.kill()
                victim.wait()


# --- a server's log, for tests that wait on what the server did ------------------------------


class ServerLog:
    """A server's stderr (its log), read line by line as it comes, so that a test waits for the
    line saying something happened instead of sleeping and hoping it has (`logged_server`)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._grew = anyio.Event()

    async def read(self, fd: int) -> None:
        """Read the pipe `fd` until it ends or the task is cancelled."""
        os.set_blocking(fd, False)
        pending = b""
        while True:
            await anyio.wait_readable(fd)
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return
            *lines, pending = (pending + chunk).split(b"\n")
            if lines:
                self.lines.extend(line.decode(errors="replace") for line in lines)
                self._grew.set()
                self._grew = anyio.Event()

    async def find(self, pattern: str, start: int = 0, timeout: float = 60) -> tuple[int, re.Match[str]]:
        """The first line from index `start` on that matches `pattern`, waiting at most `timeout`
        seconds for the server to write it: its index and the match."""
        regex = re.compile(pattern)
        index = start
        with anyio.move_on_after(timeout):
            while True:
                while index < len(self.lines):
                    if (match := regex.search(self.lines[index])) is not None:
                        return index, match
                    index += 1
                await self._grew.wait()
        tail = "\n".join(self.lines[-20:])
        raise AssertionError(
            f"the server logged no line matching {pattern!r} in {timeout:g} s; its last:\n{tail}"
        )


@asynccontextmanager
async def logged_server(params: StdioServerParameters) -> AsyncIterator[tuple[Client, ServerLog]]:
    """The server `params` start, reached through a real MCP client, with its log read as it comes."""
    log = ServerLog()
    read_end, write_end = os.pipe()
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(log.read, read_end)
            with os.fdopen(write_end, "w") as errlog:
                async with Client(stdio_client(params, errlog=errlog)) as client:
                    yield client, log
            group.cancel_scope.cancel()
    finally:
        os.close(read_end)


# --- checks: each returns how the attack got through, or None ---------------------------------


Where = TypeVar("Where")


def all_of(
    *checks: Callable[[Where, Reply], Awaitable[str | None]],
) -> Callable[[Where, Reply], Awaitable[str | None]]:
    """The checks one after another, on a host or on a pair (test_cohosting.py): the first breach."""

    async def check(where: Where, reply: Reply) -> str | None:
        for each in checks:
            if (breach := await each(where, reply)) is not None:
                return breach
        return None

    return check


def no_file(name: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        return f"{name} appeared on the host" if (host.tmp / name).exists() else None

    return check


async def canary_intact(host: Host, reply: Reply) -> str | None:
    if not host.canary.exists():
        return "the canary file was removed or moved"
    if host.canary.read_text() != CANARY_TEXT:
        return "the canary file was changed"
    return None


def not_shown(*markers: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        found = [marker for marker in markers if marker and marker in reply.dump()]
        return f"the output shows {found}" if found else None

    return check


async def no_connection(host: Host, reply: Reply) -> str | None:
    await anyio.sleep(0.2)  # a connection made at the very end still gets counted
    return f"the host listener saw {host.connections}" if host.connections else None


async def no_datagram(host: Host, reply: Reply) -> str | None:
    await anyio.sleep(0.2)
    return f"the host UDP socket got {host.datagrams}" if host.datagrams else None


async def port_closed(host: Host, reply: Reply) -> str | None:
    try:
        stream = await anyio.connect_tcp("127.0.0.1", host.closed_port)
    except OSError:
        return None
    await stream.aclose()
    return f"the sandbox listens on host port {host.closed_port}"


async def failed(host: Host, reply: Reply) -> str | None:
    return f"the call succeeded: {reply.get('result')}" if reply.get("success") else None


def result_is(expected: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        got = reply.get("result")
        return None if got == expected else f"the result was {got!r}, not {expected!r}"

    return check


def result_lacks(word: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        got = str(reply.get("result"))
        return f"the result {got!r} contains {word!r}" if word in got else None

    return check


def result_lacks_any(*words: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        got = str(reply.get("result"))
        found = [word for word in words if word in got]
        return f"the result {got!r} shows {found}" if found else None

    return check


def read_nothing(host: Host, reply: Reply) -> Awaitable[str | None]:
    """Each way of reading stdin (the attack's list) failed with an error, or read nothing."""

    async def check() -> str | None:
        if reply.get("error_type") is not None:
            return f"reading stdin did not fail at once: {reply.summary()}"
        attempts = ast.literal_eval(str(reply.get("result")))
        read = [got for got in attempts if got not in ("''", "b''") and not re.fullmatch(r"[A-Z]\w*", got)]
        return f"stdin gave {read}" if read else None

    return check()


def error_is(*error_types: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        got = reply.get("error_type")
        return None if got in error_types else f"error_type was {got!r}; reply: {reply.summary()}"

    return check


async def session_kept(host: Host, reply: Reply) -> str | None:
    return "the session was lost" if reply.get("session_lost") else None


async def clean_reply(host: Host, reply: Reply) -> str | None:
    """The program's own output must not turn its result into an opaque tool error."""
    return (
        f"the tool call failed instead of returning a result: {reply.text[:300]}" if reply.is_error else None
    )


def tool_error(fragment: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        if reply.is_error and fragment in reply.text:
            return None
        return f"expected a tool error mentioning {fragment!r}, got {reply.summary()}"

    return check


def capped(name: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        value = str(reply.get(name) or "")
        if len(value) > MAX_OUTPUT_CHARS + 200:
            return f"{name} came back with {len(value):,} characters"
        return None if reply.get("truncated") else f"{name} was not marked truncated"

    return check


def size_at_most(name: str, limit: int) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        path = host.tmp / name
        size = path.stat().st_size if path.exists() else 0
        return f"{name} reached {size:,} bytes on the host" if size > limit else None

    return check


def count_below(limit: int) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        got = str(reply.get("result"))
        return None if got.isdigit() and int(got) < limit else f"the program got {got} of {limit}"

    return check


async def not_true(host: Host, reply: Reply) -> str | None:
    return "the program saw it" if reply.get("result") == "True" else None


async def state_files_untouched(host: Host, reply: Reply) -> str | None:
    sessions = host.world.state / "sessions"
    if (sessions / "x.state").exists():
        return "a file was planted among the saved sessions"
    if victim_state_path(host.world).read_bytes() != host.world.victim_state:
        return "another session's saved state was overwritten"
    if (host.world.state / "leases" / f"{victim_state_path(host.world).stem}.lease").exists():
        return "a lease was planted on another session"
    return None


async def state_store_capped(host: Host, reply: Reply) -> str | None:
    """The checkpoint over the cap is refused whole: nothing partial on disk, and the session's
    next result says why."""
    if not reply.get("success"):
        return f"the filler itself failed: {reply.summary()}"
    # The checkpoint is tried 2 s into idle time, and on a loaded machine may still be running when
    # a call comes: each call that finds no note yet gives it another try, until one says it.
    after = reply
    with anyio.move_on_after(90):
        while not any("MCP_SANDBOX_MAX_STATE_MB" in note for note in after.get("notes") or []):
            await anyio.sleep(3)
            after = await send(host.client, "len(filler)", host.session)
    sessions = host.world.state / "sessions"
    partial = [path.name for path in sessions.iterdir() if path.name.endswith(".part")]
    if partial:
        return f"partial state files were left: {partial}"
    largest = max((path.stat().st_size for path in sessions.glob("*.state")), default=0)
    if largest > STATE_CAP_MB * 2**20:
        return f"a state file of {largest} bytes passed the {STATE_CAP_MB} MB cap"
    if not any("MCP_SANDBOX_MAX_STATE_MB" in note for note in after.get("notes") or []):
        return f"the session was not told its state is over the cap: {after.summary()}"
    return None


async def no_poison_in_environment(host: Host, reply: Reply) -> str | None:
    return await no_host_path(Path(sysconfig.get_path("purelib")) / f"rt-poison-{host.port}.pth")(host, reply)


async def victim_limits_intact(host: Host, reply: Reply) -> str | None:
    limits = Path(f"/proc/{host.victim().pid}/limits").read_text()
    line = next(line for line in limits.splitlines() if line.startswith("Max open files"))
    return f"a host process's limits were changed: {line}" if line.split()[3] == "3" else None


async def victim_alive(host: Host, reply: Reply) -> str | None:
    victim = host.victim()
    if reply.get("success"):
        # The signal went out: on a busy machine the victim takes a moment to end.
        with anyio.move_on_after(10):
            while victim.poll() is None:
                await anyio.sleep(0.05)
    return None if victim.poll() is None else "a host process was killed from the sandbox"


def no_host_path(path: Path) -> Check:
    """`path` (which the attack tries to create) is not on the host; removed if it is."""

    async def check(host: Host, reply: Reply) -> str | None:
        if not path.exists():
            return None
        path.unlink()
        return f"{path} was written on the host"

    return check


def data_intact(name: str, original: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        path = host.world.data / name
        now = path.read_text() if path.exists() else None
        if now == original:
            return None
        path.write_text(original)  # put it back for the next backend's server
        return f"data/{name} changed on the host to {now!r}"

    return check


async def runner_files_unchanged(host: Host, reply: Reply) -> str | None:
    if reply.get("result") != "[]":
        return f"the sandbox could append to {reply.get('result')}"
    return None


async def session_sid_apart(host: Host, reply: Reply) -> str | None:
    """The sandbox process must not share the server's session (so group signals miss the server)."""
    try:
        pid, parent = (int(part) for part in str(reply.get("result")).strip("()").split(","))
        return "the sandbox shares the server's session" if os.getsid(pid) == os.getsid(parent) else None
    except (ValueError, ProcessLookupError) as error:
        pytest.fail(f"could not compare sessions: {error}; reply: {reply.summary()}")


def outside_output_absent(name: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        escaped = host.world.output.parent / name
        if not escaped.exists():
            return None
        escaped.unlink()
        return f"{escaped} was written outside MCP_SANDBOX_OUTPUT_DIR"

    return check


@dataclass(frozen=True)
class NotSeenElsewhere:
    """`probe` run in another session (and, with `sessionless`, without a session) must give
    `clean`. `refusal_blocks`: a PermissionError in the tainting call means the taint was refused.
    A class, not a closure, so tests/security/test_recycling.py reuses each taint's probe."""

    probe: str
    clean: str
    sessionless: bool = False
    refusal_blocks: bool = False

    async def __call__(self, host: Host, reply: Reply) -> str | None:
        if self.refusal_blocks and reply.get("error_type") == "PermissionError":
            return None
        if reply.get("success") is not True:
            pytest.fail(f"the tainting call itself failed, so it proves nothing: {reply.summary()}")
        places: list[str | None] = ["observer"] + ([None] if self.sessionless else [])
        for session in places:
            seen = await send(host.client, host.render(self.probe), session)
            if seen.get("result") != self.clean:
                return f"session {session or '(none)'} saw the taint: {seen.summary()}"
        return None


not_seen_elsewhere = NotSeenElsewhere


def gone_after_reset(probe: str, clean: str) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        assert host.session is not None
        await host.client.call_tool("reset_session", {"session_id": host.session})
        seen = await send(host.client, probe, host.session)
        return None if seen.get("result") == clean else f"the reset session kept it: {seen.summary()}"

    return check


async def next_call_genuine(host: Host, reply: Reply) -> str | None:
    assert host.session is not None
    if reply.get("result") != "'first'":
        pytest.fail(f"the forging call itself failed, so it proves nothing: {reply.summary()}")
    # The sleep gives a forgery sent from a timer time to arrive before the genuine result.
    second = await send(host.client, "import time\ntime.sleep(0.5)\n'second'", host.session)
    await host.client.call_tool("reset_session", {"session_id": host.session})
    return (
        f"the next call's result was forged: {second.get('result')}"
        if second.get("result") == FORGED
        else None
    )


NO_SECRET = not_shown(SECRET)
NO_CANARY = not_shown(CANARY_TEXT)


# --- the attacks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attack:
    name: str
    code: str
    check: Check
    expected: dict[str, Outcome]
    #: "shared" for attacks that leave the sandbox usable; crashers use "crash", whose next call starts fresh.
    session: str | None = "shared"
    timeout: float | None = 5
    #: Run in the same session after the check, to undo what the attack may have done.
    cleanup: str | None = None


# --- running one attack -----------------------------------------------------------------------


def server_settings(backend: str, world: World) -> dict[str, str]:
    """The environment of the red team's server for `backend` (one per backend, shared by every table)."""
    return {
        **SERVER_SETTINGS[backend],
        "MCP_SANDBOX_DATA_DIR": str(world.data),
        "MCP_SANDBOX_OUTPUT_DIR": str(world.output),
        "HOME": str(world.home),
        "MCP_SANDBOX_STATE_DIR": str(world.state),
        "MCP_SANDBOX_MAX_STATE_MB": str(STATE_CAP_MB),
        "MCP_SANDBOX_CACHE_DIR": str(Settings().cache_dir),  # Deno and Pyodide stay where they were fetched
    }


def make_world(root: Path) -> World:
    """The host folders of the red team's servers, under `root`."""
    data, outside, output = root / "data", root / "outside", root / "output-root" / "out"
    for folder in (data, outside, output):
        folder.mkdir(parents=True)
    (data / "public.txt").write_text("public\n")
    (data / "victim.txt").write_text(VICTIM_TEXT)
    (outside / "secret.txt").write_text(OUTSIDE_TEXT)
    # An operator's link inside the data folder: the sandbox must not follow it out.
    (data / "link.txt").symlink_to(outside / "secret.txt")
    # The server's HOME, as a developer's would be: a private key in ~/.ssh.
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    (home / ".ssh" / "id_ed25519").write_text(SSH_KEY_TEXT)
    (home / ".ssh" / "id_ed25519").chmod(0o600)
    # Another session's saved state, as the server writes it (0600 in a 0700 folder).
    state = root / "state"
    store = DirectoryStore(state, max_session_bytes=STATE_CAP_MB * 2**20, max_total_bytes=2**30)
    anyio.run(store.save, "victim", SavedState("pyodide", "planted", STATE_MARKER.encode() * 64, call=1))
    world = World(data=data, output=output, home=home, state=state, victim_state=b"")
    return dataclasses.replace(world, victim_state=victim_state_path(world).read_bytes())


@functools.cache
def tier_missing(backend: str) -> str | None:
    """Why the server cannot start `backend` here (a forced isolation tier it lacks), or None."""
    if not backend.startswith("subprocess"):
        return None
    done = subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", "run", "-"],
        input="1",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **SERVER_SETTINGS[backend]},
        check=False,
    )
    return None if done.returncode == 0 else done.stderr.strip()[-300:]


async def workers_have_no_network(client: Client) -> bool:
    """What the server says in the tool description (subprocess: where unshare works)."""
    tools = {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}
    return "no network" in tools["execute_python"] or "no IP network" in tools["execute_python"]


async def assert_alive(client: Client) -> None:
    reply = await send(client, "'alive'", "alive-probe", timeout=10)
    assert reply.get("result") == "'alive'", f"the server stopped serving: {reply.summary()}"


async def run_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    """Send `attack` to `backend`'s server and hold the outcome to what `attack.expected` says."""
    expected = attack.expected[backend]
    if isinstance(expected, IfIsolated):
        expected = expected.isolated if await workers_have_no_network(client) else expected.shared
    if isinstance(expected, ByWorkerUid):
        expected = expected.pick(backend)
    if isinstance(expected, Skip):
        pytest.skip(expected.why)
    # Every backend's server shares the world's state folder: a session name of its own keeps one
    # backend's saved session from being another's (a state of another build is a lost session).
    session = f"{attack.session}-{backend}" if attack.session is not None else None
    async with attack_host(client, world, tmp_path, session) as host:
        reply = await send(client, host.render(attack.code), session, attack.timeout)
        breach = await attack.check(host, reply)
        if attack.cleanup is not None:
            await send(client, host.render(attack.cleanup), session)
    if isinstance(expected, NotProtected):
        assert breach is not None, (
            f"{attack.name} failed on {backend}, but docs/security.md says it is not protected "
            f"({expected.why}); update docs/security.md and the README's summary. Reply: {reply.summary()}"
        )
    else:
        assert breach is None, f"{attack.name} got through on {backend}: {breach}\nreply: {reply.summary()}"
        assert SECRET not in reply.dump(), f"the host secret came back: {reply.summary()}"
        if isinstance(expected, Contained):
            assert reply.get("error_type") in expected.error_types, (
                f"{attack.name}: expected {sorted(expected.error_types)}, got {reply.summary()}"
            )
    await assert_alive(client)


def attack_ids(attacks: list[Attack]) -> list[str]:
    return [attack.name for attack in attacks]
