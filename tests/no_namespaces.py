"""Runs a command the way Docker's default seccomp profile would: no new namespaces (and, with
--no-landlock, no Landlock either, as on an old kernel). Inherited by everything it starts.

    python -m tests.no_namespaces [--no-landlock] -- COMMAND...
"""

from __future__ import annotations

import errno
import os
import sys

import pyseccomp as sc  # type: ignore[import-untyped]

from mcp_sandbox.backends.subprocess.isolation import CLONE_NAMESPACES


def main(argv: list[str]) -> None:
    no_landlock = "--no-landlock" in argv[: argv.index("--")]
    command = argv[argv.index("--") + 1 :]
    rules = sc.SyscallFilter(sc.ALLOW)
    for name in ("unshare", "setns"):
        rules.add_rule(sc.ERRNO(errno.EPERM), name)
    for flag in CLONE_NAMESPACES:
        rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    if no_landlock:
        for name in ("landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self"):
            rules.add_rule(sc.ERRNO(errno.ENOSYS), name)
    rules.load()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
