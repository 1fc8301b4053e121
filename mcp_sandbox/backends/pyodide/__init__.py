"""The default backend: CPython compiled to WebAssembly (Pyodide), hosted by Deno.

Each sandbox is a Pyodide worker in a Deno process running runner.ts (in this folder), which
hosts up to MCP_SANDBOX_SANDBOXES_PER_PROCESS of them, of one principal (host.py). The process has
almost no permissions: no network, environment, subprocesses, FFI or system info, writing only
its checkpoint folder and reading only its runner files, the Pyodide package and the data and
packages folders; each worker has fewer still. Deno's permission system is the wall; Pyodide's
virtual file system and environment are what sandboxed code sees.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.abc

from mcp_sandbox.backends.base import (
    Backend,
    Executor,
    ExecutorHooks,
    ExecutorLimits,
    NotDone,
    SandboxDied,
    SandboxStartError,
)
from mcp_sandbox.backends.process import (
    GUEST_MODULES,
    ProcessExecutor,
    RunnerLink,
    init_message,
    initialize,
    max_line,
    start_reading,
)
from mcp_sandbox.backends.pyodide.cache_files import sweep, touch
from mcp_sandbox.backends.pyodide.host import HostedWatch, RunnerProcess
from mcp_sandbox.backends.watch import MB
from mcp_sandbox.packages import (
    DefaultPackages,
    FetchStopped,
    Lock,
    PackageSource,
    default_index_url,
    is_verified,
    package_key,
)
from mcp_sandbox.protocol import RUNNER_TOKEN_ENV, GuestOutcome, InitMessage, RecycleMessage
from mcp_sandbox.settings import Settings

logger = logging.getLogger(__name__)
#: Seconds a recycle may take before the sandbox is given up (a reset takes milliseconds).
RECYCLE_TIMEOUT = 5.0
#: Seconds a checkpoint or a restore may take (they take tens of milliseconds).
CHECKPOINT_TIMEOUT = 20.0


#: The Deno runner's files (runner.ts, worker.ts, ...) live beside this module, in the wheel too.
RUNNER_DIR = Path(__file__).resolve().parent


def pyodide_version() -> str:
    """The exact Pyodide version pinned in deno.json. Raises SandboxStartError when the runner's
    files are missing or damaged (a broken installation)."""
    try:
        config = json.loads((RUNNER_DIR / "deno.json").read_text(encoding="utf-8"))
        specifier: str = config["imports"]["pyodide"]
        return specifier.rsplit("@", 1)[1]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        raise SandboxStartError(
            f"the Deno runner's deno.json in {RUNNER_DIR} is missing or damaged: {error}"
        ) from None


def find_deno(settings: Settings) -> Path | None:
    """The Deno binary to use: the configured one (which must exist), else the `deno` package's."""
    if settings.deno_path is not None:
        return settings.deno_path if os.access(settings.deno_path, os.X_OK) else None
    try:
        from deno import find_deno_bin  # type: ignore[import-untyped]

        found = Path(find_deno_bin())
    except (ImportError, FileNotFoundError, OSError):
        return None
    return found if os.access(found, os.X_OK) else None


class PyodideBackend(Backend):
    name: ClassVar[str] = "pyodide"
    recycles: ClassVar[bool] = True
    saves_sessions: ClassVar[bool] = True

    def __init__(
        self, settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup, deno: Path
    ) -> None:
        super().__init__(settings, hooks)
        self._task_group = task_group
        self._deno = deno
        self._runner = RUNNER_DIR
        self._deno_dir = settings.cache_dir / "deno"
        self._version = pyodide_version()
        self._pyodide_dir: Path | None = None
        self._snapshot: Path | None = None
        #: V8's code cache of Pyodide's runtime script, for the runner's V8 flags (script.ts).
        self._code_cache: Path | None = None
        self._build: str | None = None
        self._packages: DefaultPackages | None = None
        #: Loaded and imported by every sandbox before its clean point.
        self.preload: list[str] = []
        #: The runner processes that host this backend's sandboxes.
        self._processes: list[RunnerProcess] = []
        self._new_process = anyio.Lock()
        self._remaking = anyio.Lock()

    def _sandbox_env(self) -> dict[str, str]:
        # The sandbox process gets a bare environment: nothing of the host's reaches even the runner.
        env = {"DENO_DIR": str(self._deno_dir), "NO_COLOR": "1", "DENO_NO_UPDATE_CHECK": "1"}
        # glibc then gives blocks of 128 KB and more back to the system when freed (start-up frees
        # many): an idle sandbox's PSS 164 MB against 205 MB (bench/bench_faults.py).
        env["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)
        if "NPM_CONFIG_REGISTRY" in os.environ:
            env["NPM_CONFIG_REGISTRY"] = os.environ["NPM_CONFIG_REGISTRY"]
        return env

    def _fetch_env(self) -> dict[str, str]:
        # Fetching runs no sandboxed code, and needs the host's proxy and CA settings.
        return {**os.environ, **self._sandbox_env(), "DENO_TLS_CA_STORE": "system,mozilla"}

    async def prepare(self) -> None:
        """Fetch Pyodide from the npm registry into the cache, once; later starts are offline."""
        self._deno_dir.mkdir(parents=True, exist_ok=True)
        refuse_web_storage(self._deno_dir)
        command = [
            str(self._deno),
            "cache",
            "--config",
            str(self._runner / "deno.json"),
            str(self._runner / "runner.ts"),
            str(self._runner / "worker.ts"),
            str(self._runner / "snapshot.ts"),
        ]
        with anyio.fail_after(600):
            done = await anyio.run_process(command, env=self._fetch_env(), check=False)
        if done.returncode != 0:
            raise SandboxStartError(
                f"Deno could not fetch Pyodide {self._version} from the npm registry: "
                + done.stderr.decode(errors="replace").strip()[-800:]
            )
        found = sorted((self._deno_dir / "npm").glob(f"*/pyodide/{self._version}"))
        if not found:
            raise SandboxStartError(f"Pyodide {self._version} is not in the Deno cache at {self._deno_dir}")
        self._pyodide_dir = found[0]
        self._snapshot = await self._make_snapshot()
        self._code_cache = await self._make_code_cache() if self._snapshot else None
        touch(self._snapshot, self._code_cache)
        sweep(self._settings.cache_dir, keep=[self._snapshot, self._code_cache])
        self._packages = self._default_packages()
        self.preload = self._present(self._settings.preload_package_names)
        self._build = self._build_id()
        logger.info(
            "Pyodide %s ready in %s, runner in %s%s",
            self._version,
            self._pyodide_dir,
            self._runner,
            " (sandboxes start from a memory snapshot)" if self._snapshot else "",
        )

    @property
    def build(self) -> str:
        if self._build is None:
            raise SandboxStartError("PyodideBackend.prepare() has not run")
        return self._build

    def _build_id(self) -> str:
        """What a checkpoint's memory layout depends on: Pyodide, the snapshot, the runner, the
        guest runtime and the limits it is started with. Another value cannot restore it."""
        digest = hashlib.sha256(self._version.encode())
        digest.update(str(self._snapshot.name if self._snapshot else None).encode())
        for path in sorted(self._runner.glob("*.ts")):
            digest.update(path.read_bytes())
        digest.update(json.dumps([GUEST_MODULES, self._limits.guest], sort_keys=True).encode())
        digest.update(json.dumps(self._preload_files()).encode())
        return f"pyodide-{self._version}-{digest.hexdigest()[:16]}"

    def _present(self, wanted: list[str] | None) -> list[str]:
        """The packages to preload that the packages folder holds whole (with their dependencies);
        unset: the default packages that are there. A package asked for by name and missing is said."""
        folder = self._settings.packages_folder
        names = wanted if wanted is not None else self._settings.default_package_names
        if not names or not folder.is_dir():
            return []
        lock = self.package_source().lock
        wheels = {package_key(path.name.split("-")[0]) for path in folder.glob("*.whl")}
        present = []
        for name in names:
            needed, unknown = lock.closure([name])
            whole = not unknown and all(is_verified(package, folder) for package in needed)
            if whole or package_key(name) in wheels:
                present.append(name)
            elif wanted is not None:
                logger.warning("not preloading %s: it is not in the packages folder %s", name, folder)
        return present

    def _preload_files(self) -> list[str]:
        """The files the preloads come from, by name: another version is another clean point."""
        folder = self._settings.packages_folder
        keys = {package_key(name) for name in self.preload}
        if not keys:
            return []
        return sorted(path.name for path in folder.iterdir() if package_key(path.name.split("-")[0]) in keys)

    async def _make_snapshot(self) -> Path | None:
        """The memory snapshot sandboxes restore instead of loading Pyodide and the guest runtime
        from scratch, made once per Pyodide version, runner and guest runtime (its name is made
        from them all); None (slower starts) when it cannot be made."""
        assert self._pyodide_dir is not None
        guest = json.dumps(GUEST_MODULES).encode()
        # The snapshot is made with the runtime script every sandbox runs (script.ts, rewrites.ts):
        # its memory points into the function table their linker lays out.
        names = ("snapshot.ts", "options.ts", "modules.ts", "script.ts", "rewrites.ts")
        scripts = (self._runner / name for name in names)
        tag = hashlib.sha256(b"".join(path.read_bytes() for path in scripts) + guest).hexdigest()[:12]
        snapshot = self._settings.cache_dir / f"pyodide-{self._version}-{tag}.snapshot"
        if snapshot.is_file():
            return snapshot
        # Servers in containers that share the cache folder may have the same pid.
        unique = f"{os.getpid()}-{secrets.token_hex(4)}"
        partial = snapshot.with_suffix(f".{unique}.part")
        sources = snapshot.with_suffix(f".{unique}.guest.json")
        sources.write_bytes(guest)
        try:
            failed = await self._snapshot_script(
                "snapshot", partial, sources, writes=partial, read=[sources], timeout=120
            )
        finally:
            sources.unlink(missing_ok=True)
        if failed is None:
            partial.replace(snapshot)
            return snapshot
        partial.unlink(missing_ok=True)
        logger.warning("no Pyodide memory snapshot (sandboxes start more slowly): %s", failed)
        return None

    async def _make_code_cache(self) -> Path | None:
        """V8's code cache of Pyodide's runtime script as a sandbox starts from the snapshot, made
        once per snapshot, Deno binary and V8 flags (V8 refuses it for any other); None when it
        cannot be made: each process's first sandbox then compiles the script itself."""
        assert self._pyodide_dir is not None and self._snapshot is not None
        deno = self._deno.stat()
        # script.ts runs what rewrites.ts makes of the script, and the cache holds the code of that.
        sources = [(self._runner / name).read_text() for name in ("script.ts", "rewrites.ts")]
        key = [self._code_flags(), *sources, deno.st_size, deno.st_mtime_ns]
        tag = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
        # Named by its sha256 too, which the runner checks: V8 finds no damage in a cache's body.
        for found in self._snapshot.parent.glob(f"{self._snapshot.stem}-{tag}-*.jscache"):
            return found
        partial = self._snapshot.with_name(
            f"{self._snapshot.stem}-{tag}.{os.getpid()}-{secrets.token_hex(4)}.part"
        )
        failed = await self._snapshot_script(
            "code-cache",
            self._snapshot,
            partial,
            writes=partial,
            read=[self._snapshot],
            timeout=60,
            v8_flags=self._code_flags(),
        )
        if failed is None:
            digest = hashlib.sha256(partial.read_bytes()).hexdigest()
            cache = self._snapshot.with_name(f"{self._snapshot.stem}-{tag}-{digest}.jscache")
            partial.replace(cache)
            return cache
        partial.unlink(missing_ok=True)
        logger.warning(
            "no code cache of Pyodide's runtime script (each process's first sandbox starts more slowly): %s",
            failed,
        )
        return None

    async def _snapshot_script(
        self,
        mode: str,
        *args: Path,
        writes: Path,
        read: list[Path],
        timeout: float,
        v8_flags: str | None = None,
    ) -> str | None:
        """Run snapshot.ts in `mode` with `args`: None once it has written `writes`, else why not."""
        assert self._pyodide_dir is not None
        command = [
            str(self._deno),
            "run",
            "--no-prompt",
            "--cached-only",
            *([f"--v8-flags={v8_flags}"] if v8_flags else []),
            "--config",
            str(self._runner / "deno.json"),
            "--allow-read=" + ",".join(str(path) for path in [self._runner, self._pyodide_dir, *read]),
            f"--allow-write={writes}",
            str(self._runner / "snapshot.ts"),
            mode,
            *(str(arg) for arg in args),
        ]
        with anyio.move_on_after(timeout):
            done = await anyio.run_process(command, env=self._sandbox_env(), cwd="/", check=False)
            if done.returncode == 0 and await anyio.Path(writes).is_file():
                return None
            return done.stderr.decode(errors="replace").strip()[-400:]
        return f"it took over {timeout:g} s"

    @property
    def index_url(self) -> str:
        return self._settings.package_index_url or default_index_url(self._version)

    def package_source(self) -> PackageSource:
        """Pyodide's lock file (which came through npm's integrity check) over the index's, and the
        packages folder."""
        bundled = Lock.read(self.lock_file())
        return PackageSource(bundled, self._settings.packages_folder, self.index_url)

    def _default_packages(self) -> DefaultPackages:
        folder, names = self._settings.packages_folder, self._settings.default_package_names
        try:
            # Made before any sandbox starts: a sandbox is given the folder only if it exists, and
            # then sees the packages that arrive in it later.
            if names:
                folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            logger.warning(
                "no packages folder %s (%s): imports load only the standard library", folder, error
            )
        return DefaultPackages(self.package_source(), names)

    def start_background_work(self) -> None:
        if self._packages is not None and self._packages.names and self._settings.packages_folder.is_dir():
            self._task_group.start_soon(self._fetch_default_packages, self._packages)

    async def _fetch_default_packages(self, packages: DefaultPackages) -> None:
        stop = threading.Event()
        try:
            # Abandoned at shutdown: `stop` makes the thread drop its partial file and end.
            await anyio.to_thread.run_sync(packages.fetch, stop, abandon_on_cancel=True)
        except FetchStopped:
            pass
        except Exception:  # a fetch must never take the server down with it
            logger.exception("fetching the default packages failed")
        finally:
            stop.set()

    def import_note(self, module: str) -> str | None:
        return self._packages.import_note(module) if self._packages is not None else None

    def lock_file(self) -> Path:
        """Pyodide's lock file: every package of its distribution, with dependencies and sha256."""
        if self._pyodide_dir is None:
            raise SandboxStartError("PyodideBackend.prepare() has not run")
        return self._pyodide_dir / "pyodide-lock.json"

    def command(self, checkpoint_dir: Path) -> list[str]:
        if self._pyodide_dir is None:
            raise SandboxStartError("PyodideBackend.prepare() has not run")
        return [
            str(self._deno),
            "run",
            "--no-prompt",
            "--cached-only",
            # Lets the runner give its worker, where sandboxed code runs, fewer permissions still.
            "--unstable-worker-options",
            # The JavaScript heap's own cap; WebAssembly memory has its own maximum (memory_max_bytes).
            f"--v8-flags=--max-old-space-size={self._settings.memory_mb},{self._code_flags()}",
            "--config",
            str(self._runner / "deno.json"),
            # Its token, for the main thread alone: each worker, where sandboxed code runs, has no env.
            f"--allow-env={RUNNER_TOKEN_ENV}",
            # Only what loading the runner and Pyodide needs, and the data folder; all else is denied.
            "--allow-read=" + ",".join(str(path) for path in [*self._readable(), checkpoint_dir]),
            # The runner's own checkpoint files; its worker, where sandboxed code runs, writes nothing.
            f"--allow-write={checkpoint_dir}",
            *([f"--allow-net={self._settings.allow_net}"] if self._settings.allow_net else []),
            str(self._runner / "runner.ts"),
            # How many sandboxes it hosts at most: it starts a worker ahead only while there is room.
            str(self._settings.sandboxes_per_process),
        ]

    def _code_flags(self) -> str:
        """The runner's V8 flags that a code cache must have been made with (V8 refuses it else)."""
        return ",".join(
            [
                # A young generation of 1 MB, not up to 16: each sandbox idles with 8 MB less.
                "--max-semi-space-size=1",
                # For the worker alone to collect once a sandbox goes idle (worker.ts, collectGarbage).
                "--expose-gc",
                # Baseline (Liftoff) code only: no optimizing recompilation in background threads.
                *([] if self._settings.pyodide_tier_up else ["--liftoff-only"]),
            ]
        )

    def _readable(self) -> list[Path]:
        readable = [self._runner, self._pyodide_dir, self._snapshot, self._code_cache]
        if self._settings.data_dir is not None:
            readable.append(self._settings.data_dir)
        if self._settings.packages_folder.is_dir():
            readable.append(self._settings.packages_folder)
        return [path for path in readable if path is not None]

    async def start(self, principal: str | None = None) -> Executor:
        """A new sandbox in a running process with room for `principal`'s, or in a new process."""
        await self._cache_files_in_place()
        host = self._with_room(principal)
        if host is None:
            async with self._new_process:  # one start at a time: a second start waits for its room
                host = self._with_room(principal) or await self._start_process()
        sandbox = host.add()
        watch = HostedWatch(host, sandbox, self._task_group)
        init = self._init(host.folder(sandbox))
        settings = self._settings
        executor = PyodideExecutor(
            RunnerLink(host.pid, watch, watch.channel()),
            self._limits,
            self._hooks,
            init,
            host=host,
            sandbox=sandbox,
            # Without tier-up there is nothing for the warm-up to compile.
            jit_warm_up_rounds=settings.pyodide_warm_up_rounds if settings.pyodide_tier_up else 0,
        )
        await initialize(executor, settings.start_timeout)
        return executor

    async def _cache_files_in_place(self) -> None:
        """Mark the snapshot and code cache used (another server's sweep leaves them), or make them
        again when they were removed (by such a sweep after a week without a start, or by hand)."""
        if self._snapshot is None or self._snapshot.is_file():
            touch(self._snapshot, self._code_cache)
            return
        async with self._remaking:
            if self._snapshot is not None and not self._snapshot.is_file():
                logger.warning("Pyodide's memory snapshot %s was removed: making it again", self._snapshot)
                self._snapshot = await self._make_snapshot()
                self._code_cache = await self._make_code_cache() if self._snapshot else None

    def _with_room(self, principal: str | None) -> RunnerProcess | None:
        """The fullest running process with room (so processes empty out and end), or None."""
        self._processes = [host for host in self._processes if host.watch.alive]
        fitting = [host for host in self._processes if host.has_room(principal)]
        return max(fitting, key=lambda host: host.hosted, default=None)

    async def _start_process(self) -> RunnerProcess:
        # Private (0700) and local: checkpoints pass through it on their way to the store.
        checkpoint_dir = Path(tempfile.mkdtemp(prefix="mcp-sandbox-checkpoint-"))
        token = secrets.token_hex(16)
        try:
            # cwd "/": the sandbox learns nothing from where the server was started. The token goes
            # in the environment, which only the runner's main thread may read, never on its stdin.
            env = {**self._sandbox_env(), RUNNER_TOKEN_ENV: token}
            process = await anyio.open_process(
                self.command(checkpoint_dir), env=env, cwd="/", start_new_session=True
            )
        except BaseException:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
            raise
        settings = self._settings
        host = RunnerProcess(
            process,
            token,
            checkpoint_dir,
            capacity=settings.sandboxes_per_process,
            max_line=max_line(self._limits),
            principals=settings.many_principals,
        )
        start_reading(host.pipe, host.watch, self._task_group, lambda: watchdog_limit(settings, host.hosted))
        self._task_group.start_soon(self._said_when_gone, host)
        self._processes.append(host)
        return host

    async def _said_when_gone(self, host: RunnerProcess) -> None:
        """The log hears why a process ended unasked: its sandboxes' callers hear only that it did."""
        try:
            await host.watch.wait()
            if not host.watch.closed:
                logger.warning(
                    "pyodide process %d ended: %s%s", host.pid, host.watch.reason(), host.watch.stderr_tail()
                )
        finally:  # at shutdown too, when this wait is cancelled
            shutil.rmtree(host.checkpoint_dir, ignore_errors=True)

    def _init(self, checkpoint_dir: Path) -> InitMessage:
        """A new sandbox's `init`: the folders it reads and writes, its memory, what it preloads.
        Never a token: the runner has its process's from its environment, and any sandbox of the
        process can read the runner's stdin (node:fs), so a token sent there would let it forge
        lines as any other."""
        settings = self._settings
        assert self._pyodide_dir is not None
        init = init_message(self._limits, token=False)
        init["checkpoint_dir"] = str(checkpoint_dir)
        init["memory_max_bytes"] = settings.memory_mb * MB
        init["pyodide_dir"] = str(self._pyodide_dir)
        if settings.data_dir is not None:
            init["data_dir"] = str(settings.data_dir)
        if settings.packages_folder.is_dir():
            init["packages_dir"] = str(settings.packages_folder)
        if settings.allow_net:
            init["allow_net"] = settings.allow_net
        if self._snapshot is not None:
            init["snapshot"] = str(self._snapshot)
            # The snapshot holds them: 97 kB less to send, seal and parse for each sandbox.
            init["guest_modules"] = []
        if self._code_cache is not None:
            init["code_cache"] = str(self._code_cache)
            init["code_cache_sha256"] = self._code_cache.stem.rsplit("-", 1)[1]
        if self.preload:
            init["preload"] = self.preload
        return init

    def summary(self) -> str:
        return (
            f"Pyodide {self._version} (WebAssembly, in Deno): no host files or environment; "
            f"{self._network()}. {self._importable()}"
        )

    def _importable(self) -> str:
        names = self._packages.importable() if self._packages is not None else []
        if not names:
            return "Imports: the standard library only."
        return f"Imports: the standard library, {', '.join(names)}."

    def _network(self) -> str:
        allowed = self._settings.allow_net
        return f"network access only to {allowed} (pyodide.http.pyfetch)" if allowed else "no network"


def refuse_web_storage(deno_dir: Path) -> None:
    """Keep Deno from storing what a sandbox puts in the Cache API: it would be on disk under the
    Deno dir's `location_data`, where every later runner process, whoever's, finds it, and no
    permission or cap applies. A file in that folder's place makes every attempt fail. worker.ts
    refuses `caches` too, but a worker a program starts through node:worker_threads has its own."""
    folder = deno_dir / "location_data"
    if folder.is_file() and not folder.is_symlink():
        return
    with contextlib.suppress(OSError):  # another server doing the same meanwhile
        if folder.is_symlink():
            folder.unlink()
        elif folder.is_dir():
            shutil.rmtree(folder)  # what sandboxes stored before: nobody's to read
        folder.write_text("mcp-sandbox: no web storage for sandboxes (refuse_web_storage)\n")


#: MB a Pyodide process holds besides its sandboxes' WebAssembly memory and JavaScript heaps: V8,
#: the compiled WebAssembly, Deno (an idle process with one sandbox is about 200 MB).
PROCESS_MB = 256


def watchdog_limit(settings: Settings, hosted: int) -> int:
    """Bytes of resident memory past which the watchdog kills a Pyodide process hosting `hosted`
    sandboxes: each one's WebAssembly memory (capped at `memory_mb`, past which Python gets
    MemoryError) and JavaScript heap (capped at `memory_mb` by V8) full, and the process's own
    share. A last resort, for growth neither cap sees (JavaScript buffers live outside V8's heap):
    it costs every sandbox of the process its live state."""
    return (2 * settings.memory_mb * max(1, hosted) + PROCESS_MB) * MB


class PyodideExecutor(ProcessExecutor):
    backend: ClassVar[str] = "pyodide"
    checkpoint_timeout: ClassVar[float] = CHECKPOINT_TIMEOUT
    can_kill = True

    def __init__(
        self,
        link: RunnerLink,
        limits: ExecutorLimits,
        hooks: ExecutorHooks,
        init: InitMessage,
        *,
        host: RunnerProcess,
        sandbox: int,
        jit_warm_up_rounds: int,
    ) -> None:
        """`host`: the process it is sandbox number `sandbox` of; `jit_warm_up_rounds`: rounds of
        the guest's JIT warm-up to run when idle (0: none)."""
        self._host = host
        self._sandbox = sandbox
        super().__init__(link, limits, hooks, init, CheckpointFolder(host.folder(sandbox)))
        self.jit_warm_up_rounds = jit_warm_up_rounds
        self._jit_warm_up_sent = False
        #: A program was sent and its outcome not yet read: closed now, it may still be running.
        self._running = False

    @property
    def reusable(self) -> bool:
        return self._reusable and not self._host.retiring

    @reusable.setter
    def reusable(self, value: bool) -> None:
        self._reusable = value

    @property
    def moving_out(self) -> bool:
        return self._host.retiring

    def serves(self, principal: str) -> bool:
        return self._host.serves(principal)

    def claim(self, principal: str) -> None:
        self._host.claim(self._sandbox, principal)

    def unclaim(self) -> None:
        self._host.unclaim(self._sandbox)

    async def renew(self, died: SandboxDied) -> bool:
        self._running = False  # the worker that ran it ended itself, or went back to clean
        return await super().renew(died)

    async def _submit(self, code: str, tools_manifest: str | None) -> None:
        await super()._submit(code, tools_manifest)
        self._running = True

    async def _await_outcome(self) -> GuestOutcome:
        outcome = await super()._await_outcome()
        self._running = False
        return outcome

    async def close(self) -> None:
        # A worker that ended itself (a crash, a kill at a signal check) runs nothing more, but one
        # closed mid-run may be busy in JavaScript, which Worker.terminate does not stop
        # (deno#35657): its process takes no new sandboxes, and ends with those it has.
        if self._running:
            self._host.retire(f"sandbox {self._sandbox} was closed while its program ran")
        await super().close()

    async def jit_warm_up(self) -> None:
        if self.jit_warm_up_rounds > 0 and not self._jit_warm_up_sent and self.alive:
            self._jit_warm_up_sent = True
            with contextlib.suppress(SandboxDied):  # a dead sandbox is found out by its next call
                await self.channel.send({"type": "jit_warm_up", "rounds": self.jit_warm_up_rounds})

    async def recycle(self) -> NotDone | None:
        request: RecycleMessage = {"type": "recycle", "id": 0}
        message = await self._not_ready_for(request) or await self.channel.ask(request, RECYCLE_TIMEOUT)
        if isinstance(message, NotDone):
            return message
        if not message["clean"]:
            return NotDone(message["reason"] or "it is not clean")
        logger.debug("%s sandbox %d recycled in %.1f ms", self.backend, self.pid, message["ms"])
        self._tools_version = -1  # the guest's `tools` went with the rest of its state
        return None


class CheckpointFolder:
    """The sandbox's private checkpoint folder, which only its runner writes (never its worker,
    where sandboxed code runs): its files are read as they are."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    async def read(self, name: str, limit: int) -> bytes:
        return await anyio.to_thread.run_sync(_read_to, self._folder / name, limit + 1)

    async def remove(self, name: str) -> None:
        (self._folder / name).unlink(missing_ok=True)

    async def hand_in(self, name: str, state: bytes) -> None:
        await anyio.to_thread.run_sync((self._folder / name).write_bytes, state)


def _read_to(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a file."""
    with open(path, "rb") as file:
        return file.read(limit)
