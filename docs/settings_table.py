"""Rewrites the settings table in docs/settings.md from `Settings` (mcp_sandbox/settings.py).

    python docs/settings_table.py

tests/unit/test_settings_table.py fails while the table and `Settings` differ.
"""

from pathlib import Path

from mcp_sandbox.settings import with_settings_table

DOCUMENT = Path(__file__).resolve().with_name("settings.md")

if __name__ == "__main__":
    DOCUMENT.write_text(with_settings_table(DOCUMENT.read_text(encoding="utf-8")), encoding="utf-8")
