"""Where a Pyodide sandbox's start goes (pyodide): its ready message names each step of its load
in order, with its milliseconds, and the debug log says them. Real Deno runner, real Pyodide, no
MCP: the backend is driven directly."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from mcp_sandbox.backends.base import Backend, Executor, ExecutorHooks, SandboxStartError
from mcp_sandbox.backends.pyodide import PyodideBackend
from mcp_sandbox.backends.registry import prepare_backend
from mcp_sandbox.settings import Settings
from tests.helpers import computes_once, pyodide_in_own_cache, runner_deno

pytestmark = pytest.mark.anyio

REPO = Path(__file__).parents[2]
#: A backend whose second sandbox is a later worker of the first's process.
TWO_PER_PROCESS = Settings(
    backend="pyodide", default_packages="", pyodide_tier_up=False, sandboxes_per_process=2
)

STEPS = [
    "worker start",
    "snapshot read",
    "pyodide.asm.js",
    "Pyodide",
    "guest runtime",
    "first rounds",
    "preload",
    "clean point",
]


async def test_the_debug_log_says_each_step_of_a_sandboxs_start(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        executor = await backend.start()
        try:
            result = await executor.run("6 * 7", 60)
            assert result.result == "42", result
        finally:
            await executor.close()
            task_group.cancel_scope.cancel()
    said = [record.getMessage() for record in caplog.records if " ready in " in record.getMessage()]
    assert said, "no debug line said the sandbox was ready"
    found = re.fullmatch(
        r"pyodide sandbox \d+ ready in (\d+) ms \((.*)\)(, code cache \w+)?(, snapshot read \w+)?", said[0]
    )
    assert found is not None, said[0]
    steps = [part.rsplit(" ", 1) for part in found[2].split(", ")]
    assert [name for name, _ in steps] == STEPS, said[0]
    # Whole milliseconds each, rounded: their sum is the load's, give or take a millisecond a step.
    assert abs(sum(int(ms) for _, ms in steps) - int(found[1])) <= len(STEPS), said[0]


def ready_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if " ready in " in record.getMessage()]


async def in_a_first_and_a_later_worker(check: Callable[[Executor], Awaitable[None]]) -> None:
    """`check` on a process's first sandbox, then on a later worker of the same process."""
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(TWO_PER_PROCESS, ExecutorHooks(tools=None), task_group)
        first = await backend.start()
        later = await backend.start()
        try:
            assert first.pid == later.pid  # type: ignore[attr-defined]
            for executor in (first, later):
                await check(executor)
        finally:
            for executor in (first, later):
                await executor.close()
            task_group.cancel_scope.cancel()


async def test_every_sandbox_starts_from_the_code_cache_made_with_the_snapshot(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")

    async def computes(executor: Executor) -> None:
        assert (await executor.run("6 * 7", 60)).result == "42"

    await in_a_first_and_a_later_worker(computes)
    said = ready_lines(caplog)
    assert len(said) == 2 and all(", code cache used" in line for line in said), said


#: What a program reaches of the Node built-ins Pyodide's runtime script is given (script.ts):
#: node:tty's answer for the standard streams, node:crypto when first asked (os.urandom), and a
#: bare module name resolved from Pyodide's package, refused without a host path.
BUILT_INS = """
import os, random, js
print(os.isatty(0), os.isatty(1), os.isatty(2), len(os.urandom(8)), 0 <= random.random() < 1)
try:
    await js.eval("import('no-such-module-xyz')")
except Exception as error:
    print(error)
"""


async def test_pyodides_script_gets_the_node_built_ins_it_asks_for_in_every_worker() -> None:
    async def reaches_them(executor: Executor) -> None:
        result = await executor.run(BUILT_INS, 60)
        assert result.success, result
        # The runner's standard streams are pipes: none is a terminal.
        assert result.stdout.splitlines() == [
            "False False False 8 True",
            "TypeError: Cannot find module 'no-such-module-xyz'",
        ], result.stdout

    await in_a_first_and_a_later_worker(reaches_them)


async def test_a_damaged_code_cache_is_not_used_and_the_sandbox_starts_without_it(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        made: Path = backend._code_cache  # type: ignore[attr-defined]
        assert made is not None, "the backend made no code cache"
        # One byte changed in its body, under the name the host gave it: V8 alone would take it.
        damaged = bytearray(made.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        copy = tmp_path / made.name
        copy.write_bytes(bytes(damaged))
        backend._code_cache = copy  # type: ignore[attr-defined]
        await computes_once(backend, task_group)
    said = ready_lines(caplog)
    assert len(said) == 1 and ", code cache damaged" in said[0], said
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert any("not using the code cache" in message for message in warned), warned


async def test_a_cache_folder_whose_path_holds_a_space_serves_as_any_other(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The runtime script is read by its file path, decoded from its URL (which says %20)."""
    settings = await pyodide_in_own_cache(
        tmp_path / "a cache folder", Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    )
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        await computes_once(backend, task_group)
    said = ready_lines(caplog)
    assert len(said) == 1 and ", code cache used" in said[0], said


async def test_a_sandbox_from_the_snapshot_is_sent_no_guest_sources(caplog: pytest.LogCaptureFixture) -> None:
    """The snapshot holds the guest runtime (its name is made from the sources): its init is small."""
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        init = backend._init(Path("/checkpoints"))  # type: ignore[attr-defined]
        assert "snapshot" in init and init["guest_modules"] == [], sorted(init)
        assert len(json.dumps(init)) < 4096, len(json.dumps(init))
        await computes_once(backend, task_group)


async def test_without_a_snapshot_a_sandbox_loads_the_guest_runtime_its_init_carries(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_snapshot(self: object) -> None:
        return None

    monkeypatch.setattr(PyodideBackend, "_make_snapshot", no_snapshot)
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        init = backend._init(Path("/checkpoints"))  # type: ignore[attr-defined]
        assert (
            "snapshot" not in init and [name for name, _ in init["guest_modules"]][-1] == "mcp_sandbox.guest"
        )
        await computes_once(backend, task_group)
    said = ready_lines(caplog)
    assert len(said) == 1 and "code cache" not in said[0], said  # the cache is made with the snapshot


async def test_each_rewrite_of_pyodides_runtime_script_finds_its_text_once() -> None:
    """rewrites.ts rewrites parts of the pinned Pyodide's linker (loops, the GOT entries made when
    asked for, copies of its exports, and where calloc is hooked); a Pyodide whose script lacks the
    text of one would start without it, slower, and say nothing: this says it. Without the text of
    the one the sandbox depends on (calloc's hook), the script is refused, saying why."""
    settings = Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        task_group.cancel_scope.cancel()
    assert isinstance(backend, PyodideBackend)
    script = backend._pyodide_dir / "pyodide.asm.js"  # type: ignore[operator]
    rewrites = Path(__file__).with_name("script_rewrites.ts")
    done = runner_deno("run", "--cached-only", f"--allow-read={REPO},{script}", str(rewrites), str(script))
    assert done.returncode == 0, done.stdout + done.stderr
    made: dict[str, dict[str, Any]] = json.loads(done.stdout)
    assert len(made) >= 4, made
    for why, rewrite in made.items():
        assert rewrite["found"] and rewrite["found"] == [1] * len(rewrite["found"]), (why, rewrite)
        expected = (
            f"refused: this Pyodide's runtime script does not fit: {why}"
            if rewrite["required"]
            else f"made, leaving out {json.dumps([why])}"
        )
        assert rewrite["without"] == expected, (why, rewrite)
    assert [why for why, rewrite in made.items() if rewrite["required"]] == [
        "calloc hooked in the relocated exports"
    ]


async def test_a_pyodide_without_the_point_where_calloc_is_hooked_is_refused_saying_why(
    tmp_path: Path,
) -> None:
    """A runtime script that the rewrite the sandbox depends on does not fit (another Pyodide) is
    refused by the runner, and the start fails saying why, rather than the runner dying unheard."""
    settings = await pyodide_in_own_cache(
        tmp_path / "cache", Settings(backend="pyodide", default_packages="", pyodide_tier_up=False)
    )
    script = next((settings.cache_dir / "deno" / "npm").glob("*/pyodide/*/pyodide.asm.js"))
    text = script.read_text()
    script.write_text(
        text.replace('mergeLibSymbols(wasmExports,"main");', "mergeLibSymbols(wasmExports,'main');")
    )
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(settings, ExecutorHooks(tools=None), task_group)
        with pytest.raises(SandboxStartError) as refused:
            await backend.start()
        task_group.cancel_scope.cancel()
    assert "does not fit: calloc hooked in the relocated exports" in str(refused.value), refused.value


async def first_then_later(
    caplog: pytest.LogCaptureFixture, between: Callable[[Backend, Executor], Awaitable[None]]
) -> list[str]:
    """The ready lines of a process's first sandbox and, after `between`, of a later one in the
    same process, which computes once."""
    caplog.set_level(logging.DEBUG, logger="mcp_sandbox.backends.process")
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(TWO_PER_PROCESS, ExecutorHooks(tools=None), task_group)
        first = await backend.start()
        try:
            await between(backend, first)
            later = await backend.start()
            assert later.pid == first.pid  # type: ignore[attr-defined]
            assert (await later.run("6 * 7", 60)).result == "42"
            await later.close()
        finally:
            await first.close()
            task_group.cancel_scope.cancel()
    said = ready_lines(caplog)
    assert len(said) == 2, said
    return said


async def test_a_later_sandbox_reads_only_the_snapshots_pages_after_the_file_is_marked_used(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The process's first worker reads the snapshot whole and finds its pages; a later one reads
    those pages only, from the same file, known by its birth time: marking the file used (its
    modification and change times, cache_files.touch) does not make it another file."""

    async def mark_used(backend: Backend, first: Executor) -> None:
        os.utime(backend._snapshot)  # type: ignore[attr-defined]

    said = await first_then_later(caplog, mark_used)
    assert said[0].endswith(", snapshot read whole") and said[1].endswith(", snapshot read pages"), said


def workers(pid: int) -> int:
    """The Web Workers of Deno process `pid`: each is a thread of its own, named worker-N."""
    names = (Path(f"/proc/{pid}/task/{task}/comm").read_text() for task in os.listdir(f"/proc/{pid}/task"))
    return sum(name.startswith("worker-") for name in names)


async def test_a_later_sandbox_takes_the_worker_its_process_started_ahead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Once a sandbox is ready and its process has room for another, the runner starts the next
    sandbox's worker ahead (runner.ts), which runs Pyodide's runtime script from the code cache
    then (WorkerAhead): a later sandbox starts with neither of its own, and counts its start from
    its init. The first sandbox of a process has none to take."""

    async def spare_started(backend: Backend, first: Executor) -> None:
        assert (await first.run("6 * 7", 60)).result == "42"
        with anyio.fail_after(30):
            while workers(first.pid) < 2:  # type: ignore[attr-defined] # the first's and the spare
                await anyio.sleep(0.05)

    said = await first_then_later(caplog, spare_started)
    assert "(worker start 0," not in said[0] and "(worker start 0," in said[1], said
    assert "pyodide.asm.js" in said[0] and "pyodide.asm.js" not in said[1], said
    assert "code cache used" in said[1], said


#: A program posting to the worker's own channel what the runner sends there (a runtime script to
#: run ahead, an init) and what it sends on the private port (runs, data/ files), by calling the
#: worker's message handler and by dispatching a message event to it. Keeps the forged script's
#: message.
FORGED_MESSAGES = """
import js
forged_ahead = js.eval('''(() => {
  const ahead = { type: "ahead", script: "globalThis.rtAhead = 1", codeCache: new Uint8Array(1) };
  onmessage({ data: ahead });
  onmessage({ data: { type: "init", control: {} } });
  onmessage({ data: { type: "run", id: 9001, code: "rt_forged_run = 1" } });
  const files = [{ path: "planted.txt", bytes: new Uint8Array([65]) }];
  onmessage({ data: { type: "data", files, removed: [] } });
  const run = { type: "run", id: 9002, code: "rt_dispatched_run = 1" };
  dispatchEvent(new MessageEvent("message", { data: run }));
  return ahead;
})()''')
'sent'
"""

#: What the forged messages would have left, had the worker taken them.
LEFT_BY_FORGED = """
import os
[
    js.eval("typeof globalThis.rtAhead"),
    # Running the script ahead takes the cache off its message first.
    js.Reflect.has(forged_ahead, "codeCache"),
    "rt_forged_run" in globals(),
    "rt_dispatched_run" in globals(),
    os.path.exists("data/planted.txt"),
]
"""


async def test_a_worker_reads_its_own_channel_only_until_its_init() -> None:
    """After its init, a worker takes nothing from its own channel: a program can post and
    dispatch to it, or call its handler, so a script to run ahead, an init or a run sent there
    is a program's. The runner sends runs, data and everything else on the private port."""
    async with anyio.create_task_group() as task_group:
        backend = await prepare_backend(TWO_PER_PROCESS, ExecutorHooks(tools=None), task_group)
        executor = await backend.start()
        try:
            forged = await executor.run(FORGED_MESSAGES, 60)
            assert forged.result == "'sent'", forged
            left = await executor.run(LEFT_BY_FORGED, 60)
            assert left.result == "['undefined', True, False, False, False]", left
            assert (await executor.run("del forged_ahead", 60)).success
            assert await executor.recycle() is None
            assert (await executor.run("6 * 7", 60)).result == "42"
        finally:
            await executor.close()
            task_group.cancel_scope.cancel()
