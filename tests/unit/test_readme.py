"""The README's quick start is what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def quick_start_commands() -> list[str]:
    section = (
        (ROOT / "README.md").read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    )
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)]


def test_the_quick_start_is_two_commands() -> None:
    commands = quick_start_commands()
    assert len(commands) == 2, commands
    assert all("\n" not in command for command in commands), commands


def test_ci_runs_the_readmes_test_command() -> None:
    test_command = quick_start_commands()[1]
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert test_command in ci_lines, f"{test_command!r} is not a line of .ci/run"
