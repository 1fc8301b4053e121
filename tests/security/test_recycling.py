"""Recycling (pyodide): a sandbox reset in place between callers must carry nothing over.

Every taint check of the red team runs here against a reused sandbox: the taint in a call without
a session, then the probe in the next such call, which lands in the same sandbox when it was
recycled (each program prints its Deno process's pid and start time first, which name its
sandbox). The tests wait on the server's log, never a fixed time: after each call, for the pool's
line saying what became of that call's sandbox (recycled, first in line; or replaced), so the next
call knows which sandbox it gets. Each test also says whether it expects the sandbox recycled or
replaced, so a recycle that quietly always replaces fails rather than passes.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_sandbox.settings import Settings
from tests.helpers import server_params, state_file
from tests.native import MODULE, fetched_wheel, native_wheel
from tests.security.harness import (
    BLOCKED,
    Attack,
    NotSeenElsewhere,
    Reply,
    ServerLog,
    World,
    attack_host,
    logged_server,
    send,
)
from tests.security.test_tables import ATTACKS

#: Printed first by every program here: which Deno process, so which sandbox, ran it: its pid (as
#: the server's log names it) and its start time (so that a reused pid is another sandbox).
WHICH_SANDBOX = "import js as _rt_js\nprint(_rt_js.Deno.pid, _rt_js.performance.timeOrigin, flush=True)\n"
#: The recycling servers log at DEBUG: the pool's line for a recycled sandbox is a debug line.
LOGGED = {"MCP_SANDBOX_LOG_LEVEL": "DEBUG"}

#: Taints a recycle cannot undo, so the sandbox is replaced instead, and why.
REPLACED = {"taint_js_globals": "its JavaScript realm changed"}

TAINTS = [
    attack
    for attack in ATTACKS
    if isinstance(attack.check, NotSeenElsewhere) and attack.expected["pyodide"] is BLOCKED
]


@pytest.fixture(scope="module")
def packages(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A packages folder with the real C extension in it, when it can be fetched (tests/native.py)."""
    folder = tmp_path_factory.mktemp("packages")
    wheel, _ = fetched_wheel()
    if wheel is not None:
        shutil.copy(wheel, folder)
    return folder


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the server keeps its sessions' checkpoints."""
    return tmp_path_factory.mktemp("recycling-state")


class Pool:
    """The server's ready pool as its log tells it: what became of a sandbox each time its caller
    gave it back. Each call here waits for that line before the next call, so at most one sandbox
    is ever being reset, and a recycled one is first in line for the next call."""

    def __init__(self, log: ServerLog) -> None:
        self.log = log
        #: Per sandbox pid: where in the log to look for its next line.
        self._read: dict[str, int] = {}

    async def given_back(self, sandbox: str) -> str:
        """What the pool did with `sandbox` once it was given back, when the log says it:
        "recycled" (ready again, first in line), "replaced" (its reset refused) or "closed" (it
        died, or was renewed after a crash)."""
        pid = sandbox.split(" ", 1)[0]
        index, said = await self.log.find(
            rf"\bsandbox {pid} was (recycled|replaced|closed)\b", self._read.get(pid, 0)
        )
        self._read[pid] = index + 1
        return said[1]


@pytest.fixture(scope="module")
async def server(
    anyio_backend: str, world: World, packages: Path, state: Path
) -> AsyncIterator[tuple[Client, Pool]]:
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide",
        MCP_SANDBOX_STATE_DIR=str(state),
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_DATA_DIR=str(world.data),
        MCP_SANDBOX_CACHE_DIR=str(Settings().cache_dir),
        MCP_SANDBOX_PACKAGES_DIR=str(packages),
        MCP_SANDBOX_PRELOAD_PACKAGES="",
        **LOGGED,
    )
    async with logged_server(params) as (connected, log):
        yield connected, Pool(log)


@pytest.fixture
def client(server: tuple[Client, Pool]) -> Client:
    return server[0]


@pytest.fixture
def pool(server: tuple[Client, Pool]) -> Pool:
    return server[1]


async def run_where(client: Client, code: str, session: str | None = None) -> tuple[str, Reply]:
    """Run `code`; return which sandbox ran it, and the reply."""
    reply = await send(client, WHICH_SANDBOX + code, session)
    return str(reply.get("stdout") or "").split("\n", 1)[0], reply


@dataclass(frozen=True)
class Use:
    """One call without a session: which sandbox ran it, its reply, and what the pool did with the
    sandbox afterwards (Pool.given_back)."""

    sandbox: str
    reply: Reply
    then: str


async def use(client: Client, pool: Pool, code: str) -> Use:
    """Run `code` without a session, and wait until the pool has recycled or replaced its sandbox."""
    sandbox, reply = await run_where(client, code)
    return Use(sandbox, reply, await pool.given_back(sandbox))


def test_every_taint_check_is_here() -> None:
    assert len(TAINTS) >= 17, [attack.name for attack in TAINTS]


@pytest.mark.parametrize("attack", TAINTS, ids=[attack.name for attack in TAINTS])
async def test_a_taint_does_not_survive_recycling(
    attack: Attack, client: Client, pool: Pool, world: World, tmp_path: Path
) -> None:
    check = attack.check
    assert isinstance(check, NotSeenElsewhere)
    async with attack_host(client, world, tmp_path, None) as host:
        tainted = await use(client, pool, host.render(attack.code))
        assert tainted.reply.get("success") is True, f"the taint itself failed: {tainted.reply.summary()}"
        probe = await use(client, pool, host.render(check.probe))
    assert probe.reply.get("result") == check.clean, f"a later caller saw the taint: {probe.reply.summary()}"
    if attack.name in REPLACED:
        assert tainted.then == "replaced", (
            f"expected a new sandbox ({REPLACED[attack.name]}), not {tainted.then}"
        )
    else:
        assert tainted.then == "recycled", (
            f"the sandbox was {tainted.then}, not recycled: the reset went untested"
        )
        assert probe.sandbox == tainted.sandbox, "the next call did not get the recycled sandbox"


#: Taints tried again in a sandbox that also loaded the real C extension (the rest are alike).
WITH_NATIVE_CODE = [
    attack
    for attack in TAINTS
    if attack.name in ("taint_globals", "taint_builtins", "taint_sys_modules", "taint_home_file")
]


@pytest.mark.parametrize("attack", WITH_NATIVE_CODE, ids=[attack.name for attack in WITH_NATIVE_CODE])
async def test_a_taint_beside_native_code_does_not_survive_recycling(
    attack: Attack, client: Client, pool: Pool, world: World, packages: Path, tmp_path: Path
) -> None:
    native_wheel()  # skips, saying why, without it
    check = attack.check
    assert isinstance(check, NotSeenElsewhere)
    load = f"import {MODULE} as _rt_d\n_rt_d.mark = 1\n_rt_d.add(2, 3)\n"
    async with attack_host(client, world, tmp_path, None) as host:
        tainted = await use(client, pool, load + host.render(attack.code))
        assert tainted.reply.get("success") is True, f"the taint itself failed: {tainted.reply.summary()}"
        probe = await use(client, pool, f"import {MODULE} as _rt_d\n" + host.render(check.probe))
        marked = await use(client, pool, f"import {MODULE} as _rt_d\nhasattr(_rt_d, 'mark')")
    assert probe.reply.get("result") == check.clean, f"a later caller saw the taint: {probe.reply.summary()}"
    assert marked.reply.get("result") == "False", marked.reply.summary()
    assert tainted.then == "recycled", (
        f"the sandbox was {tainted.then}, not recycled: the reset went untested"
    )
    assert probe.sandbox == marked.sandbox == tainted.sandbox, (
        "the next calls did not get the recycled sandbox"
    )


async def test_a_timer_left_by_javascript_never_fires(client: Client, pool: Pool) -> None:
    left = await use(
        client,
        pool,
        "from pyodide.ffi import create_proxy\n"
        "_rt_js.setTimeout(create_proxy(lambda: _rt_js.eval('globalThis.rt_fired = 1')), 300)",
    )
    assert left.reply.get("success") is True, left.reply.summary()
    assert left.then == "recycled", f"a pending timer alone should not cost a new sandbox: {left.then}"
    # The probe yields to the worker's event loop for longer than the timer's delay: a timer the
    # reset missed has fired by the time it looks.
    probe = await use(
        client, pool, "import asyncio\nawait asyncio.sleep(0.6)\n_rt_js.eval('typeof globalThis.rt_fired')"
    )
    assert probe.sandbox == left.sandbox, "the next call did not get the recycled sandbox"
    assert probe.reply.get("result") == "'undefined'", probe.reply.summary()


async def test_data_changed_by_a_program_is_sent_again(client: Client, pool: Pool, world: World) -> None:
    changed = await use(
        client,
        pool,
        "import os\nos.chmod('data', 0o755)\nos.chmod('data/victim.txt', 0o644)\n"
        "open('data/victim.txt', 'w').write('changed')\nopen('data/planted.txt', 'w').write('x')",
    )
    assert changed.reply.get("success") is True, changed.reply.summary()
    assert changed.then == "recycled", f"changing data/ alone should not cost a new sandbox: {changed.then}"
    probe = await use(
        client, pool, "import os\n(open('data/victim.txt').read(), os.path.exists('data/planted.txt'))"
    )
    assert probe.sandbox == changed.sandbox, "the next call did not get the recycled sandbox"
    expected = repr(((world.data / "victim.txt").read_text(), False))
    assert probe.reply.get("result") == expected, probe.reply.summary()
    assert (world.data / "victim.txt").read_text() != "changed"


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ctypes", "import ctypes\nctypes.string_at(id(1), 8)"),
        ("gc", "import gc\nlen(gc.get_objects()) > 0"),
        ("a JavaScript global", "_rt_js.globalThis.rtPlanted = 1"),
        ("a patched builtin prototype", "_rt_js.eval('Array.prototype.rtPlanted = 1')"),
        # Built-ins the checks themselves run on, replaced to hide a planted global from them.
        (
            "a Set.has that hides globalThis and itself",
            "_rt_js.eval('const has = Set.prototype.has;"
            " Set.prototype.has = function (v) {"
            " return v === globalThis || v === Set.prototype || Reflect.apply(has, this, [v]) };"
            " globalThis.rtPlanted = 1')",
        ),
        (
            "a Map iterator that yields nothing",
            "_rt_js.eval('const it = Map.prototype[Symbol.iterator];"
            " Map.prototype[Symbol.iterator] = function () {"
            " return this.size > 1000 ? [][Symbol.iterator]() : Reflect.apply(it, this, []) };"
            " globalThis.rtPlanted = 1')",
        ),
        (
            "a PyProxy test that calls pyodide_js a proxy",
            "import pyodide_js\n"
            "_rt_js.eval('(p, f) => { let c = Object.getPrototypeOf(p).constructor;"
            ' while (c.name !== "PyProxy") c = Object.getPrototypeOf(c);'
            " const test = c[Symbol.hasInstance];"
            " Object.defineProperty(c, Symbol.hasInstance,"
            " { value: (v) => v === f || Reflect.apply(test, c, [v]) }) }')(object(), pyodide_js)\n"
            "pyodide_js.rtPlanted = 1",
        ),
        (
            "a message listener",
            "from pyodide.ffi import create_proxy\n"
            "_rt_js.addEventListener('message', create_proxy(lambda event: None))",
        ),
        ("a grown memory", "blob = bytearray(200 * 1024 * 1024)\nlen(blob)"),
        # Each way the realm's own check (past the built-ins') finds a change, on a built-in's own
        # function, which the built-ins' check does not list.
        ("a property added to a nested object", "_rt_js.eval('Math.max.rtPlanted = 1')"),
        ("a property changed", '_rt_js.eval(\'Object.defineProperty(Math.max, "name", { value: "x" })\')'),
        ("a property deleted", "_rt_js.eval('delete Math.max.name')"),
        (
            "a property deleted and added again as it was",
            '_rt_js.eval(\'const d = Object.getOwnPropertyDescriptor(Math.max, "length");'
            ' delete Math.max.length; Object.defineProperty(Math.max, "length", d)\')',
        ),
        ("a prototype changed", "_rt_js.eval('Object.setPrototypeOf(Math.max, null)')"),
        ("an object made non-extensible", "_rt_js.eval('Object.preventExtensions(Math.max)')"),
        # What no walk of the realm reaches: a module's objects, one for every caller of the worker.
        (
            "a Node module changed through import()",
            "from pyodide.code import run_js\n"
            "await run_js(\"import('node:fs').then(m => { m.default.rtPlanted = 1 })\")",
        ),
        (
            "a Node module changed through process.getBuiltinModule",
            "_rt_js.eval(\"process.getBuiltinModule('node:os').rtPlanted = 1\")",
        ),
        ("a Node binding changed", "_rt_js.eval(\"process.binding('util').rtPlanted = 1\")"),
        # Work that finishes after the call, and state Deno keeps outside any object walked.
        ("crypto.subtle", "_rt_js.eval(\"crypto.subtle.digest('SHA-256', new Uint8Array(4))\")"),
        ("a performance mark", "_rt_js.eval(\"performance.mark('rt-planted')\")"),
        ("a Web Lock", "_rt_js.eval(\"navigator.locks.request('rt-planted', () => new Promise(() => {}))\")"),
        ("an exit code", "_rt_js.eval('Deno.exitCode = 77')"),
        ("Node's exit code", "_rt_js.eval('process.exitCode = 55')"),
        (
            "a flagged call with Set.prototype.add replaced around it",
            '_rt_js.eval("const add = Set.prototype.add;'
            " Set.prototype.add = function (v) {"
            " return typeof v === 'string' ? this : Reflect.apply(add, this, [v]) };"
            " try { process.getBuiltinModule('node:os').rtPlanted = 1 }"
            ' finally { Set.prototype.add = add }")',
        ),
    ],
)
async def test_what_reaches_past_the_checks_gets_a_new_sandbox(
    client: Client, pool: Pool, name: str, code: str
) -> None:
    reached = await use(client, pool, code)
    assert reached.reply.get("success") is True, reached.reply.summary()
    assert reached.then == "replaced", f"a sandbox that saw {name} was {reached.then}, not replaced"


async def test_an_ended_session_is_recycled_clean(client: Client, pool: Pool) -> None:
    sandbox, planted = await run_where(client, "rt_planted = 'TAINT'", "recycled")
    assert planted.get("success") is True, planted.summary()
    await client.call_tool("reset_session", {"session_id": "recycled"})
    then = await pool.given_back(sandbox)
    assert then == "recycled", f"the ended session's sandbox was {then}, not recycled"
    probe = await use(client, pool, "'rt_planted' in globals()")
    assert probe.sandbox == sandbox, "the next call did not get the recycled sandbox"
    assert probe.reply.get("result") == "False", probe.reply.summary()


#: Made at run time from its hex, so no program's text holds a copy of it.
MARKER_HEX = "5a17c0de" * 4

#: Leaves 10 MB of the marker in freed memory, some of it on top of the heap, in memory that was
#: all zero at the clean point, which a recycle writes only where a program wrote.
LEAVE_MARKERS = f"""
marker = bytes.fromhex({MARKER_HEX!r})
small = [marker + i.to_bytes(4, "little") for i in range(100_000)]
large = [bytearray(marker * (2**18 // 16)) for _ in range(20)]
del small, large
"""

#: How often the marker is in this interpreter's memory.
COUNT_MARKERS = f"""
import ctypes
needle = bytes.fromhex({MARKER_HEX!r})
top = ctypes.CDLL(None).emscripten_get_heap_size()
# Read in small pieces: each is allocated in free memory, over what it would read.
found, start, chunk = 0, 1024, 2**16
while start < top:
    found += ctypes.string_at(start, min(chunk + len(needle), top - start)).count(needle)
    start += chunk
found
"""


async def test_memory_a_program_wrote_past_the_clean_heap_is_zero_for_the_next_caller(
    client: Client, pool: Pool
) -> None:
    """A recycle leaves alone the pages that were all zero at the clean point and still are (so they
    take no memory): those a program wrote into are zeroed, and the next caller finds nothing."""
    left = await use(client, pool, LEAVE_MARKERS)
    assert left.reply.get("success") is True, left.reply.summary()
    assert left.then == "recycled", f"the sandbox was {left.then}, so the test proves nothing"
    probe = await use(client, pool, COUNT_MARKERS)
    assert probe.sandbox == left.sandbox, "the next call did not get the recycled sandbox"
    found = int(str(probe.reply.get("result")))
    # Its own needle is a few copies; the first caller left about 400,000.
    assert found < 100, f"the next caller found the marker {found} times"


#: A listener on the worker's own message channel that answers every request it sees with a
#: forged "recycled, clean" (a WorkerPost with the request's nonce, a form the runner
#: refuses) and keeps every program it is sent.
FORGER = """
_rt_js.eval('''
globalThis.rtSeen = [];
addEventListener("message", (event) => {
  const data = event.data || {};
  if (data.code) globalThis.rtSeen.push(data.code);
  if (data.type === "recycle" || data.type === "restore" || data.type === "checkpoint") {
    const json = JSON.stringify({ type: "recycled", id: data.id, clean: true, reason: null, ms: 0 });
    postMessage({ id: null, json, exiting: false, nonce: data.nonce });
  }
});
''')
"""


async def test_a_listener_cannot_forge_a_clean_recycle_or_see_the_next_caller(
    client: Client, pool: Pool
) -> None:
    forger = await use(client, pool, FORGER)
    assert forger.reply.get("success") is True, forger.reply.summary()
    assert forger.then == "replaced", f"the forger's sandbox was {forger.then}: its answer was taken"
    victim = await use(client, pool, "rt_victim_secret = 'VICTIM-MARKER-7319'")
    assert victim.sandbox != forger.sandbox
    probe = await use(client, pool, "str(list(getattr(_rt_js.globalThis, 'rtSeen', None) or []))")
    assert "VICTIM-MARKER" not in str(probe.reply.get("result")), probe.reply.summary()


async def test_a_taint_travels_with_its_checkpoint(client: Client, pool: Pool, state: Path) -> None:
    # gc.get_objects reaches every live object (a taint), and leaves the memory portable.
    carrier, tainted = await run_where(client, "import gc\nlen(gc.get_objects()) > 0", "carrier")
    assert tainted.get("success") is True, tainted.summary()
    checkpoint = state_file(state, "carrier")
    with anyio.fail_after(30):  # its checkpoint, taken in idle time after the call
        while not checkpoint.exists():
            await anyio.sleep(0.05)
    # Its process killed from outside, as the OOM killer would: the checkpoint then goes into a new
    # sandbox from the pool. (A crash inside renews the worker in the same process instead, which
    # serves only this session and is closed after it, whatever it holds: that would prove nothing.)
    await kill_sandbox(carrier)
    holder, restored = await run_where(client, "1", "carrier")
    assert restored.get("session_restored") is True, restored.summary()
    assert holder != carrier, "the session was not restored into another sandbox"
    await client.call_tool("reset_session", {"session_id": "carrier"})
    then = await pool.given_back(holder)
    assert then == "replaced", f"a sandbox restored from a tainted session was {then}, not replaced"


async def kill_sandbox(sandbox: str) -> None:
    """SIGKILL `sandbox`'s process and wait until it has ended (its pidfd is readable)."""
    pidfd = os.pidfd_open(int(sandbox.split(" ", 1)[0]))
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        with anyio.fail_after(30):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def test_plain_calls_on_a_plain_server_reuse_one_recycled_sandbox(anyio_backend: str) -> None:
    """No data folder, nothing but calls: each used sandbox is recycled, not replaced (a realm
    that Deno itself settles after the clean point once made every recycle a replacement)."""
    params = server_params(MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_POOL_SIZE="1", **LOGGED)
    async with logged_server(params) as (plain, log):
        pool = Pool(log)
        previous = await use(plain, pool, "1 + 1")
        for _ in range(3):
            assert previous.then == "recycled", f"the sandbox was {previous.then}, not recycled"
            following = await use(plain, pool, "2 + 2")
            assert following.sandbox == previous.sandbox, "the next call did not get the recycled sandbox"
            previous = following
        assert previous.then == "recycled", f"the sandbox was {previous.then}, not recycled"


#: A program's mark a recycle missed, and how the next caller's program reads it: each pair's probe
#: must find nothing, whichever sandbox it lands in.
LEFT_FOR_LATER = [
    (
        "a file in /dev/shm",
        "open('/dev/shm/rt_planted', 'w').write('TAINT')",
        "import os\n'rt_planted' in os.listdir('/dev/shm')",
    ),
    (
        "a clean file written with Date.now faked",
        "import os\np = '/lib/python313.zip'\nms = os.stat(p).st_ctime_ns // 1_000_000\n"
        "_rt_js.eval(f'globalThis.rtNow = Date.now; Date.now = () => {ms}')\n"
        "try:\n    with open(p, 'r+b') as f:\n        f.seek(-1, 2)\n        f.write(b'Q')\n"
        "finally:\n    _rt_js.eval('Date.now = globalThis.rtNow; delete globalThis.rtNow')",
        "with open('/lib/python313.zip', 'rb') as f:\n    f.seek(-1, 2)\n    last = f.read()\nlast == b'Q'",
    ),
    (
        "a chain of setImmediate callbacks",
        "_rt_js.eval('(() => { const t0 = performance.now(); let n = 0; const tick = () => {"
        " n++; if (performance.now() - t0 > 400) { globalThis.rtImmediate = 1; return }"
        " if (n < 5000000) setImmediate(tick) }; setImmediate(tick) })()')",
        "import asyncio\nawait asyncio.sleep(1)\nstr(_rt_js.eval('String(globalThis.rtImmediate)')) == '1'",
    ),
]


@pytest.mark.parametrize(
    ("name", "plant", "probe"), LEFT_FOR_LATER, ids=[name for name, _, _ in LEFT_FOR_LATER]
)
async def test_what_a_program_leaves_for_later_the_next_caller_does_not_find(
    client: Client, pool: Pool, name: str, plant: str, probe: str
) -> None:
    planted = await use(client, pool, plant)
    assert planted.reply.get("success") is True, planted.reply.summary()
    found = await use(client, pool, probe)
    assert found.reply.get("result") == "False", f"after {name}: {found.reply.summary()}"
