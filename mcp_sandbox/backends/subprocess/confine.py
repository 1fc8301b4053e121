"""Runs inside a CPython worker (tier `landlock`): the worker confines itself, before any user
code runs, with Landlock (files, TCP, abstract unix sockets, signals) and the seccomp filter the
host built (isolation.py). Standard library only (ctypes).

Both apply to the calling thread and what it starts later, so the worker confines itself while
it is still single-threaded (before numpy's OpenBLAS, say, has started threads).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

#: landlock_create_ruleset, landlock_add_rule, landlock_restrict_self: one numbering on every
#: architecture Linux has with Landlock, except alpha.
_LANDLOCK_CALLS = (444, 445, 446) if platform.machine() != "alpha" else None
PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS, SECCOMP_MODE_FILTER = 22, 38, 2
LANDLOCK_CREATE_RULESET_VERSION, LANDLOCK_RULE_PATH_BENEATH = 1, 1

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
#: The rights Landlock accepts on a path that is not a directory.
FS_FILE = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1  # ABI 6


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _failed(what: str) -> OSError:
    number = ctypes.get_errno()
    return OSError(number, f"{what} failed: {os.strerror(number)}")


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none. Never raises."""
    if _LANDLOCK_CALLS is None:
        return 0
    version = _syscall(
        ctypes.c_long(_LANDLOCK_CALLS[0]),
        ctypes.c_void_p(None),
        ctypes.c_size_t(0),
        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION),
    )
    return max(int(version), 0)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1  # the 13 rights of ABI 1
    rights |= FS_REFER if abi >= 2 else 0
    rights |= FS_TRUNCATE if abi >= 3 else 0
    return rights | (FS_IOCTL_DEV if abi >= 5 else 0)


def apply_landlock(read_only: list[str], read_write: list[str]) -> int:
    """Only reading (and executing) beneath `read_only`, everything beneath `read_write`, no TCP
    (ABI 4+), no abstract unix sockets or signals leaving the sandbox (ABI 6+). Missing paths
    are skipped. Returns the ABI used; raises OSError."""
    abi = landlock_abi()
    if abi < 1 or _LANDLOCK_CALLS is None:
        raise OSError(errno.ENOSYS, "Landlock is not available on this kernel")
    create, add_rule, restrict_self = _LANDLOCK_CALLS
    every = _fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=every)
    size = 8
    if abi >= 4:
        attr.handled_access_net, size = NET_BIND_TCP | NET_CONNECT_TCP, 16
    if abi >= 6:
        attr.scoped, size = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL, 24
    ruleset = _syscall(ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _failed(f"landlock_create_ruleset (ABI {abi})")
    try:
        for path, access in [(p, FS_READ) for p in read_only] + [(p, every) for p in read_write]:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= FS_FILE
                rule = _PathBeneathAttr(allowed_access=access & every, parent_fd=fd)
                done = _syscall(
                    ctypes.c_long(add_rule),
                    ctypes.c_int(ruleset),
                    ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH),
                    ctypes.byref(rule),
                    ctypes.c_uint32(0),
                )
                if done < 0:
                    raise _failed(f"landlock_add_rule({path!r})")
            finally:
                os.close(fd)
        if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(ctypes.c_long(restrict_self), ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise _failed("landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


CAP_DAC_READ_SEARCH = 2
PR_CAPBSET_DROP, PR_SET_KEEPCAPS = 24, 8
_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def become(uid: int, read_anything: bool) -> None:
    """From root to `uid` with no capability left, not even in the bounding set; with
    `read_anything`, CAP_DAC_READ_SEARCH alone stays, so a Python other users cannot read (under
    a private home) still loads. Raises OSError."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as last:
            last_cap = int(last.read())
    except (OSError, ValueError):
        last_cap = 63
    kept = {CAP_DAC_READ_SEARCH} if read_anything else set()
    for cap in range(last_cap + 1):
        # Needs CAP_SETPCAP; bubblewrap gives it. Without it the bounding set stays, and
        # no_new_privs (set by the seccomp filter) keeps it from ever being used.
        if (
            cap not in kept
            and _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0
            and ctypes.get_errno() != errno.EPERM
        ):
            raise _failed(f"prctl(PR_CAPBSET_DROP, {cap})")
    if kept and _prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise _failed("prctl(PR_SET_KEEPCAPS)")
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # every capability but those kept above goes with uid 0
    if kept:
        bits = sum(1 << cap for cap in kept)
        data = (_CapData * 2)(_CapData(bits, bits, 0), _CapData(0, 0, 0))
        header = _CapHeader(_CAPABILITY_VERSION_3, 0)
        if _libc.capset(ctypes.byref(header), data) != 0:
            raise _failed("capset")
        _prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)


def install_seccomp(program: bytes) -> None:
    """Install a seccomp filter: `program` is an array of struct sock_filter, as libseccomp's
    seccomp_export_bpf writes it. Raises OSError or ValueError."""
    count, rest = divmod(len(program), ctypes.sizeof(_SockFilter))
    if rest or not 0 < count <= 4096:
        raise ValueError(f"a seccomp program is 1 to 4096 eight-byte instructions, not {len(program)} bytes")
    instructions = (_SockFilter * count).from_buffer_copy(program)
    fprog = _SockFprog(len=count, filter=ctypes.cast(instructions, ctypes.POINTER(_SockFilter)))
    if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise _failed("prctl(PR_SET_NO_NEW_PRIVS)")
    if _prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        raise _failed("prctl(PR_SET_SECCOMP)")
