"""Tables for the notebook view: what the guest makes of a DataFrame or Series, and the caps the
host holds whatever a guest sends."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from mcp_sandbox.guest.capture import CappedText
from mcp_sandbox.guest.tables import Display, table_of
from mcp_sandbox.protocol import MAX_CELL_CHARS, MAX_TABLE_COLUMNS, MAX_TABLE_ROWS, GuestTable
from mcp_sandbox.result import table_within_caps


def test_cells_are_json_numbers_booleans_text_or_null() -> None:
    frame = pd.DataFrame(
        {
            "int": np.array([1, 2, 3], dtype=np.int64),
            "float": [0.5, math.inf, math.nan],
            "bool": [True, False, True],
            "when": pd.to_datetime(["2024-01-01", None, "2024-01-03"]),
            "long": ["x" * 500, None, "z"],
        }
    )
    table = table_of(frame, "value")
    assert table is not None
    assert table["rows"][0][:3] == [1, 0.5, True] and type(table["rows"][0][0]) is int
    assert table["rows"][1][1:] == [None, False, None, None], "infinity, NaT and None are null"
    assert table["rows"][0][4] == "x" * MAX_CELL_CHARS
    assert table["dtypes"][0] == "int64" and table["shape"] == [3, 5]


def test_a_long_wide_table_sends_its_head_tail_and_first_columns() -> None:
    frame = pd.DataFrame(np.zeros((1000, 80)))
    table = table_of(frame, "display", [0, 5])
    assert table is not None and table["shape"] == [1000, 80]
    assert len(table["rows"]) == MAX_TABLE_ROWS and len(table["columns"]) == MAX_TABLE_COLUMNS
    assert table["positions"][MAX_TABLE_ROWS // 2 - 1 : MAX_TABLE_ROWS // 2 + 1] == [49, 950]


def test_what_is_no_table_or_cannot_be_read_is_none() -> None:
    class Broken(pd.DataFrame):
        @property
        def iloc(self) -> Any:
            raise RuntimeError("no")

    assert table_of([1, 2], "value") is None
    assert table_of(Broken({"a": [1]}), "value") is None


def test_display_prints_each_value_and_records_the_span_its_table_took() -> None:
    stdout, display = CappedText(10_000), Display()
    display.begin(stdout)
    stdout.write("a\n")
    display(pd.Series([1, 2], name="s"), 3)
    notes: list[str] = []
    (table,) = display.take(notes)
    start, end = table["printed"] or [0, 0]
    assert stdout.getvalue()[:start] == "a\n" and stdout.getvalue()[end:] == "3\n"
    assert "Name: s" in stdout.getvalue()[start:end] and notes == []


def test_the_host_caps_what_a_guest_sends() -> None:
    huge: GuestTable = {
        "kind": "DataFrame",
        "source": "display",
        "shape": [-1, 10**9],
        "columns": ["c" * 10_000] * 10_000,
        "dtypes": ["int64"] * 10_000,
        "index_name": "\ud800",
        "index": ["0"] * 10_000,
        "rows": [["v" * 10_000] * 10_000] * 1000,
        "positions": list(range(10_000)),
        "printed": [1],
    }
    table = table_within_caps(huge)
    assert len(table["rows"]) == MAX_TABLE_ROWS and len(table["rows"][0]) == MAX_TABLE_COLUMNS
    assert len(table["columns"]) == MAX_TABLE_COLUMNS and len(table["columns"][0]) == MAX_CELL_CHARS
    assert len(table["index"]) == len(table["positions"]) == MAX_TABLE_ROWS
    assert table["shape"][0] == 0 and table["printed"] is None and table["index_name"] == "?"


def test_display_outside_a_run_still_prints(capsys: pytest.CaptureFixture[str]) -> None:
    Display()(pd.Series([5], name="late"))
    assert "Name: late" in capsys.readouterr().out
