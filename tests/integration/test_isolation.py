"""The subprocess backend's OS sandbox: which tier runs, what says so, and what still works in it.

The attacks on each tier are the red team's (tests/security/); these are the user's side: the
tier is chosen at start and named in the log, `doctor` and the tool description; a tier that
fails falls to the next; numpy, pandas, matplotlib, data/, output/, tools and timeouts work.
Docker's default seccomp profile (no new namespaces) is imitated by tests/no_namespaces.py.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from mcp_sandbox import Sandbox
from tests.helpers import TEST_ENV, missing_tier
from tests.integration.test_cli import ENTRY_POINT, check_line, cli_env

REPO = Path(__file__).resolve().parents[2]
NO_NAMESPACES = [sys.executable, "-m", "tests.no_namespaces", "--"]
NEITHER = [sys.executable, "-m", "tests.no_namespaces", "--no-landlock", "--"]

PIPELINE = """
import json, os
import numpy as np, pandas as pd
import matplotlib.pyplot as plt
frame = pd.read_csv('data/numbers.csv')
frame['square'] = np.square(frame['n'])
frame.to_csv('output/squares.csv', index=False)
plt.plot(frame['n'], frame['square'])
plt.show()
total = tools.local.add(a=int(frame['square'].sum()), b=1)
(total, os.getcwd() != '/', open('output/squares.csv').read().count('\\n'))
"""


def tier_works(tier: str) -> str | None:
    """None when the subprocess backend starts here with `tier`, else its error."""
    done = subprocess.run(
        [str(ENTRY_POINT), "run", "--backend", "subprocess", "-"],
        input="1",
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(MCP_SANDBOX_ISOLATION=tier),
        check=False,
        cwd=REPO,
    )
    return None if done.returncode == 0 else done.stderr[-300:]


def run_under(prefix: list[str], code: str, **settings: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, str(ENTRY_POINT), "run", "--backend", "subprocess", "-"],
        input=code,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(**settings),
        check=False,
        cwd=REPO,
    )


@pytest.mark.parametrize("tier", ["bubblewrap", "landlock"])
async def test_what_users_rely_on_works_in_each_tier(anyio_backend: str, tier: str, tmp_path: Path) -> None:
    if (problem := tier_works(tier)) is not None:
        missing_tier(tier, problem)
    data = tmp_path / "data"
    data.mkdir()
    (data / "numbers.csv").write_text("n\n1\n2\n3\n")
    async with Sandbox(
        backend="subprocess", isolation=tier, data_dir=data, pool_size=1, tools={"add": lambda a, b: a + b}
    ) as sandbox:
        done = await sandbox.run(PIPELINE, session_id="s", timeout=60)
        assert done.success, done.error
        assert done.result == "(15, True, 4)"
        assert done.figures == 1
        assert [file.name for file in done.files] == ["squares.csv"]
        # A timeout interrupts the worker itself: the session and its variables survive.
        slow = await sandbox.run("while True: pass", session_id="s", timeout=1)
        assert (slow.error_type, slow.session_lost) == ("Timeout", False)
        assert (await sandbox.run("len(frame)", session_id="s")).result == "3"


async def test_the_tool_description_and_doctor_name_the_tier(anyio_backend: str, tmp_path: Path) -> None:
    if (problem := tier_works("bubblewrap")) is not None:
        missing_tier("bubblewrap", problem)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox"],
        env={**TEST_ENV, "MCP_SANDBOX_BACKEND": "subprocess"},
    )
    async with Client(params) as client:
        tools = {tool.name: tool.description or "" for tool in (await client.list_tools()).tools}
    assert "inside a bubblewrap sandbox" in tools["execute_python"]
    doctor = [str(ENTRY_POINT), "doctor", "--backend", "subprocess"]
    done = await anyio.run_process(doctor, env=cli_env(), cwd=tmp_path, check=False)
    output = done.stdout.decode()
    mark, detail = check_line(output, "isolation")
    assert mark == "✓" and "(tier bubblewrap)" in detail, output
    assert check_line(output, "subprocess backend")[0] == "✓" and "pyodide backend" not in output, output


def test_without_namespaces_it_falls_back_to_landlock_and_says_why(tmp_path: Path) -> None:
    """As in Docker's default profile: bubblewrap cannot make namespaces, Landlock still works."""
    if (problem := tier_works("landlock")) is not None:
        missing_tier("landlock", problem)
    done = run_under(NO_NAMESPACES, "open('/etc/passwd').read()")
    assert done.returncode == 1 and "PermissionError" in done.stderr, done.stderr
    warning = next(line for line in done.stderr.splitlines() if "no bubblewrap isolation" in line)
    assert "Operation not permitted" in warning and "fix: " in warning and "seccomp profile" in warning
    assert "isolation landlock" in done.stderr  # the tier in force, in the log
    doctor = subprocess.run(
        [*NO_NAMESPACES, str(ENTRY_POINT), "doctor", "--backend", "subprocess"],
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(),
        cwd=tmp_path,
    )
    mark, detail = check_line(doctor.stdout, "isolation")
    assert mark == "✓" and "(tier landlock)" in detail and "not bubblewrap: " in detail, doctor.stdout


def test_with_neither_it_warns_loudly_or_refuses_to_start(tmp_path: Path) -> None:
    """No namespaces and no Landlock: workers run, with a warning everywhere, unless refused."""
    done = run_under(NEITHER, "'ran'")
    assert done.returncode == 0 and done.stdout.strip() == "'ran'", done.stderr
    assert "isolation none" in done.stderr and "no OS sandbox" in done.stderr
    refused = run_under(NEITHER, "'ran'", MCP_SANDBOX_REQUIRE_ISOLATION="true")
    assert refused.returncode != 0 and "'ran'" not in refused.stdout
    assert "MCP_SANDBOX_REQUIRE_ISOLATION" in refused.stderr.splitlines()[-1], refused.stderr
    assert "Traceback" not in refused.stderr
    for require, expected in (("false", "!"), ("true", "✗")):
        doctor = subprocess.run(
            [*NEITHER, str(ENTRY_POINT), "doctor", "--backend", "subprocess"],
            capture_output=True,
            text=True,
            timeout=300,
            env=cli_env(MCP_SANDBOX_REQUIRE_ISOLATION=require),
            cwd=tmp_path,
        )
        mark, detail = check_line(doctor.stdout, "isolation")
        assert mark == expected and "(tier none)" in detail and "not landlock: " in detail, doctor.stdout


def test_a_forced_tier_that_is_missing_is_a_clear_start_error() -> None:
    done = run_under(NO_NAMESPACES, "1", MCP_SANDBOX_ISOLATION="bubblewrap")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "isolation 'bubblewrap' is not available here" in last and "Traceback" not in done.stderr, last


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid range is used only when the server runs as root")
async def test_as_root_each_worker_runs_under_a_uid_of_its_own(anyio_backend: str) -> None:
    if (problem := tier_works("bubblewrap")) is not None:
        missing_tier("bubblewrap", problem)
    async with Sandbox(backend="subprocess", isolation="bubblewrap", pool_size=0) as sandbox:
        first = await sandbox.run("import os\nos.getuid()", session_id="a")
        second = await sandbox.run("import os\nos.getuid()", session_id="b")
    uids = {int(first.result or 0), int(second.result or 0)}
    assert len(uids) == 2 and all(64000 <= uid <= 64999 for uid in uids), (first, second)


BUBBLEWRAP_VIEW = """
import os
def refused(action):
    try:
        action()
    except OSError as error:
        return type(error).__name__
    return 'allowed'
def fill(path, megabytes):
    with open(path, 'wb') as f:
        for _ in range(megabytes):
            f.write(b'x' * 2**20)
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
{
    'root': sorted(os.listdir('/')),
    'etc': sorted(os.listdir('/etc')),
    'tmp_70mb': refused(lambda: fill('/tmp/big', 70)),
    'shm_20mb': refused(lambda: fill('/dev/shm/big', 20)),
    'dev_write': refused(lambda: open('/dev/new', 'w')),
    'capabilities': status['CapEff'].strip(),
    'processes': len([name for name in os.listdir('/proc') if name.isdigit()]),
}
"""


async def test_what_a_bubblewrap_worker_sees(anyio_backend: str) -> None:
    """The root holds only what Python needs; /tmp and /dev/shm are capped; /dev is read-only."""
    if (problem := tier_works("bubblewrap")) is not None:
        missing_tier("bubblewrap", problem)
    async with Sandbox(backend="subprocess", isolation="bubblewrap", pool_size=0) as sandbox:
        done = await sandbox.run(BUBBLEWRAP_VIEW, timeout=60)
    assert done.success, done.error
    view = ast.literal_eval(done.result or "")
    # The system's folders, the sandbox's own, and the top folders of Python's prefixes.
    allowed = {"usr", "lib", "lib64", "bin", "sbin", "etc", "opt", "sandbox", "proc", "dev", "tmp"}
    allowed |= {Path(prefix).resolve().parts[1] for prefix in (sys.prefix, sys.base_prefix)}
    assert set(view["root"]) <= allowed, view["root"]
    assert view["etc"] == ["ld.so.cache", "localtime"] or view["etc"] == ["ld.so.cache"], view["etc"]
    assert view["tmp_70mb"] == "OSError" and view["shm_20mb"] == "OSError", view
    assert view["dev_write"] in ("OSError", "PermissionError"), view
    assert view["capabilities"] == "0000000000000000", view
    assert view["processes"] <= 3, view  # bubblewrap's init, the worker, and nothing of the host


SWAPPER = """
import os, time
if os.fork() == 0:
    end = time.time() + 20
    while time.time() < end:
        for k in range(20):
            try:
                os.symlink(@SECRET@, f"output/.l{k}")
                os.rename(f"output/.l{k}", f"output/a{k}.txt")
                with open(f"output/.f{k}", "w") as f:
                    f.write("harmless")
                os.rename(f"output/.f{k}", f"output/a{k}.txt")
            except OSError:
                pass
    os._exit(0)
"swapping"
"""


@pytest.mark.parametrize("tier", ["bubblewrap", "landlock"])
async def test_a_file_swapped_for_a_link_is_never_read_through(
    anyio_backend: str, tier: str, tmp_path: Path
) -> None:
    """A process the program leaves running swaps output/ files for links to a host file while
    the server reads them back: the server must never follow one (it runs as root)."""
    if (problem := tier_works(tier)) is not None:
        missing_tier(tier, problem)
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    secret.chmod(0o644)
    async with Sandbox(backend="subprocess", isolation=tier, pool_size=0) as sandbox:
        started = await sandbox.run(SWAPPER.replace("@SECRET@", repr(str(secret))), session_id="s")
        assert started.result == "'swapping'", started.error
        for _ in range(150):  # before the fix, the secret came back within 20 calls
            done = await sandbox.run("import time\ntime.sleep(0.01)", session_id="s")
            assert all(b"TOPSECRET" not in data for data in done.artifacts.files.values())


LEFT_RUNNING = """
import os, time
for detach in (False, True):
    if os.fork() == 0:
        if detach:
            try:
                os.setsid()  # out of the worker's process group, where allowed
            except OSError:
                pass
        time.sleep(60)
        os._exit(0)
os.getuid()
"""


def processes_of(uid: int) -> list[int]:
    """Live processes of `uid`; zombies (dead, waiting for init to reap them) are not counted."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                if state != b"Z":
                    found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="workers have uids of their own only when the server is root")
@pytest.mark.parametrize("tier", ["bubblewrap", "landlock", "none"])
async def test_no_capability_is_left_and_nothing_outlives_the_session(anyio_backend: str, tier: str) -> None:
    if (problem := tier_works(tier)) is not None:
        missing_tier(tier, problem)
    async with Sandbox(backend="subprocess", isolation=tier, pool_size=0) as sandbox:
        done = await sandbox.run(LEFT_RUNNING, session_id="s")
        assert done.success, done.error
        uid = int(done.result or 0)
        assert 64000 <= uid <= 64999
        assert len(processes_of(uid)) >= 3, "the worker and its two children should be running"
        for pid in processes_of(uid):  # read on the host: Landlock hides /proc from the worker
            status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
            effective, bounding = int(status["CapEff"], 16), int(status["CapBnd"], 16)
            permitted = int(status["CapPrm"], 16)
            # None at all; outside bubblewrap, CAP_DAC_READ_SEARCH alone (bit 2) for a Python only
            # root can read, with the bounding set emptied. In bubblewrap the bounding set stays
            # (emptying it needs ctypes at every start), and no_new_privs keeps it out of reach.
            if tier == "bubblewrap":
                assert (effective, permitted, status["NoNewPrivs"].strip()) == (0, 0, "1"), status
            else:
                assert effective in {0, 1 << 2} and bounding in {0, 1 << 2}, (tier, status["CapBnd"])
        assert await sandbox.reset("s") is True
        for _ in range(50):
            if not processes_of(uid):
                break
            await anyio.sleep(0.1)
        assert processes_of(uid) == [], "a process the session started outlived it"
