"""Red team, co-hosting (pyodide): one sandbox attacks another in the same Deno process.

A Deno process hosts several sandboxes of one principal, each a worker (runner.ts). Session
"victim" holds secrets: a variable, a file in its working directory and one in output/, its copy
of data/, 4 MB of a random marker in memory, messages it posts on a BroadcastChannel, replies of
a bridged tool. Session "attacker", in the same process (checked by pid before every attack), goes
after them through every way a program reaches out of its interpreter: `js`, Deno, node's
modules, BroadcastChannel, web storage, its own memory, the runner's channels, and CPU and memory
it takes from the others. Each attack has a host-side or victim-side check that proves it failed:
the secret never comes back, the victim's state is unchanged and it answers in time.

Two things co-hosted sandboxes do share, and docs/security.md says so: the runner's stdin (node's
fs and process.stdin reach it from any worker; a sandbox can take the host's messages for the
others, though it reads them only sealed), and the process itself (a sandbox can end it, and the
others come back from their checkpoints, saying so). Those two tests assert that the attack works,
as the harness's `NotProtected` does, so the docs stay true.

One server for the whole module: each attack gets two new sessions in the process an "anchor"
session keeps alive, and ends them after.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.abc
import pytest
from mcp import Client

from mcp_sandbox.backends.base import ExecutorHooks
from mcp_sandbox.backends.pyodide import PyodideBackend
from mcp_sandbox.protocol import RUNNER_TOKEN_ENV
from mcp_sandbox.settings import Settings
from tests.helpers import http_server, process_tree, state_file
from tests.security.harness import Reply, all_of, program, send

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[2]
RUN = secrets.token_hex(8)
#: The victim's secrets: none of them is ever in an attacker's program.
SECRET = f"cohost-secret-{RUN}"
FILE_SECRET = f"cohost-file-{RUN}"
OUTPUT_SECRET = f"cohost-output-{RUN}"
MESSAGE_SECRET = f"cohost-message-{RUN}"
TOOL_SECRET = f"cohost-tool-{RUN}"
#: 16 random bytes, 2**18 times in the victim's memory (4 MB).
MARKER = secrets.token_bytes(16)
MARKER_COPIES = 2**18
#: What the attacker tries to keep in web storage (its own, not a secret).
STORED = f"cohost-stored-{RUN}"
DATA_TEXT = "cohost-data-original"
#: How a program finds a secret it does not know: the pattern itself matches none of its own text.
PATTERN = r"cohost-[a-z]+-[0-9a-f]{16}"
#: Seconds a victim's call may take while an attacker in its process spins or hogs memory (an
#: idle victim answers in a fraction of a second; this machine may be busy).
ANSWER_S = 15
#: How long the attacker spins or holds its memory: the victim's calls must all be done by then.
SPIN_S = 25

SEED = program(f"""
    import js
    from pyodide.ffi import create_proxy
    secret = {SECRET!r}
    hoard = bytearray({MARKER!r} * {MARKER_COPIES})
    open('secret.txt', 'w').write({FILE_SECRET!r})
    open('output/victim-out.txt', 'w').write({OUTPUT_SECRET!r})
    inbox = []
    try:  # a program of the victim's own: its channel, what it hears there, what it says
        channel = js.BroadcastChannel.new('cohost')
        channel.onmessage = create_proxy(lambda event: inbox.append(str(event.data)))
        js.setInterval(create_proxy(lambda: channel.postMessage({MESSAGE_SECRET!r})), 50)
    except Exception:
        pass
    int(js.Deno.pid)
""")
#: The victim's state after an attack, as it sees it: every part intact, nothing forged heard.
CHECK = program(f"""
    import js
    try:
        stored = bool(await js.caches.match('http://cohost/stored'))
    except Exception:
        stored = False
    (secret == {SECRET!r}, open('secret.txt').read() == {FILE_SECRET!r},
     open('output/victim-out.txt').read() == {OUTPUT_SECRET!r}, hoard.count({MARKER!r}) == {MARKER_COPIES},
     open('data/victim.txt').read() == {DATA_TEXT!r}, [m for m in inbox if 'FORGED' in m], stored)
""")
INTACT = "(True, True, True, True, True, [], False)"
PID = "import js\nint(js.Deno.pid)"


# --- the server, and a victim and an attacker in one of its processes ------------------------


@dataclass
class Cohosting:
    client: Client
    server: anyio.abc.Process
    state: Path
    output: Path
    data: Path
    deno_dir: Path


@pytest.fixture(scope="module")
async def cohosting(anyio_backend: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cohosting]:
    root = tmp_path_factory.mktemp("cohosting")
    data, output, state = root / "data", root / "output", root / "state"
    data.mkdir()
    (data / "victim.txt").write_text(DATA_TEXT)
    bridge = root / "upstreams.json"
    calc = {"command": sys.executable, "args": ["-m", "tests.upstreams.calc_server"], "cwd": str(REPO)}
    bridge.write_text(json.dumps({"mcpServers": {"calc": calc}}))
    cache = Settings().cache_dir  # Deno and Pyodide stay where they were fetched
    env = {
        "MCP_SANDBOX_BACKEND": "pyodide",
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "4",
        "MCP_SANDBOX_POOL_SIZE": "0",
        "MCP_SANDBOX_STATE_DIR": str(state),
        "MCP_SANDBOX_OUTPUT_DIR": str(output),
        "MCP_SANDBOX_DATA_DIR": str(data),
        "MCP_SANDBOX_MEMORY_MB": "256",
        "MCP_SANDBOX_BRIDGE_CONFIG": str(bridge),
        "MCP_SANDBOX_CACHE_DIR": str(cache),
    }
    async with http_server(**env) as (port, server), Client(f"http://127.0.0.1:{port}/mcp") as client:
        yield Cohosting(client, server, state, output, data, cache / "deno")


def runners(server: anyio.abc.Process) -> list[int]:
    """The Deno runner processes under the server."""
    return [pid for pid, command in process_tree(server.pid).items() if b"runner.ts" in command]


@dataclass
class Pair:
    """A victim and an attacker session in runner process `pid`."""

    cohosting: Cohosting
    victim: str
    attacker: str
    pid: int

    @property
    def client(self) -> Client:
        return self.cohosting.client

    async def attack(self, code: str, timeout: float = 20) -> Reply:
        return await send(self.client, code, self.attacker, timeout)

    async def victim_breach(self) -> str | None:
        """How the victim's state shows the attack, or None."""
        seen = await send(self.client, CHECK, self.victim, timeout=ANSWER_S)
        if seen.get("session_lost") or seen.get("session_restored"):
            return f"the victim lost its live state: {seen.summary()}"
        return None if seen.get("result") == INTACT else f"the victim's state changed: {seen.summary()}"


async def reset(client: Client, *sessions: str) -> None:
    for session in sessions:
        with anyio.fail_after(60):
            await client.call_tool("reset_session", {"session_id": session})


async def pid_of(client: Client, session: str, code: str = PID) -> int:
    reply = await send(client, code, session, timeout=ANSWER_S)
    assert reply.get("success") is True, reply.summary()
    return int(str(reply.get("result")))


@asynccontextmanager
async def pair(cohosting: Cohosting, name: str, *, seed: bool = True) -> AsyncIterator[Pair]:
    """A seeded victim and an attacker in the process the anchor session keeps alive; both ended
    after. Where the anchor's process takes no new sandbox (a sandbox there was given up), the
    anchor moves first."""
    client = cohosting.client
    victim, attacker = f"victim-{name}", f"attacker-{name}"
    for _ in range(2):
        anchor = await pid_of(client, "anchor")
        victim_pid = await pid_of(client, victim, SEED if seed else PID)
        attacker_pid = await pid_of(client, attacker)
        if anchor == victim_pid == attacker_pid:
            break
        await reset(client, victim, attacker, "anchor")
    else:
        pytest.fail(f"the sessions are in processes {anchor}, {victim_pid}, {attacker_pid}")
    assert victim_pid in runners(cohosting.server), "the sessions' process is the server's runner"
    try:
        yield Pair(cohosting, victim, attacker, victim_pid)
    finally:
        await reset(client, victim, attacker)


# --- checks: each returns how the attack got through, or None --------------------------------

PairCheck = Callable[[Pair, Reply], Awaitable[str | None]]


def shows_none(*secrets_: str) -> PairCheck:
    async def check(pair: Pair, reply: Reply) -> str | None:
        found = [secret for secret in secrets_ if secret.lower() in reply.dump().lower()]
        return f"the attacker's reply shows {found}" if found else None

    return check


async def host_files_intact(pair: Pair, reply: Reply) -> str | None:
    """The host's data/ and the victim's output folder (where the server copied its output/ file)
    are as they were."""
    if (pair.cohosting.data / "victim.txt").read_text() != DATA_TEXT:
        return "the host's data/victim.txt changed"
    copies = [path for path in pair.cohosting.output.rglob("victim-out.txt") if pair.victim in path.parts]
    if not copies:
        pytest.fail("the victim's output file never reached the host, so this proves nothing")
    changed = [path for path in copies if path.read_text() != OUTPUT_SECRET]
    return f"the victim's output file on the host changed: {changed}" if changed else None


async def nothing_stored(pair: Pair, reply: Reply) -> str | None:
    """The sandbox has no Cache API; a worker it starts has one, which keeps nothing, and no other
    web storage exists (should a Deno release add one, this says so)."""
    tried = ast.literal_eval(str(reply.get("result")))
    if "NotCapable" not in tried["caches"]:
        return f"the sandbox has a Cache API: {tried['caches']}"
    if tried["a worker's caches"] == "stored":
        return "a worker the attacker started kept what it put in its Cache API"
    other = {name: kind for name, kind in tried.items() if "caches" not in name and kind != "undefined"}
    if other:
        return f"the sandbox has web storage to check for what it shares: {other}"
    folder = pair.cohosting.deno_dir / "location_data"
    if folder.is_dir():
        for path in folder.rglob("*"):
            if path.is_file() and STORED.encode() in path.read_bytes():
                return f"{path} holds what the attacker stored"
    return None


async def few_markers(pair: Pair, reply: Reply) -> str | None:
    """The attacker found the marker no more often than its own copies of it explain."""
    result = str(reply.get("result"))
    counts = re.fullmatch(r"\((\d+), (\d+), (\d+), (\d+)\)", result)
    if counts is None:
        pytest.fail(f"the memory scan did not run, so it proves nothing: {reply.summary()}")
    in_memory, _, _, in_buffers = (int(count) for count in counts.groups())
    if in_memory > 1000 or in_buffers > 0:
        return f"the attacker found the victim's marker: {result}"
    return None


# --- the attacks: one program each, checked on the host and in the victim --------------------


@dataclass(frozen=True)
class CohostAttack:
    """The attacker's program, and the check that proves it failed (the victim's state is checked
    after every attack too)."""

    name: str
    code: str
    check: PairCheck
    timeout: float = 20


#: Starts a worker of the program's own through node:worker_threads (which the worker cannot
#: refuse), running `body` with `parentPort` in scope; what it posts lands in `said`.
NESTED = """
async def nested_worker(body, said):
    threads = await js.eval("import('node:worker_threads')")
    code = "import('node:worker_threads').then(async ({ parentPort }) => {" + body + "})"
    worker = threads.Worker.new(code, js.JSON.parse('{"eval": true}'))
    worker.on("message", create_proxy(lambda message: said.append(str(message))))
    for _ in range(100):  # a new worker takes a while to start on a busy machine
        if said:
            return
        await asyncio.sleep(0.1)
"""

#: Defines `reach(*roots)`: every string and buffer reachable from the worker's globals (and
#: `roots`) by own data properties and prototypes (no getter is called), as (the strings, joined
#: by spaces; the buffers), and `latin1(buffer)`, a buffer's bytes as text.
REACH = """
import js
reach = js.eval('''(...roots) => {
  const strings = [], buffers = [], seen = new Set(), stack = [globalThis, ...roots];
  while (stack.length) {
    let object = stack.pop();
    if (object instanceof WebAssembly.Memory) object = object.buffer;
    if (object === null || (typeof object !== "object" && typeof object !== "function")) continue;
    if (seen.has(object)) continue;
    seen.add(object);
    if (object instanceof ArrayBuffer || object instanceof SharedArrayBuffer) buffers.push(object);
    else if (ArrayBuffer.isView(object)) stack.push(object.buffer);
    else {
      let keys = [];
      try {
        keys = Reflect.ownKeys(object);
        stack.push(Reflect.getPrototypeOf(object));
      } catch { continue; }
      for (const key of keys) {
        let value;
        try { value = Reflect.getOwnPropertyDescriptor(object, key)?.value; } catch { continue; }
        if (typeof value === "string") strings.push(value);
        else stack.push(value);
      }
    }
  }
  return [strings.join(" "), buffers];
}''')
latin1 = js.eval("(buffer) => Buffer.from(buffer).toString('latin1')")
"""

REALM = REACH + program(
    """
    import builtins, gc, re, sys
    pattern = re.compile(@PATTERN@)
    found = set()
    def look(value):
        if isinstance(value, str):
            found.update(pattern.findall(value))
    for module in list(sys.modules.values()):
        for value in list(getattr(module, "__dict__", {}).values()):
            look(value)
    for held in gc.get_objects():
        if isinstance(held, (dict, list)):
            for value in list(held.values() if isinstance(held, dict) else held):
                look(value)
    text, buffers = reach()
    look(str(text))
    for name in ("secret", "hoard", "inbox"):
        for where in (js.globalThis, js.self, builtins):
            look(str(getattr(where, name, "")))
    # What it can change is its own: this interpreter, this realm.
    builtins.secret = js.globalThis.secret = "FORGED"
    sorted(found)
    """
).replace("@PATTERN@", repr(PATTERN))

FILES = program(
    """
    import os, re
    pattern = re.compile(@PATTERN@)
    found, wrote = set(), {}
    for root, folders, files in os.walk("/"):
        folders[:] = [f for f in folders if os.path.join(root, f) not in ("/proc", "/dev", "/sys", "/lib")]
        for name in files:
            try:
                with open(os.path.join(root, name), errors="replace") as file:
                    found.update(pattern.findall(file.read(1_000_000)))
            except OSError:
                pass
    # The victim's files, by the names it gave them, and its copies of data/ and output/.
    for path in ("secret.txt", "/home/sandbox/secret.txt", "output/victim-out.txt", "data/victim.txt"):
        try:
            if os.path.exists(path):
                os.chmod(path, 0o644)
            with open(path, "w") as file:
                file.write("FORGED")
            wrote[path] = "written"
        except OSError as error:
            wrote[path] = type(error).__name__
    sorted(found), wrote
    """
).replace("@PATTERN@", repr(PATTERN))

MESSAGES = program(
    """
    import asyncio, js
    from pyodide.ffi import create_proxy
    heard, tried = [], {}
    try:
        channel = js.BroadcastChannel.new("cohost")
        channel.onmessage = create_proxy(lambda event: heard.append(str(event.data)))
        channel.postMessage("FORGED by the attacker")
        tried["direct"] = "opened"
    except Exception as error:
        tried["direct"] = type(error).__name__
    said = []
    await nested_worker('''
      const channel = new BroadcastChannel("cohost");
      channel.onmessage = (event) => parentPort.postMessage(String(event.data));
      setInterval(() => channel.postMessage("FORGED by the attacker's worker"), 50);
      parentPort.postMessage("started");
    ''', said)
    await asyncio.sleep(1.5)
    tried, heard, said
    """
)

STORAGE = program(
    """
    import asyncio, js
    from pyodide.ffi import create_proxy
    tried = {}
    try:
        cache = await js.caches.open("cohost")
        await cache.put("http://cohost/stored", js.Response.new("@STORED@"))
        tried["caches"] = "stored"
    except Exception as error:
        tried["caches"] = f"{type(error).__name__}: {str(error)[:120]}"
    for name in ("localStorage", "sessionStorage", "indexedDB", "navigator.storage", "Deno.openKv"):
        tried[name] = str(js.eval(f"typeof globalThis.{name}"))
    said = []
    await nested_worker('''
      try {
        const cache = await caches.open("cohost");
        await cache.put("http://cohost/stored", new Response("@STORED@"));
        parentPort.postMessage("stored");
      } catch (error) { parentPort.postMessage(String(error).slice(0, 120)); }
    ''', said)
    tried["a worker's caches"] = said[0] if said else "no answer"
    tried
    """
).replace("@STORED@", STORED)

MEMORY = REACH + program(
    """
    import ctypes
    needle = @MARKER@ * 4
    # All of this interpreter's linear memory, up to the top of a fresh allocation.
    top_block = bytearray(8 * 2**20)
    top = ctypes.addressof(ctypes.c_char.from_buffer(top_block)) + len(top_block)
    in_memory, start, chunk = 0, 1024, 4 * 2**20
    while start < top:
        in_memory += ctypes.string_at(start, min(chunk + len(needle), top - start)).count(needle)
        start += chunk
    # Every buffer, shared buffer and WebAssembly memory in this worker's reach; Atomics on a
    # shared one would wake whoever waits on it.
    shared_one = js.eval("(b) => b instanceof SharedArrayBuffer")
    notify = js.eval("(b) => { try { Atomics.notify(new Int32Array(b, 0, 1), 0) } catch {} }")
    _, buffers = reach()
    shared = hits = 0
    for buffer in buffers:
        if shared_one(buffer):
            shared += 1
            notify(buffer)
        hits += str(latin1(buffer)).count(needle.decode("latin1"))
    (in_memory, len(buffers), shared, hits)
    """
).replace("@MARKER@", repr(MARKER))

#: Every shared buffer in reach of the worker's globals and the `pyodide_js` module: a large one
#: would be the process's (the clean memory every sandbox there goes back to), so it is overwritten.
SHARED = REACH + program(
    """
    import pyodide_js
    _, buffers = reach(pyodide_js)
    poison = js.eval('''(buffer) => {
      if (!(buffer instanceof SharedArrayBuffer)) return -1;
      if (buffer.byteLength > 65536) new Uint8Array(buffer).fill(0xab);
      return buffer.byteLength;
    }''')
    sorted(size for size in (poison(buffer) for buffer in buffers) if size >= 0)
    """
)


async def the_process_starts_clean(pair: Pair, reply: Reply) -> str | None:
    """No large shared memory was in reach, and sandboxes started in the process since compute as
    they should."""
    sizes = ast.literal_eval(str(reply.get("result")))
    if any(size > 65536 for size in sizes):
        return f"the attacker reached the process's shared memory: {sizes} bytes"
    for round_ in range(2):
        session = f"after-{pair.attacker}-{round_}"
        checked = await send(pair.client, "import js\n(int(js.Deno.pid), sum(range(10)))", session, ANSWER_S)
        await reset(pair.client, session)
        if checked.get("result") != f"({pair.pid}, 45)":
            return f"a sandbox started in the process since does not compute: {checked.summary()}"
    return None


#: The process's sandboxes read one copy of the standard library's zip (stdlib.ts): the attacker
#: writes into its own, through a write, or through a shared mapping flushed back (each is the
#: first change of a sandbox's copy, so each attack takes one path).
STDLIB_WRITE = program(
    """
    import glob
    path = glob.glob('/lib/python*.zip')[0]
    with open(path, 'r+b') as f:
        f.seek(64)
        f.write(b'ATTACK' * 64)
    open(path, 'rb').read().count(b'ATTACK')
    """
)
STDLIB_GLOBALS = program(
    """
    import glob, js
    saved = js.globalThis.SharedArrayBuffer, js.globalThis.Uint8Array
    js.globalThis.SharedArrayBuffer, js.globalThis.Uint8Array = js.Array, js.Object
    try:
        path = glob.glob('/lib/python*.zip')[0]
        with open(path, 'r+b') as f:
            f.seek(64)
            f.write(b'ATTACK' * 64)
    finally:
        js.globalThis.SharedArrayBuffer, js.globalThis.Uint8Array = saved
    open(path, 'rb').read().count(b'ATTACK')
    """
)
STDLIB_MAPPED = program(
    """
    import glob, mmap
    path = glob.glob('/lib/python*.zip')[0]
    with open(path, 'r+b') as f:
        mapping = mmap.mmap(f.fileno(), 0)
        mapping[4096:4102] = b'ATTACK'
        mapping.flush()
        mapping.close()
    open(path, 'rb').read().count(b'ATTACK')
    """
)
#: Every typed array on shared memory that Emscripten's file system calls a replaced method on, the
#: attacker overwrites; an import then reads the zip through that file system.
STDLIB_HOOKED = program(
    """
    import js
    js.eval('''(() => {
      const original = Uint8Array.prototype.subarray;
      Object.defineProperty(Uint8Array.prototype, "subarray", {
        configurable: true,
        writable: true,
        value: function (...args) {
          globalThis.called = (globalThis.called ?? 0) + 1;
          if (this.buffer instanceof SharedArrayBuffer && this.buffer.byteLength > 65536) {
            globalThis.poisoned = (globalThis.poisoned ?? 0) + 1;
            new Uint8Array(this.buffer).fill(0x41);
          }
          return original.apply(this, args);
        },
      });
    })()''')
    try:
        import fractions
    except Exception as error:
        print(type(error).__name__, error)
    count = lambda name: int(getattr(js.globalThis, name, None) or 0)
    {"hook called": count("called"), "shared memory handed to it": count("poisoned")}
    """
)
#: The zip's sha256 as a sandbox reads it, once it has imported a module not imported before.
STDLIB_SHA = program(
    """
    import fractions, glob, hashlib
    hashlib.sha256(open(glob.glob('/lib/python*.zip')[0], 'rb').read()).hexdigest()
    """
)


async def stdlib_as_shipped(pair: Pair, reply: Reply) -> str | None:
    """The victim, and a sandbox started in the process since, read the zip as Pyodide ships it;
    no hooked method was handed shared memory."""
    result = ast.literal_eval(str(reply.get("result")))
    landed = result.get("hook called") if isinstance(result, dict) else result
    if not landed:
        pytest.fail(
            f"the attack did not land in the attacker's own copy, so this proves nothing: {reply.summary()}"
        )
    if isinstance(result, dict) and result["shared memory handed to it"]:
        return f"the file system handed a replaced method shared memory: {result}"
    shipped = next(pair.cohosting.deno_dir.glob("npm/*/pyodide/*/python_stdlib.zip"))
    expected = repr(hashlib.sha256(shipped.read_bytes()).hexdigest())
    session = f"after-{pair.attacker}"
    for who in (pair.victim, session):
        seen = await send(pair.client, STDLIB_SHA, who, ANSWER_S)
        if seen.get("result") != expected:
            return f"{who} reads another standard library than Pyodide's: {seen.summary()}"
    await reset(pair.client, session)
    return None


ATTACKS: list[CohostAttack] = [
    # 1. the victim's variables, through this interpreter and everything in the worker's realm
    CohostAttack("variables_through_the_realm", REALM, shows_none(SECRET, MESSAGE_SECRET, TOOL_SECRET)),
    # 2. the victim's files: its working directory, its output/ and its copy of data/
    CohostAttack(
        "files_of_the_victim",
        FILES,
        all_of(shows_none(FILE_SECRET, OUTPUT_SECRET), host_files_intact),
        timeout=40,
    ),
    # 3. the victim's messages on a BroadcastChannel, which Deno delivers across the process
    CohostAttack("broadcast_channel", NESTED + MESSAGES, shows_none(MESSAGE_SECRET)),
    # 4. web storage kept by the process or the Deno dir (a persistent channel between sandboxes)
    CohostAttack("web_storage", NESTED + STORAGE, nothing_stored),
    # 5. the victim's memory, from this interpreter's own and every buffer in reach
    CohostAttack("memory_of_the_victim", MEMORY, few_markers, timeout=40),
    # 6. what the process's sandboxes share: its memory snapshot and its clean memory
    CohostAttack("shared_memory_of_the_process", SHARED, the_process_starts_clean),
    # 7. the standard library's zip, one copy for the process's sandboxes: written to, or mapped
    CohostAttack("standard_library_written_over", STDLIB_WRITE, stdlib_as_shipped, timeout=40),
    CohostAttack(
        "standard_library_written_with_globals_replaced", STDLIB_GLOBALS, stdlib_as_shipped, timeout=40
    ),
    CohostAttack("standard_library_mapped_and_flushed", STDLIB_MAPPED, stdlib_as_shipped, timeout=40),
    CohostAttack("standard_library_through_a_hooked_method", STDLIB_HOOKED, stdlib_as_shipped, timeout=40),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=[attack.name for attack in ATTACKS])
async def test_attack(attack: CohostAttack, cohosting: Cohosting) -> None:
    async with pair(cohosting, attack.name) as both:
        reply = await both.attack(attack.code, attack.timeout)
        if reply.get("success") is not True:
            pytest.fail(f"the attack itself failed, so it proves nothing: {reply.summary()}")
        breach = await attack.check(both, reply) or await both.victim_breach()
    assert breach is None, f"{attack.name} got through: {breach}\nreply: {reply.summary()}"


# --- the runner's channels --------------------------------------------------------------------

#: A result for every run id and every sandbox number, posted as the runner's own messages are.
FORGED_OUTCOME = {
    "success": True,
    "stdout": "",
    "stderr": "",
    "result": "'FORGED'",
    "error_type": None,
    "error": None,
    "truncated": False,
}
FORGE_POSTS = program(f"""
    import js
    forge = js.eval('''(outcome) => setInterval(() => {{
      const fatal = JSON.stringify({{ type: "fatal", message: "FORGED" }});
      for (let sandbox = 0; sandbox < 8; sandbox++) {{
        postMessage({{ id: null, sandbox, exiting: false, json: fatal }});
        for (let id = 1; id <= 60; id++) {{
          const json = JSON.stringify({{ type: "result", id, outcome: JSON.parse(outcome) }});
          postMessage({{ id, sandbox, json, exiting: false }});
        }}
      }}
    }}, 20)''')
    forge({json.dumps(FORGED_OUTCOME)!r})
    'armed'
""")
#: Bytes with no newline on the process's stdout, every millisecond, by each way a worker has
#: (once the attacker's own result is out).
STRAY_BYTES = program("""
    import js
    fs = await js.eval("import('node:fs')")
    js.eval('''(fs) => setTimeout(() => setInterval(() => {
      Deno.stdout.writeSync(new Uint8Array([120]));
      fs.writeSync(1, "x");
    }, 1), 200)''')(fs)
    'armed'
""")
#: The victim's run while the attacker's timer forges or writes: it must come back as itself.
GENUINE = "import time\ntime.sleep(0.3)\n'genuine'"


@pytest.mark.parametrize("arming", [FORGE_POSTS, STRAY_BYTES], ids=["forged_posts", "stray_bytes_on_stdout"])
async def test_the_victims_results_stay_its_own(arming: str, cohosting: Cohosting) -> None:
    """Posts naming another sandbox's number and every run id, and bytes that would swallow the
    runner's next line, from a timer in the attacker's worker while the victim runs."""
    async with pair(cohosting, "results") as both:
        armed = await both.attack(arming)
        assert armed.get("result") == "'armed'", armed.summary()
        for _ in range(4):
            got = await send(both.client, GENUINE, both.victim, timeout=ANSWER_S)
            assert got.get("result") == "'genuine'", f"the victim's result was not its own: {got.summary()}"
        assert await both.victim_breach() is None


TOOL_RUN = f"all(tools.calc.shout(text={TOOL_SECRET!r}) == {TOOL_SECRET.upper()!r} for _ in range(40))"
#: While the victim's tool calls come and go: every string and buffer in the attacker's reach.
TOOL_WATCH = REACH + program(
    """
    import asyncio, re
    pattern = re.compile(@PATTERN@, re.IGNORECASE)
    found = set()
    for _ in range(30):
        text, buffers = reach()
        found.update(pattern.findall(str(text)))
        for buffer in buffers:
            found.update(pattern.findall(str(latin1(buffer))))
        await asyncio.sleep(0.1)
    sorted(found)
    """
).replace("@PATTERN@", repr(PATTERN))


async def test_the_victims_tool_replies_stay_its_own(cohosting: Cohosting) -> None:
    """A bridged tool's replies to the victim (in its own shared memory, or on the runner's stdin)
    while the attacker watches everything in its reach."""
    async with pair(cohosting, "tools") as both:
        replies: dict[str, Reply] = {}

        async def run(session: str, code: str) -> None:
            replies[session] = await send(both.client, code, session, timeout=40)

        async with anyio.create_task_group() as group:
            group.start_soon(run, both.attacker, TOOL_WATCH)
            group.start_soon(run, both.victim, TOOL_RUN)
        assert replies[both.victim].get("result") == "True", replies[both.victim].summary()
        watched = replies[both.attacker]
        assert watched.get("success") is True, watched.summary()
        assert await shows_none(TOOL_SECRET)(both, watched) is None, watched.summary()
        assert await both.victim_breach() is None


def marked_call(
    client: Client, code: str, session_id: str, *, timeout: float, within: float
) -> Callable[[str, anyio.Event, list[Reply]], Awaitable[None]]:
    """A call of `code` to start in a task group: it sets `reached` once the program prints
    `marker` (heard as progress), and adds its reply to `replies`; `within` bounds it."""

    async def run(marker: str, reached: anyio.Event, replies: list[Reply]) -> None:
        async def heard(progress: float, total: float | None, message: str | None) -> None:
            if message and marker in message:
                reached.set()

        arguments = {"code": code, "session_id": session_id, "timeout": timeout}
        with anyio.fail_after(within):
            response = await client.call_tool("execute_python", arguments, progress_callback=heard)
        text = "".join(getattr(block, "text", "") for block in response.content)
        replies.append(Reply(bool(response.is_error), text, response.structured_content))

    return run


def runner_token(pid: int) -> str:
    """The token runner process `pid` got in its environment (RUNNER_TOKEN_ENV)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    prefix = f"{RUNNER_TOKEN_ENV}=".encode()
    return next(item[len(prefix) :].decode() for item in environ if item.startswith(prefix))


#: The attacker asks for the runner's token in the environment, then reads the runner's stdin
#: through node's fs (its readSync reads fd 0 itself): one byte first, which tears the next line in
#: two, then whatever the host sends any sandbox of the process, until it holds a whole line.
READ_STDIN = program("""
    import js, time
    got = ""
    for ask in (lambda: js.Deno.env.get("@ENV@"), lambda: getattr(js.process.env, "@ENV@")):
        try:
            got += str(ask())
        except Exception as error:
            got += type(error).__name__
    fs = await js.eval("import('node:fs')")
    def read(size):
        buffer = js.Uint8Array.new(size)
        return bytes(buffer.subarray(0, fs.readSync(0, buffer)).to_py()).decode(errors="replace")
    print("reading", flush=True)
    got += "|" + read(1)
    deadline = time.monotonic() + 120
    while got.count("\\n") < 2 and time.monotonic() < deadline:
        got += read(65536)
    got[-30000:]
""").replace("@ENV@", RUNNER_TOKEN_ENV)

#: A sealed host line (protocol.py): base64 of a nonce, the ciphertext and its tag.
SEALED_LINE = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")


async def test_a_sandbox_that_reads_the_runners_stdin_reads_only_sealed_lines(cohosting: Cohosting) -> None:
    """node:fs and process.stdin reach the runner's stdin from any worker, so a sandbox reads, and
    takes, the host's lines for the others. They are sealed (protocol.py): what it reads is no
    other sandbox's code, and none of it opens without the process's token (RUNNER_TOKEN_ENV),
    which it never finds, there or in the environment. What it takes costs the sandbox whose line
    that was that message (its call times out), not the process: NOT PROTECTED (docs/security.md)."""
    client = cohosting.client
    async with pair(cohosting, "stdin", seed=False) as both:
        token = runner_token(both.pid)
        reading = anyio.Event()
        reply: list[Reply] = []
        async with anyio.create_task_group() as group:
            read = marked_call(client, READ_STDIN, both.attacker, timeout=150, within=200)

            async def attack() -> None:
                try:
                    await read("reading", reading, reply)
                finally:
                    reading.set()  # a call that ends before it reads is said below, not waited for

            group.start_soon(attack)
            with anyio.fail_after(60):
                await reading.wait()
            assert not reply, f"the attacker's call ended before it read: {reply[0].summary()}"
            # Each line is the attacker's about half the time: the first it reaches it tears, and
            # the victim's call whose line that was times out, its sandbox given up.
            for attempt in range(12):
                probe = f"THEFT-PROBE-{attempt}"
                got = await send(client, repr(probe), both.victim, timeout=3)
                if got.get("result") != repr(probe):
                    break
            else:
                pytest.fail("the attacker took none of twelve lines")
            # Then lines on the anchor's sandbox, in the same process, until the attacker has a whole one.
            while not reply:
                await send(client, "'THEFT-STOP'", "anchor", timeout=3)
        assert reply[0].get("success") is True, f"a torn line ended the process: {reply[0].summary()}"
        captured = ast.literal_eval(str(reply[0].get("result")))
        env, _, read = captured.partition("|")
        whole = read.split("\n")[1:-1]  # the first is torn, the last may be
        assert whole and all(SEALED_LINE.fullmatch(line) for line in whole), (
            f"the attacker read lines that are not sealed: {read[:2000]}"
        )
        for plain in ('"code"', '"type"', "THEFT", token):
            assert plain not in captured, f"the attacker read {plain!r} on the runner's stdin: {read[:2000]}"
        assert token not in env, "the attacker found the runner's token in its environment"
    # The victim's sandbox was given up (its call waited for the line it never got), so its process
    # takes no new sandbox: the anchor moves on, and the process ends.
    await reset(client, "anchor")


async def test_the_runner_token_never_travels_on_its_stdin(tmp_path: Path) -> None:
    """The token that marks the runner's genuine lines is in its environment, for its main thread
    alone (each worker has no env permission), never in a host line a sandbox could read."""
    async with anyio.create_task_group() as group:
        backend = PyodideBackend(Settings(backend="pyodide"), ExecutorHooks(tools=None), group, Path("deno"))
        backend._pyodide_dir = tmp_path
        init = backend._init(tmp_path)
        assert "token" not in init, init
        assert f"--allow-env={RUNNER_TOKEN_ENV}" in backend.command(tmp_path)


# --- CPU and memory: the victim still answers -------------------------------------------------

STARVE = {
    "python_busy_loop": program("""
        print("spinning", flush=True)
        while True:
            pass
    """),
    "javascript_busy_loop": program("""
        import js
        print("spinning", flush=True)
        js.eval("while (true) {}")
    """),
    # Its WebAssembly memory's maximum (MCP_SANDBOX_MEMORY_MB), then held while the victim runs.
    "memory_hog": program(f"""
        import time
        held = []
        try:
            while True:
                held.append(bytearray(8 * 2**20))
        except MemoryError:
            pass
        print("spinning", flush=True)
        time.sleep({SPIN_S - 10})
        len(held)
    """),
}


@pytest.mark.parametrize("hog", list(STARVE), ids=list(STARVE))
async def test_an_attacker_that_spins_or_hogs_memory_leaves_the_victim_answering(
    hog: str, cohosting: Cohosting
) -> None:
    client = cohosting.client
    async with pair(cohosting, hog) as both:
        spinning = anyio.Event()
        outcome: list[Reply] = []
        async with anyio.create_task_group() as group:
            attack = marked_call(client, STARVE[hog], both.attacker, timeout=SPIN_S, within=SPIN_S + 60)
            group.start_soon(attack, "spinning", spinning, outcome)
            with anyio.fail_after(60):
                await spinning.wait()
            for turn in range(3):
                with anyio.fail_after(ANSWER_S):
                    got = await send(client, f"secret, {turn}", both.victim, timeout=ANSWER_S)
                assert got.get("result") == repr((SECRET, turn)), got.summary()
            assert not outcome, "the attacker stopped before the victim's calls were done"
            assert await both.victim_breach() is None
    # The loops end at their deadline; the hog, with its MemoryError caught, when it lets go.
    assert outcome[0].get("success") is (hog == "memory_hog"), outcome[0].summary()
    if hog == "javascript_busy_loop":
        # Worker.terminate does not stop a JavaScript loop (deno#35657): its process was retired
        # and ends once its sessions are; the anchor's moves, and the loop stops with it.
        await reset(client, "anchor")
        with anyio.fail_after(60):
            while both.pid in runners(cohosting.server):
                await anyio.sleep(0.1)


# --- the whole process: its failure is every co-hosted sandbox's ------------------------------


async def test_an_attacker_that_ends_the_process_costs_the_others_their_live_state_only(
    cohosting: Cohosting,
) -> None:
    """NOT PROTECTED (docs/security.md): a sandbox can end its whole process (node's
    process.kill of its own pid needs no permission; so can a V8 heap out of memory). The blast
    radius is the process: each co-hosted session comes back from its last checkpoint, saying so."""
    client = cohosting.client
    async with pair(cohosting, "process") as both:
        with anyio.fail_after(60):
            while not state_file(cohosting.state, both.victim).exists():
                await anyio.sleep(0.1)
        ended = await both.attack("import js\njs.process.kill(js.process.pid, 'SIGKILL')")
        assert ended.get("error_type") == "SandboxCrash", ended.summary()
        with anyio.fail_after(30):
            while both.pid in runners(cohosting.server):
                await anyio.sleep(0.05)
        said = await send(client, "secret, open('secret.txt').read()", both.victim, timeout=ANSWER_S)
        if not said.get("success"):  # the death was seen only as the call was sent: said, then run
            assert said.get("error_type") == "SandboxCrash", said.summary()
            ran = await send(client, "secret, open('secret.txt').read()", both.victim, timeout=ANSWER_S)
            said = Reply(ran.is_error, ran.text, {**(said.result or {}), "result": ran.get("result")})
        assert said.get("session_restored") is True, said.summary()
        assert said.get("result") == repr((SECRET, FILE_SECRET)), said.summary()


#: Replaces typed arrays' getters and methods, WeakMap's get and the Uint8Array and Int32Array
#: constructors with versions that overwrite any large shared buffer they are handed, then put the
#: originals back (so the realm check finds nothing), and ends the program: the worker goes back
#: to its clean point through them.
HOOK_TYPED_ARRAYS = program(
    """
    import js, os
    js.eval('''(() => {
      const U8 = Uint8Array, proto = Object.getPrototypeOf(U8.prototype), saved = [];
      const bufferOf = Object.getOwnPropertyDescriptor(proto, "buffer").get;
      const restore = () => { for (const [target, key, d] of saved) Object.defineProperty(target, key, d); };
      const poison = (buffer) => {
        if (buffer instanceof SharedArrayBuffer && buffer.byteLength > 16 * 2 ** 20) {
          new U8(buffer).fill(0xab);
          restore();
        }
      };
      const look = (value) => {
        try {
          if (ArrayBuffer.isView(value)) poison(Reflect.apply(bufferOf, value, []));
        } catch {}
      };
      const replace = (target, key, make) => {
        const d = Object.getOwnPropertyDescriptor(target, key);
        saved.push([target, key, d]);
        Object.defineProperty(target, key, { ...d, ...make(d) });
      };
      for (const key of ["length", "buffer", "byteOffset", "byteLength"]) {
        replace(proto, key, (d) => ({ get() { look(this); return Reflect.apply(d.get, this, []); } }));
      }
      for (const key of ["set", "subarray", "fill", "slice"]) {
        replace(proto, key, (d) => ({ value: function (...args) {
          look(this); args.forEach(look); return Reflect.apply(d.value, this, args);
        } }));
      }
      replace(WeakMap.prototype, "get", (d) => ({ value: function (key) {
        if (key && typeof key === "object") look(key.memory);
        return Reflect.apply(d.value, this, [key]);
      } }));
      for (const name of ["Uint8Array", "Int32Array"]) {
        replace(globalThis, name, (d) => ({ value: new Proxy(d.value, { construct(target, args) {
          args.forEach((arg) => poison(arg));
          return Reflect.construct(target, args);
        } }) }));
      }
    })()''')
    os._exit(0)
    """
)


async def test_a_program_that_hooks_typed_arrays_leaves_the_clean_memory_as_it_was(
    cohosting: Cohosting,
) -> None:
    """The process's clean memory is read through intrinsics taken before any program runs: hooks
    a program puts on typed arrays never see it. Seen from the victim, whose sandbox shares it:
    after a crash, its worker goes back to the clean memory and its session comes back from its
    checkpoint on top of it, whole."""
    client = cohosting.client
    async with pair(cohosting, "intrinsics") as both:
        with anyio.fail_after(60):
            while not state_file(cohosting.state, both.victim).exists():
                await anyio.sleep(0.1)
        ended = await both.attack(HOOK_TYPED_ARRAYS)
        # Its own end is a crash (a worker that went back to poisoned memory would hang: a timeout).
        assert ended.get("error_type") in ("SandboxCrash", "Timeout"), ended.summary()
        crashed = await send(client, "import os\nos._exit(0)", both.victim, timeout=ANSWER_S)
        assert crashed.get("error_type") == "SandboxCrash", crashed.summary()
        seen = await send(client, CHECK, both.victim, timeout=ANSWER_S)
        assert seen.get("result") == INTACT, f"the victim came back broken: {seen.summary()}"
        fresh = await send(client, "import js\n(int(js.Deno.pid), sum(range(10)))", f"after-{both.attacker}")
        await reset(client, f"after-{both.attacker}")
        assert fresh.get("result") == f"({both.pid}, 45)", fresh.summary()


def test_no_attack_knows_a_secret() -> None:
    """What an attacker's program finds, it found: none holds a victim's secret (the memory scan
    knows the marker it looks for, and counts its own few copies)."""
    assert (
        len({attack.name for attack in ATTACKS}) == len({attack.code for attack in ATTACKS}) == len(ATTACKS)
    )
    programs = [attack.code for attack in ATTACKS] + [FORGE_POSTS, STRAY_BYTES, TOOL_WATCH, READ_STDIN]
    hidden = (SECRET, FILE_SECRET, OUTPUT_SECRET, MESSAGE_SECRET, TOOL_SECRET, TOOL_SECRET.upper())
    assert not [secret for secret in hidden for code in programs + list(STARVE.values()) if secret in code]
