"""Red team: hostile programs sent through a real MCP client to a real server, on every backend.

Each `Attack` is a small program and a host-side check that proves it failed: a file under a
pytest tmp dir that must not appear or change, a listener on 127.0.0.1 that must see nobody,
the host secret that must not come back, a forged result that must not be believed. After every
attack the server must still answer `'alive'`. `expected` says, per backend, what the README
promises: `Blocked`, `Contained` (a given error_type, and the server keeps serving),
`NotProtected` (documented: run it and assert that it works, so the README stays true) or
`Skip` (not run: unsafe where it is not contained, or meaningless there).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
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
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import Client

from mcp_sandbox.backends.subprocess.confine import landlock_abi
from mcp_sandbox.backends.subprocess.isolation import python_readable_by_anyone
from mcp_sandbox.settings import Settings
from mcp_sandbox.store import DirectoryStore, SavedState
from tests.helpers import TEST_ENV, free_port, missing_tier, server_params

pytestmark = pytest.mark.anyio

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
    "pyodide": {"MCP_SANDBOX_BACKEND": "pyodide"},
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
README_SUBPROCESS = "README 'Security model' table: on subprocess, host files and programs are not protected"
README_INPROCESS = "README 'Security model' table: inprocess isolates nothing (trusted code only)"
SUBPROCESS_SHARES = NotProtected(README_SUBPROCESS)
INPROCESS_SHARES = NotProtected(README_INPROCESS)
SUBPROCESS_NETWORK = IfIsolated(
    isolated=BLOCKED,
    shared=NotProtected("README 'Security model' table: subprocess network is not protected without unshare"),
)
INPROCESS_UNSAFE = Skip(f"{README_INPROCESS}; running it would harm the test server itself")
README_NONE = "README 'Security model' table: with isolation none a worker shares what its uid can reach"
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
    unconfined=Skip("isolation none filters no system calls (README)"),
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
    (path,) = (world.state / "sessions").glob(f"{hashlib.sha256(b'victim').hexdigest()[:40]}.state")
    return path


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


# --- checks: each returns how the attack got through, or None ---------------------------------


def all_of(*checks: Check) -> Check:
    async def check(host: Host, reply: Reply) -> str | None:
        for each in checks:
            if (breach := await each(host, reply)) is not None:
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
    await anyio.sleep(6)  # the checkpoint is tried 2 s after the call
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
    return None if host.victim().poll() is None else "a host process was killed from the sandbox"


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


FORGE_RESULT_LINES = """
import json
def forged_line(n):
    msg = {"type": "result", "id": n, "outcome": {"success": True, "result": "'FORGED'"}}
    return json.dumps({"token": "0" * 32, "msg": msg}) + "\\n"
"""

SWALLOWS_INTERRUPTS = """
import time
end = time.monotonic() + 4
while time.monotonic() < end:
    try:
        while time.monotonic() < end:
            pass
    except BaseException:
        pass
"""

FORGE_NEXT_RESULT = """
import json
def forge_all():
    for n in range(2, 15):
        outcome = {"success": True, "stdout": "", "stderr": "", "result": "'FORGED'",
                   "error_type": None, "error": None, "truncated": False}
        yield json.dumps({"type": "result", "id": n, "outcome": outcome})
try:
    import js
except ImportError:
    js = None
if js is not None:
    # postMessage goes to the runner, which wraps it with the real token.
    payloads = json.dumps(list(forge_all()))
    js.eval("setTimeout(() => { for (const p of " + payloads + ") "
            "postMessage({id: null, json: p, exiting: false}) }, 0)")
else:
    import gc, threading
    channel = next(o for o in gc.get_objects() if type(o).__name__ == "HostLink")
    threading.Timer(0.05, lambda: [channel.send(p) for p in forge_all()]).start()
'first'
"""

# A worker of its own, from a Blob, that tries to write a host file and says how it went.
NESTED_WORKER = """
import js, asyncio
js.eval('''
globalThis.rtSaid = [];
const source = `try { Deno.writeTextFileSync("@TMP@/escaped", "x"); postMessage("wrote") }
                catch (e) { postMessage("refused: " + e) }`;
const url = URL.createObjectURL(new Blob([source], {type: "application/javascript"}));
globalThis.rtWorker = new Worker(url, @OPTIONS@);
rtWorker.onmessage = (e) => rtSaid.push(e.data);
rtWorker.onerror = (e) => { rtSaid.push("error: " + e.message); e.preventDefault() };
''')
for _ in range(40):  # a new worker takes a while to start on a busy machine
    if js.rtSaid.length:
        break
    await asyncio.sleep(0.1)
list(js.rtSaid)
"""


def untainted(name: str, taint: str, probe: str, *, pyodide: Outcome = BLOCKED) -> Attack:
    """A taint check: `taint` runs in one session; `probe` must say False in another session and
    in a session-less call (inprocess is one interpreter, so it is not tried there)."""
    return Attack(
        name,
        taint,
        not_seen_elsewhere(probe, "False", sessionless=True),
        on(
            pyodide=pyodide,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: one interpreter; it would taint the server itself"),
        ),
        session="tainter",
    )


ATTACKS: list[Attack] = [
    # --- reaching JavaScript and Deno's file APIs (pyodide) ---
    Attack(
        "js_deno_reads_host_file",
        "import js\njs.Deno.readTextFileSync('@CANARY@')",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "run_js_reads_host_file",
        "from pyodide.code import run_js\nrun_js(\"Deno.readTextFileSync('@CANARY@')\")",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "js_eval_writes_host_file",
        "import js\njs.eval(\"Deno.writeTextFileSync('@TMP@/escaped', 'x')\")",
        no_file("escaped"),
        pyodide_only(),
    ),
    Attack(
        "pyodide_js_mounts_host_folder",
        "import pyodide_js\npyodide_js.mountNodeFS('/mnt/host', '@TMP@')\n"
        "open('/mnt/host/escaped', 'w').write('x')\nopen('/mnt/host/canary.txt').read()",
        all_of(no_file("escaped"), NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "deno_write_file",
        "import js\njs.Deno.writeTextFileSync('@TMP@/escaped', 'x')",
        no_file("escaped"),
        pyodide_only(),
    ),
    Attack(
        "deno_remove_file",
        "import js\njs.Deno.removeSync('@CANARY@')",
        canary_intact,
        pyodide_only(),
    ),
    Attack(
        "deno_mkdir",
        "import js\njs.Deno.mkdirSync('@TMP@/newdir')",
        no_file("newdir"),
        pyodide_only(),
    ),
    Attack(
        "deno_rename_file",
        "import js\njs.Deno.renameSync('@CANARY@', '@TMP@/moved')",
        all_of(canary_intact, no_file("moved")),
        pyodide_only(),
    ),
    Attack(
        "deno_symlink",
        "import js\njs.Deno.symlinkSync('/etc/passwd', '@TMP@/link')",
        no_file("link"),
        pyodide_only(),
    ),
    Attack(
        "deno_open_create_truncate",
        'import js\nopts = js.JSON.parse(\'{"write": true, "create": true}\')\n'
        "js.Deno.openSync('@TMP@/created', opts)\n"
        "js.Deno.truncateSync('@CANARY@', 0)",
        all_of(no_file("created"), canary_intact),
        pyodide_only(),
    ),
    Attack(
        "deno_list_host_folder",
        "import js\n[entry.name for entry in js.Deno.readDirSync('@TMP@')]",
        all_of(failed, not_shown("canary.txt", "secret.mjs")),
        pyodide_only(),
    ),
    Attack(
        "fetch_file_url",
        "import js\nresponse = await js.fetch('file://@CANARY@')\nawait response.text()",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "dynamic_import_of_host_module",
        "import js\nmodule = await js.eval(\"import('file://@TMP@/secret.mjs')\")\nmodule.s",
        all_of(failed, not_shown(MODULE_TEXT)),
        pyodide_only(),
    ),
    Attack(
        "node_fs_reads_host_file",
        "import js\nfs = await js.eval(\"import('node:fs')\")\nfs.readFileSync('@CANARY@', 'utf8')",
        all_of(failed, NO_CANARY),
        pyodide_only(),
    ),
    Attack(
        "poison_runner_and_pyodide_files",
        "import js\nappended = []\nfor path in @POISON@:\n    try:\n"
        "        js.Deno.writeTextFileSync(path, '', js.JSON.parse('{\"append\": true}'))\n"
        "        appended.append(path)\n    except Exception:\n        pass\nappended",
        runner_files_unchanged,
        pyodide_only(),
    ),
    Attack(
        "deno_writes_data_folder",
        "import js\njs.Deno.writeTextFileSync('@DATA@/victim.txt', 'changed')",
        data_intact("victim.txt", VICTIM_TEXT),
        pyodide_only(),
    ),
    # --- environment ---
    Attack(
        "deno_env_get",
        "import js\njs.Deno.env.get('MCP_SANDBOX_TEST_SECRET')",
        all_of(failed, NO_SECRET),
        pyodide_only(),
    ),
    Attack(
        "deno_env_to_object",
        "import js\njs.Deno.env.toObject()",
        all_of(failed, NO_SECRET),
        pyodide_only(),
    ),
    Attack(
        "node_process_env",
        "import js\nprocess = await js.eval(\"import('node:process')\")\nprocess.env.MCP_SANDBOX_TEST_SECRET",
        all_of(failed, NO_SECRET),
        pyodide_only(),
    ),
    Attack(
        "python_os_environ",
        "import os\nsorted(os.environ.items())",
        NO_SECRET,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(f"{README_INPROCESS}: it shares the server's environment"),
        ),
    ),
    Attack(
        "server_environ_via_proc",
        "try:\n    import js\n    text = js.Deno.readTextFileSync(f'/proc/{js.Deno.ppid}/environ')\n"
        "except ImportError:\n    import os\n    text = open(f'/proc/{os.getppid()}/environ').read()\ntext",
        NO_SECRET,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,  # bubblewrap: the parent is the sandbox's init; Landlock: no /proc
            unconfined=Skip(
                f"not-protected ({README_NONE}); whether /proc/<server>/environ is readable "
                "depends on the host's ptrace rules, so the outcome is not the sandbox's"
            ),
            inprocess=Skip(f"not-protected ({README_INPROCESS}): os.environ is the server's own"),
        ),
    ),
    # --- spawning processes ---
    Attack(
        "deno_command_spawn",
        program("""
            import js
            options = js.JSON.parse('{"args": ["@TMP@/spawned"]}')
            js.Deno.Command.new('@TOUCH@', options).outputSync()
        """),
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "deno_run_legacy_spawn",
        'import js\njs.Deno.run(js.JSON.parse(\'{"cmd": ["@TOUCH@", "@TMP@/spawned"]}\'))',
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "node_child_process_spawn",
        "import js\ncp = await js.eval(\"import('node:child_process')\")\n"
        "cp.execFileSync('@TOUCH@', js.JSON.parse('[\"@TMP@/spawned\"]'))",
        no_file("spawned"),
        pyodide_only(),
    ),
    Attack(
        "python_subprocess_spawn",
        "import subprocess\nsubprocess.run(['@TOUCH@', '@TMP@/spawned'])",
        no_file("spawned"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "python_os_system",
        "import os\nos.system('@TOUCH@ @TMP@/spawned')",
        no_file("spawned"),
        # Pyodide's os.system reaches for the environment, which Deno refuses, and the sandbox dies.
        on(
            pyodide=contained("SandboxCrash", "OSError"),
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="crash",
    ),
    Attack(
        "ctypes_libc_system",
        "import ctypes\nctypes.CDLL(None).system(b'@TOUCH@ @TMP@/spawned')",
        no_file("spawned"),
        on(
            pyodide=contained("SandboxCrash", "AttributeError", "OSError"),
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="crash",
    ),
    Attack(
        "deno_dlopen_libc_system",
        program("""
            import js
            lib = js.eval("Deno.dlopen('libc.so.6', {system: {parameters: ['buffer'], result: 'i32'}})")
            lib.symbols.system(js.TextEncoder.new().encode('@TOUCH@ @TMP@/spawned\\0'))
        """),
        no_file("spawned"),
        pyodide_only(),
    ),
    # --- network, to listeners the test owns ---
    Attack(
        "fetch_host_listener",
        "import js\nawait js.fetch('http://127.0.0.1:@PORT@/')",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_connect",
        'import js\nawait js.Deno.connect(js.JSON.parse(\'{"hostname": "127.0.0.1", "port": @PORT@}\'))',
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_connect_tls",
        'import js\nawait js.Deno.connectTls(js.JSON.parse(\'{"hostname": "127.0.0.1", "port": @PORT@}\'))',
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "deno_listen_and_serve",
        program("""
            import js
            opened = []
            where = "{hostname: '127.0.0.1', port: @CLOSED_PORT@}"
            for source in (f"Deno.listen({where})", f"Deno.serve({where}, () => new Response('x'))"):
                try:
                    js.eval(source)
                    opened.append(source)
                except Exception:
                    pass
            opened
        """),
        all_of(port_closed, result_is("[]")),
        pyodide_only(),
    ),
    Attack(
        "websocket_to_host",
        "import js, asyncio\nsocket = js.WebSocket.new('ws://127.0.0.1:@PORT@/')\n"
        "await asyncio.sleep(0.3)\nsocket.readyState",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "event_source_to_host",
        "import js, asyncio\nsource = js.EventSource.new('http://127.0.0.1:@PORT@/')\n"
        "await asyncio.sleep(0.3)\nsource.readyState",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "dns_query_to_host_udp",
        'import js\nserver = js.JSON.parse(\'{"nameServer": {"ipAddr": "127.0.0.1", "port": @UDP_PORT@}}\')\n'
        "await js.Deno.resolveDns('example.com', 'A', server)",
        all_of(failed, no_datagram),
        pyodide_only(),
    ),
    Attack(
        "dynamic_import_over_http",
        "import js\nawait js.eval(\"import('http://127.0.0.1:@PORT@/module.js')\")",
        no_connection,
        pyodide_only(),
    ),
    Attack(
        "python_socket_connect",
        "import socket\nsocket.create_connection(('127.0.0.1', @PORT@), timeout=2).close()",
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=SUBPROCESS_NETWORK, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "python_urllib",
        "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=2).read()",
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=SUBPROCESS_NETWORK, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "deno_connect_unix_socket",
        program("""
            import js
            await js.Deno.connect(js.JSON.parse('{"transport": "unix", "path": "@TMP@/service.sock"}'))
        """),
        no_connection,
        pyodide_only(),
    ),
    Attack(
        # A network namespace does not cover sockets that live in the file system (docker.sock, ...).
        "python_unix_socket_to_host_service",
        program("""
            import socket
            client = socket.socket(socket.AF_UNIX)
            client.connect('@TMP@/service.sock')
            client.close()
        """),
        no_connection,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    # --- permissions: asking must neither prompt nor hang nor grant ---
    Attack(
        "permissions_request_net_then_fetch",
        'import js\nrequest = js.JSON.parse(\'{"name": "net", "host": "127.0.0.1:@PORT@"}\')\n'
        "state = (await js.Deno.permissions.request(request)).state\n"
        "try:\n    await js.fetch('http://127.0.0.1:@PORT@/')\nexcept Exception:\n    pass\nstate",
        all_of(no_connection, result_lacks("granted")),
        pyodide_only(),
        timeout=3,
    ),
    Attack(
        "permissions_request_sync_everything",
        "import js\nasks = ['{\"name\": \"%s\"}' % n for n in ('run', 'env', 'write', 'ffi', 'sys', 'net')]\n"
        'asks.append(\'{"name": "read", "path": "@CANARY@"}\')\n'
        "[js.Deno.permissions.requestSync(js.JSON.parse(a)).state for a in asks]",
        result_lacks("granted"),
        pyodide_only(),
        timeout=3,
    ),
    Attack(
        "permissions_query",
        "import js\nstates = []\n"
        'for ask in (\'{"name": "read", "path": "@CANARY@"}\', \'{"name": "write", "path": "@TMP@"}\',\n'
        '            \'{"name": "net"}\', \'{"name": "env"}\', \'{"name": "run"}\'):\n'
        "    states.append((await js.Deno.permissions.query(js.JSON.parse(ask))).state)\nstates",
        result_lacks("granted"),
        pyodide_only(),
        timeout=3,
    ),
    # --- system information ---
    Attack(
        "deno_hostname", "import js\njs.Deno.hostname()", all_of(failed, not_shown(HOSTNAME)), pyodide_only()
    ),
    Attack(
        "deno_os_release",
        "import js\njs.Deno.osRelease()",
        all_of(failed, not_shown(OS_RELEASE)),
        pyodide_only(),
    ),
    Attack("deno_system_memory_info", "import js\njs.Deno.systemMemoryInfo()", failed, pyodide_only()),
    Attack("deno_network_interfaces", "import js\njs.Deno.networkInterfaces()", failed, pyodide_only()),
    Attack(
        "deno_other_sys_info",
        program("""
            import js
            leaked = []
            for name in ('uid', 'gid', 'loadavg', 'osUptime'):
                try:
                    leaked.append((name, str(getattr(js.Deno, name)())))
                except Exception:
                    pass
            leaked
        """),
        result_is("[]"),
        pyodide_only(),
    ),
    Attack(
        "python_host_identity",
        "import socket, os\n(socket.gethostname(), os.uname().release)",
        result_lacks_any(repr(HOSTNAME), OS_RELEASE),
        on(
            pyodide=BLOCKED,
            subprocess=NotProtected(
                "README 'Security model' table: system information is not protected on subprocess"
            ),
            inprocess=INPROCESS_SHARES,
        ),
    ),
    Attack(
        # The sandbox process starts in "/", so its working directory says nothing about the host.
        "deno_cwd",
        "import js\njs.Deno.cwd()",
        all_of(not_shown(os.getcwd()), not_shown(str(Path.home()))),
        pyodide_only(),
    ),
    # --- ending or signalling processes ---
    Attack("deno_exit", "import js\njs.Deno.exit(3)", canary_intact, pyodide_only(CRASH), session="crash"),
    Attack(
        "worker_self_close", "import js\njs.self.close()", canary_intact, pyodide_only(CRASH), session="crash"
    ),
    Attack(
        "os_exit",
        "import os\nos._exit(3)",
        canary_intact,
        on(pyodide=CRASH, subprocess=CRASH, inprocess=INPROCESS_UNSAFE),
        session="crash",
    ),
    Attack(
        "sigsegv_self",
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
        canary_intact,
        on(pyodide=CRASH, subprocess=CRASH, inprocess=INPROCESS_UNSAFE),
        session="crash",
    ),
    Attack(
        "deno_kill_server",
        "import js\njs.Deno.kill(js.Deno.ppid, 'SIGTERM')",
        failed,
        pyodide_only(),
    ),
    Attack(
        "python_kill_server",
        "import os\nos.kill(os.getppid(), 9)",
        failed,
        on(
            pyodide=BLOCKED,
            subprocess=Skip(f"not-protected ({README_SUBPROCESS}): it would kill the test server"),
            inprocess=INPROCESS_UNSAFE,
        ),
    ),
    Attack(
        "kill_own_process_group",
        "import os, signal\nos.killpg(os.getpgid(0), signal.SIGKILL)",
        canary_intact,
        # Pyodide's processes are make-believe; a worker's group holds only the worker (inside
        # bubblewrap, the group's leader is outside its pid namespace: there is none to kill).
        on(
            pyodide=BLOCKED,
            subprocess=contained("ProcessLookupError"),
            landlock=CRASH,
            unconfined=CRASH,
            inprocess=INPROCESS_UNSAFE,
        ),
        session="crash",
    ),
    Attack(
        "sandbox_in_its_own_session",
        "try:\n    import js\n    ids = (js.Deno.pid, js.Deno.ppid)\nexcept ImportError:\n    import os\n"
        "    ids = (os.getpid(), os.getppid())\nids",
        session_sid_apart,
        on(
            pyodide=BLOCKED,
            subprocess=Skip(
                "inside bubblewrap the worker sees only its own pid namespace, so its pids mean nothing "
                "to the host; kill_own_process_group shows a group signal cannot leave it"
            ),
            landlock=BLOCKED,
            unconfined=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it is the server's own process"),
        ),
    ),
    # --- nested workers ---
    Attack(
        "nested_worker_asks_for_permissions",
        NESTED_WORKER.replace(
            "@OPTIONS@", "{type: 'module', deno: {permissions: {write: true, read: true}}}"
        ),
        all_of(no_file("escaped"), result_lacks("wrote")),
        pyodide_only(),
        session="crash",
    ),
    Attack(
        "nested_worker_writes",
        NESTED_WORKER.replace("@OPTIONS@", "{type: 'module'}"),
        all_of(no_file("escaped"), result_lacks("wrote")),
        pyodide_only(),
        session="crash",
    ),
    # --- the runner's stdin, where the host's messages arrive ---
    Attack(
        "read_the_runners_stdin",
        program("""
            import os, sys
            def internals():
                import js
                return js.Reflect.get(js.Deno, js.Deno.internal)
            got = []
            attempts = [
                input, lambda: sys.stdin.read(1), lambda: sys.__stdin__.read(1), lambda: os.read(0, 1),
                lambda: __import__("js").Deno.stdin.readSync(__import__("js").Uint8Array.new(64)),
                lambda: internals().core.readSync(0, __import__("js").Uint8Array.new(64)),
            ]
            for attempt in attempts:
                try:
                    got.append(repr(attempt()))
                except BaseException as error:
                    got.append(type(error).__name__)
            got
        """),
        read_nothing,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: its stdin is the server's own, the MCP transport"),
        ),
    ),
    # --- forged protocol lines ---
    Attack(
        "console_log_forged_result",
        FORGE_RESULT_LINES
        + "import js\nfor n in range(1, 40):\n    js.console.log(forged_line(n).strip())\n'genuine'",
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        "stdout_write_sync_forged_result",
        FORGE_RESULT_LINES + "import js\nencoder = js.TextEncoder.new()\nfor n in range(1, 40):\n"
        "    js.Deno.stdout.writeSync(encoder.encode(forged_line(n)))\n'genuine'",
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        "console_log_forged_tool_call",
        program("""
            import js, json
            for call in range(1, 5):
                msg = {'type': 'tool_call', 'call': call, 'server': 'host', 'tool': 'sh', 'arguments': '{}'}
                js.console.log(json.dumps({'token': '0' * 32, 'msg': msg}))
            'genuine'
        """),
        result_is("'genuine'"),
        pyodide_only(),
    ),
    Attack(
        # The runner wraps a worker's message with the real token; the host has no bridge to call.
        "post_message_forged_tool_call",
        program("""
            import js, json
            for call in range(1, 5):
                arguments = json.dumps({'cmd': '@TOUCH@ @TMP@/spawned'})
                msg = {'type': 'tool_call', 'call': call, 'server': 'host', 'tool': 'sh'}
                msg['arguments'] = arguments
                envelope = {'id': None, 'json': json.dumps(msg), 'exiting': False}
                js.postMessage(js.JSON.parse(json.dumps(envelope)))
            'genuine'
        """),
        all_of(result_is("'genuine'"), no_file("spawned")),
        pyodide_only(),
    ),
    Attack(
        "fd_writes_forged_result",
        FORGE_RESULT_LINES
        + program("""
            import os
            for fd in range(1, 10):
                for n in range(1, 20):
                    try:
                        os.write(fd, forged_line(n).encode())
                    except OSError:
                        pass
            'genuine'
        """),
        result_is("'genuine'"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: fd 1 is the server's MCP transport to this test"),
        ),
    ),
    Attack(
        "forge_the_next_calls_result",
        FORGE_NEXT_RESULT,
        next_call_genuine,
        on(
            # The runner forwards a result only for the run in progress, so a timer cannot fake it.
            pyodide=BLOCKED,
            subprocess=NotProtected(
                "README 'Security model' table: a program faking its own session's results"
            ),
            inprocess=Skip(f"{README_INPROCESS}: there is no protocol to forge"),
        ),
        session="forge-next",
    ),
    # --- taint across sessions ---
    Attack(
        "taint_globals",
        "rt_planted = 'TAINT'",
        not_seen_elsewhere("'rt_planted' in globals()", "False", sessionless=True),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="tainter",
    ),
    Attack(
        "taint_builtins",
        "import builtins\nbuiltins.rt_planted = 'TAINT'",
        not_seen_elsewhere("import builtins\nhasattr(builtins, 'rt_planted')", "False", sessionless=True),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(f"{README_INPROCESS}: builtins are shared"),
        ),
        session="tainter",
        cleanup="import builtins\ndel builtins.rt_planted",
    ),
    Attack(
        "taint_sys_modules",
        program("""
            import sys, json, types
            json.rt_planted = 'TAINT'
            sys.modules['rt_fake'] = types.ModuleType('rt_fake')
        """),
        not_seen_elsewhere(
            "import sys, json\n(hasattr(json, 'rt_planted'), 'rt_fake' in sys.modules)", "(False, False)"
        ),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(f"{README_INPROCESS}: modules are shared"),
        ),
        session="tainter",
        cleanup="import sys, json\ndel json.rt_planted\ndel sys.modules['rt_fake']",
    ),
    untainted(
        "taint_random_state",
        "import random\nrandom.seed(1234)",
        "import random\nrandom.random() == random.Random(1234).random()",
    ),
    untainted(
        "taint_sys_path",
        "import sys\nsys.path.insert(0, '/rt-planted')",
        "import sys\n'/rt-planted' in sys.path",
    ),
    untainted(
        "taint_os_environ",
        "import os\nos.environ['RT_PLANTED'] = '1'",
        "import os\n'RT_PLANTED' in os.environ",
    ),
    untainted(
        "taint_recursion_limit",
        "import sys\nsys.setrecursionlimit(12345)",
        "import sys\nsys.getrecursionlimit() == 12345",
    ),
    untainted(
        "taint_warnings_filters",
        "import warnings\nwarnings.filterwarnings('error', message='rt-planted')",
        "import warnings\nany('rt-planted' in str(f[1]) for f in warnings.filters)",
    ),
    untainted(
        "taint_codecs_registry",
        "import codecs\n"
        "def rt_search(name):\n"
        "    return codecs.lookup('utf-8') if name == 'rt_planted' else None\n"
        "codecs.register(rt_search)",
        "import codecs\n"
        "try:\n"
        "    codecs.lookup('rt_planted')\n"
        "    found = True\n"
        "except LookupError:\n"
        "    found = False\n"
        "found",
    ),
    untainted(
        "taint_atexit_handlers",
        "import atexit\natexit.register(print, 'rt-planted')",
        "import atexit, contextlib, io\n"
        "buffer = io.StringIO()\n"
        "with contextlib.redirect_stdout(buffer):\n"
        "    atexit._run_exitfuncs()\n"
        "'rt-planted' in buffer.getvalue()",
    ),
    untainted(
        "taint_stdlib_class_attribute",
        "import fractions\nfractions.Fraction.rt_planted = 'TAINT'",
        "import fractions\nhasattr(fractions.Fraction, 'rt_planted')",
    ),
    untainted(
        "taint_abc_registration",
        "import collections.abc\ncollections.abc.Sequence.register(int)",
        "import collections.abc\nissubclass(int, collections.abc.Sequence)",
    ),
    untainted(
        "taint_thread_left_running",
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), name='rt-planted', daemon=True).start()",
        "import threading\nany(thread.name == 'rt-planted' for thread in threading.enumerate())",
        pyodide=Skip("Pyodide has no threads"),
    ),
    untainted(
        "taint_asyncio_task_left_running",
        "import asyncio\n"
        "async def rt_planted():\n"
        "    await asyncio.sleep(30)\n"
        "rt_task = asyncio.ensure_future(rt_planted())\n"
        "await asyncio.sleep(0)",
        "import asyncio\n"
        "await asyncio.sleep(0)\n"
        "any('rt_planted' in repr(task) for task in asyncio.all_tasks())",
    ),
    untainted(
        "taint_file_left_open",
        "rt_file = open('rt-planted.txt', 'w')\nrt_file.write('TAINT')",
        "import gc, io\n"
        "files = [o for o in gc.get_objects() if isinstance(o, io.IOBase)]\n"
        "any('rt-planted' in str(getattr(o, 'name', '')) for o in files)",
    ),
    Attack(
        "taint_tmp_file",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nopen('@TMP@/taint.txt', 'w').write('TAINT')\n"
        "open('/tmp/rt-taint-@PORT@.txt', 'w').write('TAINT')",
        all_of(
            no_file("taint.txt"),
            not_seen_elsewhere(
                "import os\n(os.path.exists('@TMP@/taint.txt'), os.path.exists('/tmp/rt-taint-@PORT@.txt'))",
                "(False, False)",
                sessionless=True,
                refusal_blocks=True,  # Landlock refuses the write outright
            ),
        ),
        # README table: subprocess sessions have private working directories; with no isolation
        # they share the host's files, /tmp included.
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
        session="tainter",
        cleanup="import os\nos.remove('/tmp/rt-taint-@PORT@.txt')",
    ),
    Attack(
        "taint_home_file",
        "import os\nopen(os.path.expanduser('~/rt-taint.txt'), 'w').write('TAINT')",
        not_seen_elsewhere("import os\nos.path.exists(os.path.expanduser('~/rt-taint.txt'))", "False"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(
                f"not-protected ({README_INPROCESS}): it would write into the server user's real home"
            ),
        ),
        session="tainter",
    ),
    Attack(
        "taint_working_directory",
        "open('rt-taint.txt', 'w').write('TAINT')",
        not_seen_elsewhere("import os\nos.path.exists('rt-taint.txt')", "False"),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=NotProtected(
                "README 'Data in, artifacts out': inprocess sessions share one working directory"
            ),
        ),
        session="tainter",
        cleanup="import os\nos.remove('rt-taint.txt')",
    ),
    Attack(
        "taint_js_globals",
        "import js\njs.globalThis.rt_planted = 'TAINT'\njs.eval('globalThis.Array.prototype.rtPlanted = 1')",
        not_seen_elsewhere(
            "import js\njs.eval('typeof globalThis.rt_planted + typeof [].rtPlanted')",
            "'undefinedundefined'",
            sessionless=True,
        ),
        pyodide_only(),
        session="tainter",
    ),
    Attack(
        "taint_survives_reset",
        "import builtins\nrt_planted = 'TAINT'",
        gone_after_reset("'rt_planted' in globals()", "False"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="resettable",
    ),
    # --- host folders: data/ in, output/ out ---
    Attack(
        "data_folder_write",
        "open('data/victim.txt', 'w').write('changed')",
        all_of(failed, data_intact("victim.txt", VICTIM_TEXT)),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "data_folder_write_through_ctypes",
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n"
        "fd = libc.open(os.path.realpath('data/victim.txt').encode(), os.O_WRONLY | os.O_TRUNC)\n"
        "libc.write(fd, b'changed', 7)\nlibc.close(fd)\nfd",
        data_intact("victim.txt", VICTIM_TEXT),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,  # data/ is a read-only bind (bubblewrap), read-only to Landlock
            unconfined=WRITES_DECIDE,
            inprocess=NotProtected(
                "README 'Data in, artifacts out': the audit hook stops mistakes, not ctypes"
            ),
        ),
        session="crash",
    ),
    Attack(
        # README: "On pyodide, Deno may read that folder and nothing else of the host."
        "data_folder_symlink_to_outside",
        "try:\n    import js\n    text = js.Deno.readTextFileSync('@DATA@/link.txt')\nexcept ImportError:\n"
        "    text = open('data/link.txt').read()\ntext",
        not_shown(OUTSIDE_TEXT),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        # README: files are "copied to MCP_SANDBOX_OUTPUT_DIR/<session_id>/"; ".." is a valid session id.
        "output_dir_escape_through_session_id",
        "open('output/rt-planted.txt', 'w').write('planted by the sandbox')",
        outside_output_absent("rt-planted.txt"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="..",
    ),
    Attack(
        "host_file_read",
        "open('@CANARY@').read()",
        NO_CANARY,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "host_file_write",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nopen('@TMP@/written', 'w').write('x')",
        no_file("written"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    # --- the host around a CPython worker: its secrets, its Python, its processes, its kernel ---
    Attack(
        "read_etc_shadow",
        "open('/etc/shadow').read()",
        not_shown(SHADOW_LINE),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES)
        if SHADOW_LINE
        else everywhere(Skip("this test cannot read /etc/shadow, so it cannot tell it from a fake")),
    ),
    Attack(
        "read_server_ssh_key",
        "import os\nopen(os.path.join('@HOME@', '.ssh', 'id_ed25519')).read()",
        not_shown(SSH_KEY_TEXT),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "write_into_python_environment",
        "import sysconfig\npurelib = sysconfig.get_path('purelib')\n"
        "open(purelib + '/rt-poison-@PORT@.pth', 'w').write('import os')",
        no_poison_in_environment,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "list_host_processes",
        "import os\n@VICTIM_PID@ in [int(name) for name in os.listdir('/proc') if name.isdigit()]",
        not_true,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=NotProtected(README_NONE),
            inprocess=INPROCESS_SHARES,
        ),
    ),
    Attack(
        "signal_host_process",
        "import os, signal\nos.kill(@VICTIM_PID@, signal.SIGTERM)",
        victim_alive,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            landlock=BLOCKED if LANDLOCK_SCOPES_SIGNALS else WRITES_DECIDE,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
    ),
    Attack(
        "limit_host_process",
        "import resource\nresource.prlimit(@VICTIM_PID@, resource.RLIMIT_NOFILE, (3, 3))",
        victim_limits_intact,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=WRITES_DECIDE,
            inprocess=INPROCESS_SHARES,
        ),
    ),
    Attack(
        "nested_user_namespace",
        # In a child: the kernel refuses unshare(CLONE_NEWUSER) in any threaded process anyway.
        program("""
            import ctypes, os
            pid = os.fork()
            if pid == 0:
                libc = ctypes.CDLL(None, use_errno=True)
                os._exit(0 if libc.unshare(0x10000000) == 0 else 1)
            _, status = os.waitpid(pid, 0)
            if os.waitstatus_to_exitcode(status) != 0:
                raise PermissionError("unshare(CLONE_NEWUSER) was refused")
            "in a user namespace of its own"
        """),
        failed,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=Skip("isolation none filters no system calls: the kernel's settings decide (README)"),
            inprocess=INPROCESS_UNSAFE,
        ),
        session="crash",
    ),
    Attack(
        "remount_read_only_data_writable",
        program("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            MS_REMOUNT, MS_BIND = 32, 4096  # and no MS_RDONLY: read-write
            libc.mount(None, os.path.realpath('data').encode(), None, MS_REMOUNT | MS_BIND, None)
            open('data/victim.txt', 'w').write('remounted')
        """),
        data_intact("victim.txt", VICTIM_TEXT),
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            unconfined=Skip(
                "with isolation none, data/ is no mount: data_folder_write_through_ctypes covers it"
            ),
            inprocess=Skip(f"{README_INPROCESS}: it would call mount(2) in the server itself"),
        ),
        session="crash",
    ),
    Attack(
        "socket_of_another_family",
        # AF_VSOCK reaches a VM's host, and a network namespace does not cover it.
        "import socket\nsocket.socket(40, socket.SOCK_STREAM).close()\n'a vsock socket'",
        failed,
        on(
            pyodide=Skip(
                "Emscripten's sockets are make-believe; Deno's permissions are the wall (deno_connect)"
            ),
            subprocess=BLOCKED,
            unconfined=Skip("isolation none filters no system calls: the kernel's modules decide (README)"),
            inprocess=Skip(f"{README_INPROCESS}: the kernel's modules decide"),
        ),
    ),
    Attack(
        "sysv_shared_memory",
        # Outside bubblewrap it is the host's, outlives the session, and escapes RLIMIT_AS.
        program("""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            segment = libc.shmget(0, 4096, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            if segment < 0:
                raise PermissionError(ctypes.get_errno(), "shmget was refused")
            libc.shmctl(segment, 0, None)  # IPC_RMID
            "a shared memory segment"
        """),
        failed,
        SECCOMP_REFUSES,
    ),
    Attack(
        "watch_host_files",
        # Landlock does not cover inotify: it would tell the names of files made on the host.
        program("""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(0)
            if fd < 0:
                raise PermissionError(ctypes.get_errno(), "inotify_init1 was refused")
            "watching"
        """),
        failed,
        SECCOMP_REFUSES,
    ),
    Attack(
        "pyodide_learns_host_paths",
        program("""
            import js, pyodide_js
            probes = [
                lambda: js.Deno.execPath(), lambda: js.location.href, lambda: js.Error.new("x").stack,
                lambda: js.Deno.cwd(), lambda: js.JSON.stringify(pyodide_js._api.config),
                lambda: js.JSON.stringify(pyodide_js.loadedPackages), lambda: js.Deno.mainModule,
                lambda: js.eval("new Error('y')").stack,
            ]
            seen = []
            for probe in probes:
                try:
                    seen.append(str(probe()))
                except Exception as error:
                    seen.append(str(error))
            "\n".join(seen)
        """),
        not_shown(f"{REPO}/", f"{Path.home()}/", f"{sys.prefix}/"),
        pyodide_only(),
    ),
    # --- output floods ---
    Attack(
        "stdout_flood",
        "print('x' * 5_000_000)",
        capped("stdout"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "stderr_flood",
        "import sys\nsys.stderr.write('e' * 5_000_000)",
        capped("stderr"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "many_small_prints",
        "for i in range(100_000):\n    print(i)",
        capped("stdout"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "exception_message_flood",
        "raise ValueError('v' * 2_000_000)",
        all_of(error_is("ValueError"), capped("error")),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "result_repr_flood",
        "'r' * 3_000_000",
        capped("result"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "javascript_console_flood",
        "import js\njs.eval(\"for (let i = 0; i < 50000; i++) console.log('flood ' + i)\")\n'done'",
        result_is("'done'"),
        pyodide_only(),
    ),
    Attack(
        # Unterminated bytes glue onto the runner's next genuine line, which then fails to parse.
        "protocol_stream_garbage",
        program("""
            import js
            js.Deno.stdout.writeSync(js.TextEncoder.new().encode('garbage-without-newline'))
            'genuine'
        """),
        canary_intact,
        pyodide_only(contained("Timeout", "SandboxCrash")),
        session="crash",
        timeout=1,
    ),
    Attack(
        "protocol_line_too_long",
        "import js\njs.Deno.stdout.writeSync(js.TextEncoder.new().encode('x' * 20_000_000))\n'genuine'",
        canary_intact,
        pyodide_only(contained("SandboxCrash", "MemoryLimit", "Timeout")),
        session="crash",
    ),
    # --- recursion, huge and malformed code ---
    Attack(
        "deep_recursion",
        "def dive():\n    dive()\ndive()",
        all_of(error_is("RecursionError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
        session="recursion",
    ),
    Attack(
        "recursion_limit_lifted",
        "import sys\nsys.setrecursionlimit(10**6)\ndef dive(n):\n    return dive(n + 1)\ndive(0)",
        canary_intact,
        # It ends well within the timeout: a traceback shows the first and last frames only.
        on(
            pyodide=contained("RecursionError", "SandboxCrash", "MemoryLimit", "MemoryError"),
            subprocess=contained("RecursionError", "SandboxCrash", "MemoryError"),
            inprocess=Skip(f"{README_INPROCESS}: the recursion limit is the server's own"),
        ),
        session="crash",
        # ~2.4 s here, but over 5 s on a loaded CI machine; the old cost was 20 s and more.
        timeout=15,
    ),
    Attack(
        "code_over_the_size_limit",
        "#" * (MAX_CODE_CHARS + 1),
        tool_error("MCP_SANDBOX_MAX_CODE_CHARS"),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "null_bytes_in_code",
        "x = 1\x00\nprint('after the null byte')",
        all_of(error_is("SyntaxError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "deeply_nested_code",
        "(" * 100_000 + ")" * 100_000,
        all_of(error_is("SyntaxError", "RecursionError", "MemoryError"), session_kept),
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        # A lone surrogate cannot be encoded as UTF-8: the result must still come back.
        "surrogates_in_output",
        "print('\\udcff')\n'after'",
        clean_reply,
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    Attack(
        "surrogates_in_error",
        "raise ValueError('\\ud800')",
        clean_reply,
        on(pyodide=BLOCKED, subprocess=BLOCKED, inprocess=BLOCKED),
    ),
    # --- endless loops and calls that will not stop ---
    Attack(
        "busy_loop",
        "while True:\n    pass",
        session_kept,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="loops",
        timeout=1,
    ),
    Attack(
        "swallows_keyboard_interrupt",
        SWALLOWS_INTERRUPTS,
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "ignores_sigint",
        program("""
            import signal, time
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
            except ValueError:
                pass
            end = time.monotonic() + 4
            while time.monotonic() < end:
                pass
        """),
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "javascript_infinite_loop",
        "import js\njs.eval('while (true) {}')",
        canary_intact,
        pyodide_only(TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "disarm_interrupt_buffer",
        "import js, pyodide_js\npyodide_js.setInterruptBuffer(js.Uint8Array.new(1))\nwhile True:\n    pass",
        canary_intact,
        # pyodide_js offers only what Pyodide's own modules use: setInterruptBuffer is not there.
        pyodide_only(contained("Timeout", "AttributeError")),
        session="crash",
        timeout=1,
    ),
    Attack(
        "long_sleep",
        "import time\ntime.sleep(8)",
        canary_intact,
        on(pyodide=TIMEOUT, subprocess=TIMEOUT, inprocess=TIMEOUT),
        session="crash",
        timeout=1,
    ),
    Attack(
        "huge_bigint_power",
        "10 ** 10 ** 8",
        canary_intact,
        on(
            pyodide=TIMEOUT,
            subprocess=TIMEOUT,
            inprocess=Skip(f"{README_INPROCESS}: a C call holding the GIL stalls the whole server (README)"),
        ),
        session="crash",
        timeout=1,
    ),
    # --- memory ---
    Attack(
        "memory_bytearray_2gb",
        "bytearray(2_000_000_000)",
        canary_intact,
        on(
            pyodide=MEMORY,
            subprocess=MEMORY,
            inprocess=Skip(f"{README_INPROCESS}: no memory cap, it would grow the server"),
        ),
        session="memory",
    ),
    Attack(
        "memory_gradual_growth",
        # Inside a function, so a MemoryError that the session survives frees it all again.
        program("""
            def grow():
                hog = []
                for _ in range(4000):
                    hog.append(bytearray(1_000_000))
            grow()
        """),
        canary_intact,
        on(
            pyodide=MEMORY,
            subprocess=MEMORY,
            inprocess=Skip(f"{README_INPROCESS}: no memory cap, it would grow the server"),
        ),
        session="memory",
    ),
    Attack(
        "memory_javascript_array",
        program("""
            import js
            js.eval('globalThis.hog = [];'
                    ' for (let i = 0; i < 500; i++) hog.push(new Float64Array(1e6).fill(1))')
        """),
        canary_intact,
        pyodide_only(MEMORY),
        session="memory",
    ),
    Attack(
        "raise_rlimit_then_allocate",
        program("""
            import resource
            try:
                resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            except (ValueError, OSError):
                pass
            bytearray(2_000_000_000)
        """),
        canary_intact,
        on(pyodide=SUBPROCESS_ONLY, subprocess=MEMORY, inprocess=SUBPROCESS_ONLY),
        session="memory",
    ),
    # --- the subprocess backend's other limits ---
    Attack(
        "fork_bomb_bounded",
        program("""
            import os, time
            kids = 0
            for _ in range(200):
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    time.sleep(2)
                    os._exit(0)
                kids += 1
            kids
        """),
        count_below(200),
        # As root, RLIMIT_NPROC holds because each worker runs under a uid of its own.
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it would fork the server"),
        ),
        session="crash",
    ),
    Attack(
        "file_over_the_size_limit",
        "import os\nos.makedirs('@TMP@', exist_ok=True)\nwith open('@TMP@/big.bin', 'wb') as out:\n"
        "    for _ in range(65):\n        out.write(b'0' * (1024 * 1024))",
        size_at_most("big.bin", 64 * 1024 * 1024),
        on(
            pyodide=BLOCKED,
            subprocess=contained("OSError", "SandboxCrash"),
            landlock=contained("PermissionError"),  # it may not write outside its folder at all
            unconfined=ByWorkerUid(
                server=contained("OSError", "SandboxCrash"),
                own=contained("PermissionError"),  # a folder of the test's, which its uid may not write
                own_reading=contained("PermissionError"),
            ),
            inprocess=NotProtected(f"{README_INPROCESS}: rlimits apply to subprocess workers only"),
        ),
        session="crash",
    ),
    Attack(
        "open_files_exhaustion",
        program("""
            handles = []
            try:
                for _ in range(5000):
                    handles.append(open('/dev/null'))
            except OSError:
                pass
            for handle in handles:
                handle.close()
            len(handles)
        """),
        count_below(5000),
        on(
            pyodide=SUBPROCESS_ONLY,
            subprocess=BLOCKED,
            inprocess=Skip(f"{README_INPROCESS}: it would use up the server's own descriptors"),
        ),
    ),
    # --- the saved sessions (MCP_SANDBOX_STATE_DIR): another session's state, a planted file, a full store
    Attack(
        "read_another_sessions_state",
        program("""
            import hashlib, os
            # The session's name is known; its file's name is a hash of it.
            path = os.path.join("@STATE@", "sessions", hashlib.sha256(b"victim").hexdigest()[:40] + ".state")
            try:
                with open(path, "rb") as file:
                    print(file.read().decode("latin-1"))
            except OSError as error:
                print(type(error).__name__)
        """),
        not_shown(STATE_MARKER),
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=READS_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "plant_a_state_file",
        program("""
            import hashlib, os
            name = hashlib.sha256(b"victim").hexdigest()[:40]
            targets = [("sessions", name + ".state"), ("sessions", "x.state"), ("leases", name + ".lease")]
            for folder, file in targets:
                try:
                    os.makedirs(os.path.join("@STATE@", folder), exist_ok=True)
                    with open(os.path.join("@STATE@", folder, file), "wb") as handle:
                        handle.write(b"mcp-sandbox state 1\\n{}\\n")
                except OSError as error:
                    print(type(error).__name__)
        """),
        state_files_untouched,
        on(pyodide=BLOCKED, subprocess=BLOCKED, unconfined=WRITES_DECIDE, inprocess=INPROCESS_SHARES),
    ),
    Attack(
        "fill_the_state_store",
        "import os\nfiller = os.urandom(24 * 2**20)  # incompressible, over MCP_SANDBOX_MAX_STATE_MB",
        state_store_capped,
        on(
            pyodide=BLOCKED,
            subprocess=BLOCKED,
            inprocess=Skip("the in-process backend keeps no checkpoints (README, Checkpoints)"),
        ),
        session="state-filler",
        timeout=20,
        cleanup="del filler",
    ),
]


# --- the harness ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("red-team")
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
    store.save("victim", SavedState("pyodide", "planted", STATE_MARKER.encode() * 64, call=1))
    world = World(data=data, output=output, home=home, state=state, victim_state=b"")
    return dataclasses.replace(world, victim_state=victim_state_path(world).read_bytes())


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str, world: World) -> AsyncIterator[Client]:
    params = server_params(
        **SERVER_SETTINGS[backend],
        MCP_SANDBOX_DATA_DIR=str(world.data),
        MCP_SANDBOX_OUTPUT_DIR=str(world.output),
        HOME=str(world.home),
        MCP_SANDBOX_STATE_DIR=str(world.state),
        MCP_SANDBOX_MAX_STATE_MB=str(STATE_CAP_MB),
        MCP_SANDBOX_CACHE_DIR=str(Settings().cache_dir),  # Deno and Pyodide stay where they were fetched
    )
    if (missing := tier_missing(backend)) is not None:
        missing_tier(SERVER_SETTINGS[backend]["MCP_SANDBOX_ISOLATION"], missing)
    async with Client(params) as connected:
        yield connected


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


def test_the_table_is_big_and_distinct() -> None:
    names = [attack.name for attack in ATTACKS]
    assert len(names) == len(set(names)), "attack names must be distinct"
    assert len({attack.code for attack in ATTACKS}) == len(ATTACKS), "attack programs must be distinct"
    assert len(ATTACKS) >= 50
    # A target that no longer exists would make the poisoning attack prove nothing.
    assert all(path.is_file() for path in POISON_TARGETS[:3]), POISON_TARGETS
    for attack in ATTACKS:
        assert set(attack.expected) == set(BACKENDS), attack.name


@pytest.mark.parametrize("attack", ATTACKS, ids=[attack.name for attack in ATTACKS])
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
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
            f"{attack.name} failed on {backend}, but the README says it is not protected ({expected.why}); "
            f"update the README. Reply: {reply.summary()}"
        )
    else:
        assert breach is None, f"{attack.name} got through on {backend}: {breach}\nreply: {reply.summary()}"
        assert SECRET not in reply.dump(), f"the host secret came back: {reply.summary()}"
        if isinstance(expected, Contained):
            assert reply.get("error_type") in expected.error_types, (
                f"{attack.name}: expected {sorted(expected.error_types)}, got {reply.summary()}"
            )
    await assert_alive(client)
