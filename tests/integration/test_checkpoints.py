"""Sessions that outlive their sandbox: checkpoints taken in idle time, and a session
brought back from its last one after a kill, a crash or a server restart. Real MCP client, real
server process, real Deno runner."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from mcp import Client

from tests.helpers import call, http_server, process_tree, server_params, state_file, still_running

pytestmark = pytest.mark.anyio

#: A checkpoint lands 2 s after a call (lifecycle.Timings.checkpoint_quiet), plus its own time: how long
#: to wait where a refused checkpoint leaves nothing to wait for.
SETTLE_S = 4.0
MEMORY_MB = 256
#: Past MEMORY_MB (bounded: 400 MB once): its allocation fails on both backends (pyodide: the
#: WebAssembly memory's maximum; subprocess: RLIMIT_AS).
MEMORY_BOMB = "hog = bytearray(b'x') * (400 * 2**20)"
#: (pyodide) Grows JavaScript's heap, which no WebAssembly maximum bounds, until V8's own cap
#: (MEMORY_MB) ends the process: the last resort, said as MemoryLimit.
JS_MEMORY_BOMB = "import js\njs.eval('globalThis.hog = []; for (;;) hog.push(new Array(1e6).fill(1.5))')"
#: Ignores its interrupt, so only a kill stops it (bounded by the call's timeout and the grace).
IGNORES_INTERRUPTS = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
CRASH = "import os\nos._exit(3)"


@pytest.fixture(scope="module", params=["pyodide", "subprocess"])
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory, backend: str) -> Path:
    return tmp_path_factory.mktemp(f"state-{backend}")


@pytest.fixture(scope="module")
async def client(anyio_backend: str, backend: str, state_dir: Path) -> AsyncIterator[Client]:
    params = server_params(
        MCP_SANDBOX_BACKEND=backend,
        MCP_SANDBOX_MEMORY_MB=str(MEMORY_MB),
        MCP_SANDBOX_STATE_DIR=str(state_dir),
    )
    async with Client(params) as connected:
        yield connected


async def checkpointed(client: Client, code: str, session_id: str, state_dir: Path) -> dict[str, Any]:
    """Run `code`, then wait for the session's checkpoint (taken in idle time) to land."""
    path = state_file(state_dir, session_id)
    before = path.stat().st_mtime_ns if path.exists() else None
    result = await call(client, code, session_id=session_id)
    assert result["success"], result
    with anyio.fail_after(30):
        while not path.exists() or path.stat().st_mtime_ns == before:
            await anyio.sleep(0.05)
    return result


@pytest.mark.parametrize(
    ("killer", "error_type", "timeout"),
    [
        (MEMORY_BOMB, "MemoryError", 30),
        (JS_MEMORY_BOMB, "MemoryLimit", 30),
        (IGNORES_INTERRUPTS, "Timeout", 1),
        (CRASH, "SandboxCrash", 30),
    ],
    ids=["memory-error", "memory-limit", "ignored-interrupt", "crash"],
)
async def test_a_killed_session_comes_back_from_its_checkpoint(
    client: Client, backend: str, killer: str, error_type: str, timeout: int, state_dir: Path
) -> None:
    session = f"killed-{error_type}"
    await checkpointed(client, "x = 41", session, state_dir)
    if backend == "subprocess" and killer == JS_MEMORY_BOMB:
        pytest.skip("pyodide only: a subprocess sandbox's every allocation is capped (RLIMIT_AS)")
    if error_type == "MemoryError":
        # The allocation fails inside the sandbox instead of killing it: the session lives on.
        failed = await call(client, killer, session_id=session, timeout=timeout)
        assert failed["error_type"] == "MemoryError" and not failed["session_restored"], failed
        assert (await call(client, "x + 1 == 42", session_id=session))["result"] == "True"
        return
    killed = await call(client, killer, session_id=session, timeout=timeout)
    assert killed["error_type"] == error_type, killed
    assert killed["session_restored"] is True and killed["session_lost"] is False, killed
    assert killed["restored_from_call"] == 1
    assert any("restored from its checkpoint after call 1" in note for note in killed["notes"]), killed
    after = await call(client, "x + 1 == 42", session_id=session)
    assert after["result"] == "True", after
    assert after["session_restored"] is False


async def test_what_a_session_holds_survives(client: Client, backend: str, state_dir: Path) -> None:
    setup = (
        "import re, collections\n"
        "class Point:\n    def __init__(self, x): self.x = x\n"
        "def double(v): return 2 * v\n"
        "points = [Point(i) for i in range(3)]\n"
        "counts = collections.Counter('mississippi')\n"
        "pattern = re.compile(r'(\\d+)-(\\d+)')\n"
        "numbers = iter(range(10)); next(numbers); next(numbers)\n"
        "def squares():\n    n = 0\n    while True:\n        yield n * n\n        n += 1\n"
        "counting = squares(); next(counting); next(counting)\n"
        "with open('notes.txt', 'w') as f: f.write('kept on disk')\n"
        "import os; os.makedirs('work', exist_ok=True); os.chdir('work')\n"
        "left_open = open('../open.txt', 'w')\n"
        "import random; random.seed(5); random.random()\n"
    )
    await checkpointed(client, setup, "holds", state_dir)
    killed = await call(client, CRASH, session_id="holds")
    assert killed["session_restored"] is True, killed
    check = (
        "import os\n"
        "(double(points[2].x), counts['s'], pattern.match('12-34').groups(), next(numbers),"
        " open('../notes.txt').read(), os.path.basename(os.getcwd()))"
    )
    after = await call(client, check, session_id="holds")
    assert after["result"] == "(4, 4, ('12', '34'), 2, 'kept on disk', 'work')", after
    notes = " ".join(killed["notes"])
    if backend == "pyodide":  # its memory carries generators; open files are closed, and said so
        assert "open files" in notes and "open.txt" in notes, killed
        assert (await call(client, "next(counting)", session_id="holds"))["result"] == "4"
        # A restored session's generator goes on where it was: it is not reseeded as a new sandbox is.
        seeded = random.Random(5)
        seeded.random()
        assert (await call(client, "random.random()", session_id="holds"))["result"] == repr(seeded.random())
    else:  # a pickle cannot carry a generator or an open file: both are named
        assert "cannot be pickled" in notes and "counting" in notes and "left_open" in notes, killed


async def test_a_session_whose_memory_grew_comes_back_whole(tmp_path: Path, backend: str) -> None:
    if backend != "pyodide":
        pytest.skip("pyodide: a restoring sandbox's memory must grow to the session's size first")
    # 40 MB: past a clean Pyodide's whole memory (20 MB on 0.29, 30 MB on 314). A restore that does
    # not grow the memory first times out after 20 s and loses the session. Its own server: the
    # module's has a 256 MB limit.
    grow = (
        "import hashlib\nbig = bytearray(range(256)) * (40 * 4096)\ndigest = hashlib.sha256(big).hexdigest()"
    )
    params = server_params(MCP_SANDBOX_BACKEND=backend, MCP_SANDBOX_STATE_DIR=str(tmp_path / "state"))
    async with Client(params) as client:
        await checkpointed(client, grow, "grown", tmp_path / "state")
        with anyio.fail_after(15):
            killed = await call(client, CRASH, session_id="grown")
        assert killed["session_restored"] is True and killed["session_lost"] is False, killed
        after = await call(client, "len(big), hashlib.sha256(big).hexdigest() == digest", session_id="grown")
        assert after["result"] == f"({40 * 2**20}, True)", after


async def test_files_in_tmp_survive_on_pyodide(client: Client, backend: str, state_dir: Path) -> None:
    if backend != "pyodide":
        pytest.skip(
            "a CPython worker's /tmp is not saved (in bubblewrap it is a tmpfs of its own); its home is"
        )
    await checkpointed(
        client, "with open('/tmp/scratch.txt', 'w') as f: f.write('in /tmp')", "tmp-files", state_dir
    )
    assert (await call(client, CRASH, session_id="tmp-files"))["session_restored"] is True
    after = await call(client, "open('/tmp/scratch.txt').read()", session_id="tmp-files")
    assert after["result"] == "'in /tmp'", after


async def test_work_after_the_last_checkpoint_is_gone_and_the_result_says_so(
    client: Client, state_dir: Path
) -> None:
    await checkpointed(client, "x = 1", "later-work", state_dir)
    await call(client, "y = 2", session_id="later-work")  # the crash comes before its checkpoint would
    killed = await call(client, CRASH, session_id="later-work")
    assert killed["restored_from_call"] == 1, killed
    assert any("what later calls did is gone" in note for note in killed["notes"])
    after = await call(client, "'y' in globals(), x", session_id="later-work")
    assert after["result"] == "(False, 1)"


async def test_a_session_without_a_checkpoint_is_lost_and_says_so(client: Client) -> None:
    killed = await call(client, CRASH, session_id="never-saved")
    assert killed["session_lost"] is True and killed["session_restored"] is False, killed
    assert any("no checkpoint yet" in note for note in killed["notes"]), killed


async def test_javascript_objects_hold_back_a_checkpoint_until_deleted(
    client: Client, backend: str, state_dir: Path
) -> None:
    if backend != "pyodide":
        pytest.skip("JavaScript exists only in pyodide")
    await checkpointed(client, "x = 41", "js-held", state_dir)
    await call(client, "import js\nheld = js.Object.new()\nalso = js.Array.new()", session_id="js-held")
    await anyio.sleep(SETTLE_S)  # its checkpoint is refused: nothing lands to wait for
    told = await call(client, "x", session_id="js-held")
    refusal = " ".join(told["notes"])
    assert "not checkpointed" in refusal and "JavaScript objects (held, also)" in refusal, told
    await checkpointed(client, "del held, also\nx = 42", "js-held", state_dir)
    killed = await call(client, CRASH, session_id="js-held")
    assert killed["restored_from_call"] == 4, killed
    assert (await call(client, "x", session_id="js-held"))["result"] == "42"


async def test_a_damaged_state_file_gives_a_fresh_session_and_a_note(client: Client, state_dir: Path) -> None:
    await checkpointed(client, "x = 41", "damaged", state_dir)
    path = state_file(state_dir, "damaged")
    path.write_bytes(path.read_bytes()[:-100] + b"\x00" * 100)
    killed = await call(client, CRASH, session_id="damaged")
    assert killed["session_lost"] is True, killed
    assert any("could not be used" in note and "hash" in note for note in killed["notes"]), killed
    after = await call(client, "'x' in globals()", session_id="damaged")
    assert after["result"] == "False"
    assert not path.exists()


async def test_state_files_are_private_and_go_with_their_session(client: Client, state_dir: Path) -> None:
    await checkpointed(client, "x = 41", "private", state_dir)
    path = state_file(state_dir, "private")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((state_dir / "sessions").stat().st_mode) == 0o700
    found = await call(client, f"import os\nos.path.exists({str(state_dir)!r})", session_id="private")
    assert found["result"] == "False", "the sandbox cannot see the state folder"
    await client.call_tool("reset_session", {"session_id": "private"})
    assert not path.exists()


async def test_a_killed_server_restarted_on_the_same_folder_resumes_its_sessions(
    tmp_path: Path, backend: str
) -> None:
    # The killed server's lease is left to run out: 2 s rather than 30.
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
        "MCP_SANDBOX_LEASE_SECONDS": "2",
    }
    async with http_server(**env) as (port, process):
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:
            await checkpointed(client, "x = 41", "survivor", tmp_path / "state")
        process.send_signal(signal.SIGKILL)
        await process.wait()
    async with http_server(**env) as (port, _), Client(f"http://127.0.0.1:{port}/mcp") as client:
        after = await call(client, "x + 1", session_id="survivor")
        assert after["result"] == "42", after
        assert after["session_restored"] is True and after["restored_from_call"] == 1


def sandbox_processes(server: int) -> int:
    """Sandbox processes (Deno runners, CPython workers) under the server process `server`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return len(children.get(server, []))


async def test_ten_sessions_share_two_live_sandboxes_and_keep_their_state(
    tmp_path: Path, backend: str
) -> None:
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
        "MCP_SANDBOX_MAX_LIVE_SANDBOXES": "2",
    }
    async with (
        http_server(**env) as (port, process),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        most = 0
        for i in range(10):
            result = await call(client, f"x = {i} * 41\nx", session_id=f"many-{i}")
            assert result["result"] == str(i * 41), result
            await anyio.sleep(0.8)  # its checkpoint, in idle time
            most = max(most, sandbox_processes(process.pid))
        for i in reversed(range(10)):
            again = await call(client, f"x == {i} * 41", session_id=f"many-{i}")
            assert again["result"] == "True", again
            assert again["session_restored"] is False and not again["session_lost"], "hibernation is silent"
            most = max(most, sandbox_processes(process.pid))
    # Two sessions' sandboxes, the pool's one, and one being started or reset at a moment.
    assert most <= 4, f"{most} sandbox processes for 2 live sessions and a pool of 1"


async def test_an_idle_session_hibernates_and_comes_back_as_it_was(tmp_path: Path, backend: str) -> None:
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
        "MCP_SANDBOX_HIBERNATE_AFTER": "1",
        # A process per sandbox, so the processes counted are the sandboxes.
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "1",
    }
    async with (
        http_server(**env) as (port, process),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        await call(client, "x = 41", session_id="sleeper")
        await call(
            client, "import os\npid = os.getpid() if hasattr(os, 'getpid') else 0", session_id="sleeper"
        )
        with anyio.fail_after(30):  # the session's sandbox, and the pool's refill once it starts
            while sandbox_processes(process.pid) < 2:
                await anyio.sleep(0.05)
        with anyio.fail_after(30):
            while sandbox_processes(process.pid) > 1:  # the session's sandbox went back
                await anyio.sleep(0.2)
        assert state_file(tmp_path / "state", "sleeper").exists()
        after = await call(client, "x + 1", session_id="sleeper")
        assert after["result"] == "42" and after["session_restored"] is False, after


async def test_a_session_that_cannot_be_saved_whole_is_not_hibernated(tmp_path: Path, backend: str) -> None:
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_STATE_DIR": str(tmp_path / "state"),
        "MCP_SANDBOX_HIBERNATE_AFTER": "1",
        # A process per sandbox, so the processes counted are the sandboxes.
        "MCP_SANDBOX_SANDBOXES_PER_PROCESS": "1",
    }
    # Pyodide cannot carry a JavaScript object, a pickle cannot carry a generator.
    held = (
        "import js\nheld = js.Object.new()\nheld.mark = 7"
        if backend == "pyodide"
        else "held = iter(x for x in [7])"
    )
    check = "held.mark" if backend == "pyodide" else "next(held)"
    async with (
        http_server(**env) as (port, process),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        await call(client, held, session_id="unsaved")
        await anyio.sleep(4)
        assert sandbox_processes(process.pid) >= 2, "the session kept its sandbox"
        after = await call(client, check, session_id="unsaved")
        assert after["result"] == "7", after


async def test_a_session_that_used_ctypes_is_never_restored_broken(client: Client, backend: str) -> None:
    # ctypes adds to Pyodide's tables outside its memory: a checkpoint must carry that or refuse.
    await call(client, "import ctypes\nx = ctypes.string_at(id(1), 8)\ny = 41", session_id="ctypes")
    await anyio.sleep(SETTLE_S)  # its checkpoint may be refused: nothing may land to wait for
    killed = await call(client, CRASH, session_id="ctypes")
    after = await call(client, "y + 1", session_id="ctypes")
    if killed["session_restored"]:
        assert after["result"] == "42", after
    else:
        assert after["error_type"] == "NameError" and killed["session_lost"], (killed, after)
        assert backend == "pyodide", "a CPython checkpoint carries ctypes' bytes and ints"


async def kill_every_sandbox(server: int) -> None:
    """SIGKILL every sandbox process under the server, from outside, as the OOM killer would, and
    wait until they are gone."""
    killed = {pid: command for pid, command in process_tree(server).items() if pid != server}
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with anyio.fail_after(30):
        while still_running(killed):
            await anyio.sleep(0.05)


async def first_call_after_a_kill(client: Client, code: str, session_id: str) -> dict[str, Any]:
    """The first result after its sandbox was killed, which must say what the session lost, and
    the result of `code` (the same one, or, when the kill was seen only as the call was sent, the
    next call's)."""
    said = await call(client, code, session_id=session_id)
    if not said["success"]:
        assert said["error_type"] == "SandboxCrash", said
        ran = await call(client, code, session_id=session_id)
        assert not ran["session_lost"] and not ran["session_restored"], "said once"
        return {**said, "result": ran["result"]}
    return said


async def test_a_sandbox_killed_between_calls_says_what_its_session_lost(
    tmp_path: Path, backend: str
) -> None:
    state = tmp_path / "state"
    env = {"MCP_SANDBOX_BACKEND": backend, "MCP_SANDBOX_STATE_DIR": str(state)}
    async with (
        http_server(**env) as (port, process),
        Client(f"http://127.0.0.1:{port}/mcp") as client,
    ):
        # Before its first checkpoint (it lands 2 s after a call): its variables are gone, and said.
        await call(client, "x = 1", session_id="early")
        await kill_every_sandbox(process.pid)
        after = await first_call_after_a_kill(client, "'x' in globals()", "early")
        assert after["session_lost"] is True and after["result"] == "False", after
        assert any("no checkpoint yet" in note for note in after["notes"]), after
        again = await call(client, "x = 2\nx", session_id="early")
        assert again["result"] == "2" and again["session_lost"] is False, "said once; a session again"
        # After its checkpoint: its state is intact, and the result says it was restored.
        await call(client, "x = 41", session_id="late")
        with anyio.fail_after(30):
            while not state_file(state, "late").exists():
                await anyio.sleep(0.1)
        await kill_every_sandbox(process.pid)
        restored = await first_call_after_a_kill(client, "x + 1", "late")
        assert restored["session_restored"] is True and restored["restored_from_call"] == 1, restored
        assert restored["result"] == "42", restored
