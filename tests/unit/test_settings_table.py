"""docs/settings.md's table is the one `Settings` makes: a setting added, renamed or redescribed
fails here until the document is regenerated."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_sandbox.settings import TABLE_BEGIN, TABLE_END, Settings, settings_table, with_settings_table

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_documented_table_is_the_one_settings_makes() -> None:
    document = DOCUMENT.read_text(encoding="utf-8")
    assert with_settings_table(document) == document, (
        "docs/settings.md's table differs from Settings: run `python docs/settings_table.py`"
    )


def test_the_table_names_every_setting_once() -> None:
    rows = settings_table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == [
        f"MCP_SANDBOX_{name.upper()}" for name in Settings.model_fields
    ]


def test_a_document_without_the_markers_is_refused() -> None:
    with pytest.raises(ValueError, match="lacks"):
        with_settings_table(f"{TABLE_BEGIN}\nno end")
    assert with_settings_table(f"a\n{TABLE_BEGIN}\nold\n{TABLE_END}\nb").endswith(f"{TABLE_END}\nb")
