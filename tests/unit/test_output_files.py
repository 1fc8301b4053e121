"""Reading output/ files back on the host: never through a link, never more than asked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_sandbox.result import kept_output, read_output_file


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "output" / "sub").mkdir(parents=True)
    (tmp_path / "output" / "report.csv").write_text("a,b\n1,2\n")
    (tmp_path / "output" / "sub" / "deep.txt").write_text("deep")
    (tmp_path / "secret.txt").write_text("host secret")
    return tmp_path


def test_a_regular_file_inside_output_is_read(workdir: Path) -> None:
    assert read_output_file(workdir, "report.csv", 1000) == b"a,b\n1,2\n"
    assert read_output_file(workdir, "sub/deep.txt", 1000) == b"deep"


def test_no_more_than_the_limit_and_one_byte_is_read(workdir: Path) -> None:
    assert read_output_file(workdir, "report.csv", 3) == b"a,b\n"


@pytest.mark.parametrize(
    "plant",
    [
        lambda w: (w / "output" / "link.txt").symlink_to(w / "secret.txt"),
        lambda w: (w / "output" / "dir").symlink_to(w, target_is_directory=True),
        lambda w: (w / "output" / "link.txt").symlink_to("/dev/zero"),
        lambda w: os.mkfifo(w / "output" / "link.txt"),
    ],
    ids=["link-to-a-host-file", "link-to-a-host-folder", "link-to-dev-zero", "fifo"],
)
def test_links_and_special_files_are_not_followed(workdir: Path, plant: object) -> None:
    plant(workdir)  # type: ignore[operator]
    name = "dir/secret.txt" if (workdir / "output" / "dir").exists() else "link.txt"
    assert read_output_file(workdir, name, 1 << 20) is None


def test_output_itself_as_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.txt").write_text("x")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "output").symlink_to(elsewhere, target_is_directory=True)
    assert read_output_file(tmp_path / "work", "x.txt", 100) is None


@pytest.mark.parametrize(
    "forged",
    [
        {"text": 5, "total": 1},
        {"text": "x", "total": True},
        {"text": "x"},
        {"text": "x", "total": 1, "more": 1},
        "x",
    ],
)
def test_a_kept_stream_the_guest_misreports_is_ignored(forged: object) -> None:
    assert kept_output(forged, 100) is None


def test_a_kept_stream_is_held_to_the_keep_limit_and_valid_utf8() -> None:
    kept = kept_output({"text": "\ud800" + "y" * 500, "total": 3}, 100)
    assert kept is not None and len(kept.text) == 100 and kept.text.startswith("?")
    assert kept.total == 100, "never fewer characters written than kept"
