"""The subprocess backend's font cache, kept for the next server: whole or not at all, and named
by what it depends on."""

from __future__ import annotations

from pathlib import Path

from mcp_sandbox.backends.subprocess import _font_cache_folder, _keep_font_cache, _read_kept_font_cache


def test_a_kept_font_cache_reads_back_whole(tmp_path: Path) -> None:
    folder = _font_cache_folder(tmp_path, "bubblewrap")
    assert _read_kept_font_cache(folder) is None
    _keep_font_cache(folder, "fontlist-v390.json", b'{"fonts": []}')
    assert _read_kept_font_cache(folder) == ("fontlist-v390.json", b'{"fonts": []}')
    assert not [name for name in os_listdir(folder) if name.endswith(".part")], "no half-written file left"


def test_each_tier_keeps_its_own(tmp_path: Path) -> None:
    assert _font_cache_folder(tmp_path, "bubblewrap") != _font_cache_folder(tmp_path, "landlock")


def test_a_link_in_place_of_the_cache_is_not_read(tmp_path: Path) -> None:
    folder = _font_cache_folder(tmp_path, "none")
    folder.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("not a font cache")
    (folder / "fontlist-v390.json").symlink_to(secret)
    assert _read_kept_font_cache(folder) is None


def os_listdir(folder: Path) -> list[str]:
    return [path.name for path in folder.iterdir()]
