"""A CPython sandbox's working directory: data/ (the host's data, read-only) and output/."""

from __future__ import annotations

from pathlib import Path


def prepare_workspace(workdir: Path, data_dir: Path | None) -> None:
    """A session's working directory: output/ to write results to, data/ linking the host's data."""
    (workdir / "output").mkdir(exist_ok=True)
    if data_dir is not None and not (workdir / "data").exists():
        (workdir / "data").symlink_to(data_dir, target_is_directory=True)


def read_output_file(workdir: Path, path: str) -> bytes | None:
    """output/`path` under `workdir`, if it is a regular file really inside output/ (no links out)."""
    root = (workdir / "output").resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or not target.is_file():
        return None
    try:
        return target.read_bytes()
    except OSError:
        return None
