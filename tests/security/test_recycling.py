"""Recycling (pyodide): a sandbox reset in place between callers must carry nothing over.

Every taint check of the red team runs here against a reused sandbox: the taint in a call without
a session, then the probe in the next such calls until one lands in the same sandbox (each program
prints performance.timeOrigin first, which names its Deno process). Each test also says whether it
expects the sandbox recycled or replaced, so a recycle that quietly always replaces fails rather
than passes.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_sandbox.settings import Settings
from tests.helpers import server_params, state_file
from tests.native import MODULE, fetched_wheel, native_wheel
from tests.security.harness import BLOCKED, Attack, NotSeenElsewhere, Reply, World, attack_host, send
from tests.security.test_tables import ATTACKS

#: Printed first by every program here: which Deno process, so which sandbox, ran it.
WHICH_SANDBOX = "import js as _rt_js\nprint(_rt_js.performance.timeOrigin, flush=True)\n"
#: Calls that may go to the pool's other sandbox before the recycled one comes back (a pool of
#: one can hold two for a moment: a waiter starts a sandbox while the used one is being reset).
TRIES = 8
#: Before each try, time for the used sandbox's reset to finish (tens of milliseconds, seconds on a
#: loaded machine), so it is first in line again: a recycled sandbox goes to the front, and of two
#: the one at the back is closed.
TRY_GAP_S = 2.0  # 1 s was too short once on a loaded CI machine (the probes kept missing it)
#: Tries before a sandbox expected replaced counts as replaced: a recycled one is back within two.
TRIES_WHEN_REPLACED = 4

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


@pytest.fixture(scope="module")
async def client(anyio_backend: str, world: World, packages: Path, state: Path) -> AsyncIterator[Client]:
    params = server_params(
        MCP_SANDBOX_BACKEND="pyodide",
        MCP_SANDBOX_STATE_DIR=str(state),
        MCP_SANDBOX_POOL_SIZE="1",
        MCP_SANDBOX_DATA_DIR=str(world.data),
        MCP_SANDBOX_CACHE_DIR=str(Settings().cache_dir),
        MCP_SANDBOX_PACKAGES_DIR=str(packages),
        MCP_SANDBOX_PRELOAD_PACKAGES="",
    )
    async with Client(params) as connected:
        yield connected


async def run_where(client: Client, code: str, session: str | None = None) -> tuple[str, Reply]:
    """Run `code`; return which sandbox ran it, and the reply."""
    reply = await send(client, WHICH_SANDBOX + code, session)
    return str(reply.get("stdout") or "").split("\n", 1)[0], reply


async def next_calls_in(client: Client, sandbox: str, code: str, tries: int = TRIES) -> list[Reply]:
    """Run `code` without a session until it lands in `sandbox` (at most `tries` times): every
    reply, the last one from `sandbox` unless that sandbox was replaced."""
    replies = []
    for _ in range(tries):
        await anyio.sleep(TRY_GAP_S)
        where, reply = await run_where(client, code)
        replies.append(reply)
        if where == sandbox:
            return replies
    return replies


def landed(replies: list[Reply], sandbox: str) -> bool:
    return str(replies[-1].get("stdout") or "").startswith(sandbox)


def test_every_taint_check_is_here() -> None:
    assert len(TAINTS) >= 17, [attack.name for attack in TAINTS]


@pytest.mark.parametrize("attack", TAINTS, ids=[attack.name for attack in TAINTS])
async def test_a_taint_does_not_survive_recycling(
    attack: Attack, client: Client, world: World, tmp_path: Path
) -> None:
    check = attack.check
    assert isinstance(check, NotSeenElsewhere)
    async with attack_host(client, world, tmp_path, None) as host:
        sandbox, tainted = await run_where(client, host.render(attack.code))
        assert tainted.get("success") is True, f"the taint itself failed: {tainted.summary()}"
        tries = TRIES_WHEN_REPLACED if attack.name in REPLACED else TRIES
        probes = await next_calls_in(client, sandbox, host.render(check.probe), tries)
    for seen in probes:
        assert seen.get("result") == check.clean, f"a later caller saw the taint: {seen.summary()}"
    if attack.name in REPLACED:
        assert not landed(probes, sandbox), f"expected a new sandbox ({REPLACED[attack.name]})"
    else:
        assert landed(probes, sandbox), "the sandbox was replaced, not recycled: the reset went untested"


#: Taints tried again in a sandbox that also loaded the real C extension (the rest are alike).
WITH_NATIVE_CODE = [
    attack
    for attack in TAINTS
    if attack.name in ("taint_globals", "taint_builtins", "taint_sys_modules", "taint_home_file")
]


@pytest.mark.parametrize("attack", WITH_NATIVE_CODE, ids=[attack.name for attack in WITH_NATIVE_CODE])
async def test_a_taint_beside_native_code_does_not_survive_recycling(
    attack: Attack, client: Client, world: World, packages: Path, tmp_path: Path
) -> None:
    native_wheel()  # skips, saying why, without it
    check = attack.check
    assert isinstance(check, NotSeenElsewhere)
    load = f"import {MODULE} as _rt_d\n_rt_d.mark = 1\n_rt_d.add(2, 3)\n"
    async with attack_host(client, world, tmp_path, None) as host:
        sandbox, tainted = await run_where(client, load + host.render(attack.code))
        assert tainted.get("success") is True, f"the taint itself failed: {tainted.summary()}"
        probe = f"import {MODULE} as _rt_d\n" + host.render(check.probe)
        probes = await next_calls_in(client, sandbox, probe)
        marked = await next_calls_in(client, sandbox, f"import {MODULE} as _rt_d\nhasattr(_rt_d, 'mark')")
    for seen in probes:
        assert seen.get("result") == check.clean, f"a later caller saw the taint: {seen.summary()}"
    assert all(seen.get("result") == "False" for seen in marked), marked[-1].summary()
    assert landed(probes, sandbox), "the sandbox was replaced, not recycled: the reset went untested"


async def test_a_timer_left_by_javascript_never_fires(client: Client) -> None:
    sandbox, left = await run_where(
        client,
        "from pyodide.ffi import create_proxy\n"
        "_rt_js.setTimeout(create_proxy(lambda: _rt_js.eval('globalThis.rt_fired = 1')), 300)",
    )
    assert left.get("success") is True, left.summary()
    await anyio.sleep(0.6)
    probes = await next_calls_in(client, sandbox, "_rt_js.eval('typeof globalThis.rt_fired')")
    assert landed(probes, sandbox), "a pending timer alone should not cost a new sandbox"
    assert all(seen.get("result") == "'undefined'" for seen in probes), probes[-1].summary()


async def test_data_changed_by_a_program_is_sent_again(client: Client, world: World) -> None:
    sandbox, changed = await run_where(
        client,
        "import os\nos.chmod('data', 0o755)\nos.chmod('data/victim.txt', 0o644)\n"
        "open('data/victim.txt', 'w').write('changed')\nopen('data/planted.txt', 'w').write('x')",
    )
    assert changed.get("success") is True, changed.summary()
    probes = await next_calls_in(
        client, sandbox, "import os\n(open('data/victim.txt').read(), os.path.exists('data/planted.txt'))"
    )
    assert landed(probes, sandbox), "changing data/ alone should not cost a new sandbox"
    expected = repr(((world.data / "victim.txt").read_text(), False))
    assert all(seen.get("result") == expected for seen in probes), probes[-1].summary()
    assert (world.data / "victim.txt").read_text() != "changed"


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("ctypes", "import ctypes\nctypes.string_at(id(1), 8)"),
        ("gc", "import gc\nlen(gc.get_objects()) > 0"),
        ("a JavaScript global", "_rt_js.globalThis.rtPlanted = 1"),
        ("a patched builtin prototype", "_rt_js.eval('Array.prototype.rtPlanted = 1')"),
        (
            "a message listener",
            "from pyodide.ffi import create_proxy\n"
            "_rt_js.addEventListener('message', create_proxy(lambda event: None))",
        ),
        ("a grown memory", "blob = bytearray(200 * 1024 * 1024)\nlen(blob)"),
    ],
)
async def test_what_reaches_past_the_checks_gets_a_new_sandbox(client: Client, name: str, code: str) -> None:
    sandbox, reply = await run_where(client, code)
    assert reply.get("success") is True, reply.summary()
    probes = await next_calls_in(client, sandbox, "'probe'", TRIES_WHEN_REPLACED)
    assert not landed(probes, sandbox), f"a sandbox that saw {name} was recycled"


async def test_an_ended_session_is_recycled_clean(client: Client) -> None:
    sandbox, planted = await run_where(client, "rt_planted = 'TAINT'", "recycled")
    assert planted.get("success") is True, planted.summary()
    await client.call_tool("reset_session", {"session_id": "recycled"})
    probes = await next_calls_in(client, sandbox, "'rt_planted' in globals()")
    assert landed(probes, sandbox), "the ended session's sandbox never came back to the pool"
    assert all(seen.get("result") == "False" for seen in probes), probes[-1].summary()


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


async def test_a_listener_cannot_forge_a_clean_recycle_or_see_the_next_caller(client: Client) -> None:
    sandbox, installed = await run_where(client, FORGER)
    assert installed.get("success") is True, installed.summary()
    await anyio.sleep(TRY_GAP_S)  # the forger's sandbox is asked to recycle
    secret = "rt_victim_secret = 'VICTIM-MARKER-7319'"
    await send(client, secret, None)
    probes = await next_calls_in(
        client, sandbox, "str(list(getattr(_rt_js.globalThis, 'rtSeen', None) or []))", TRIES_WHEN_REPLACED
    )
    assert not landed(probes, sandbox), "the forger's sandbox was recycled: its answer was taken"
    assert not any("VICTIM-MARKER" in str(probe.get("result")) for probe in probes), probes[-1].summary()


async def test_a_taint_travels_with_its_checkpoint(client: Client, state: Path) -> None:
    # gc.get_objects reaches every live object (a taint), and leaves the memory portable.
    _, tainted = await run_where(client, "import gc\nlen(gc.get_objects()) > 0", "carrier")
    assert tainted.get("success") is True, tainted.summary()
    checkpoint = state_file(state, "carrier")
    with anyio.fail_after(30):  # its checkpoint, taken in idle time after the call
        while not checkpoint.exists():
            await anyio.sleep(0.05)
    crashed = await send(client, "import os\nos._exit(3)", "carrier")
    assert crashed.get("session_restored") is True, crashed.summary()
    holder, _ = await run_where(client, "1", "carrier")  # the sandbox the checkpoint went into
    await client.call_tool("reset_session", {"session_id": "carrier"})
    probes = await next_calls_in(client, holder, "'probe'", TRIES_WHEN_REPLACED)
    assert not landed(probes, holder), "a sandbox restored from a tainted session was recycled"


async def test_plain_calls_on_a_plain_server_reuse_one_recycled_sandbox(anyio_backend: str) -> None:
    """No data folder, nothing but calls: each used sandbox is recycled, not replaced (a realm
    that Deno itself settles after the clean point once made every recycle a replacement)."""
    params = server_params(MCP_SANDBOX_BACKEND="pyodide", MCP_SANDBOX_POOL_SIZE="1")
    async with Client(params) as plain:
        sandbox, _ = await run_where(plain, "1 + 1")
        for _ in range(3):
            assert landed(await next_calls_in(plain, sandbox, "2 + 2"), sandbox), "the sandbox was replaced"
