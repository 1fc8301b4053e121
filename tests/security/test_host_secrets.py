"""Red team, what the host holds: its environment, its system information, and the host around a
CPython worker (its secrets, its Python, its processes, its kernel)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mcp import Client

from tests.security.harness import (
    BLOCKED,
    HOSTNAME,
    INPROCESS_SHARES,
    INPROCESS_UNSAFE,
    LANDLOCK_SCOPES_SIGNALS,
    NO_SECRET,
    OS_RELEASE,
    README_INPROCESS,
    README_NONE,
    READS_DECIDE,
    REPO,
    SECCOMP_REFUSES,
    SHADOW_LINE,
    SSH_KEY_TEXT,
    VICTIM_TEXT,
    WRITES_DECIDE,
    Attack,
    NotProtected,
    Skip,
    World,
    all_of,
    attack_ids,
    data_intact,
    everywhere,
    failed,
    no_poison_in_environment,
    not_shown,
    not_true,
    on,
    program,
    pyodide_only,
    result_is,
    result_lacks_any,
    run_attack,
    victim_alive,
    victim_limits_intact,
)

pytestmark = pytest.mark.anyio


ATTACKS: list[Attack] = [
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
                "docs/security.md table: system information is not protected on subprocess"
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
            unconfined=Skip(
                "isolation none filters no system calls: the kernel's settings decide (docs/security.md)"
            ),
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
            unconfined=Skip(
                "isolation none filters no system calls: the kernel's modules decide (docs/security.md)"
            ),
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
]


@pytest.mark.parametrize("attack", ATTACKS, ids=attack_ids(ATTACKS))
async def test_attack(attack: Attack, backend: str, client: Client, world: World, tmp_path: Path) -> None:
    await run_attack(attack, backend, client, world, tmp_path)
