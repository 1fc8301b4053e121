"""The DataFrames and Series a run shows, as data for a notebook view: what display() shows, and
the final value. Each also reads as text where the model reads (display() prints it)."""

from __future__ import annotations

import math
import sys
from typing import Any

from mcp_sandbox.guest.capture import CappedText
from mcp_sandbox.guest.program import value_text
from mcp_sandbox.protocol import MAX_CELL_CHARS, MAX_TABLE_COLUMNS, MAX_TABLE_ROWS, MAX_TABLES, GuestTable

#: A cell as the protocol sends it (GuestTable.rows).
Cell = int | float | str | bool | None


class Display:
    """`display(*objects)` in a session, as in a notebook: each object's text goes to the run's
    stdout (where the model reads it), and a DataFrame or Series is kept as a table too, with the
    span of stdout its text took. The final value joins the tables through `show`."""

    def __init__(self) -> None:
        self._stdout: CappedText | None = None
        self.tables: list[GuestTable] = []
        self.left_out = 0

    def __call__(self, *objects: Any) -> None:
        for value in objects:
            text = value_text(value) + "\n"
            stdout = self._stdout
            if stdout is None:  # outside a run (a thread the program left behind): text only
                sys.stdout.write(text)
                continue
            start = stdout.total
            stdout.write(text)
            self.show(value, "display", [start, stdout.total])

    def begin(self, stdout: CappedText) -> None:
        """A new run, whose stdout is `stdout`."""
        self._stdout, self.tables, self.left_out = stdout, [], 0

    def show(self, value: Any, source: str, printed: list[int] | None = None) -> None:
        """Keep `value` as a table when it is a DataFrame or Series (within MAX_TABLES)."""
        if len(self.tables) >= MAX_TABLES:
            self.left_out += is_table(value)
            return
        table = table_of(value, source, printed)
        if table is not None:
            self.tables.append(table)

    def take(self, notes: list[str]) -> list[GuestTable]:
        """The run's tables, without their stdout spans when stdout was cut (they would no longer
        point into what is sent)."""
        if self._stdout is not None and self._stdout.truncated:
            for table in self.tables:
                table["printed"] = None
        if self.left_out:
            notes.append(f"{self.left_out} tables left out of the notebook view: at most {MAX_TABLES} a call")
        tables, self.tables, self._stdout = self.tables, [], None
        return tables


def is_table(value: Any) -> bool:
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame | pandas.Series)


def table_of(value: Any, source: str, printed: list[int] | None = None) -> GuestTable | None:
    """`value` as a table of its head and tail rows and first columns, or None when it is no
    DataFrame or Series, or it cannot be read (a program's own subclass may fail anywhere)."""
    if not is_table(value):
        return None
    try:
        return _table(value, source, printed)
    except Exception:  # noqa: BLE001 - a table that cannot be read is shown as text only
        return None


def _table(value: Any, source: str, printed: list[int] | None) -> GuestTable:
    pandas = sys.modules["pandas"]
    series = isinstance(value, pandas.Series)
    frame = value.to_frame(name=value.name if value.name is not None else "value") if series else value
    count = len(frame)
    half = MAX_TABLE_ROWS // 2
    positions = list(range(count)) if count <= MAX_TABLE_ROWS else [*range(half), *range(count - half, count)]
    shown = frame.iloc[positions, :MAX_TABLE_COLUMNS]
    rows = [[_cell(cell) for cell in row] for row in shown.itertuples(index=False, name=None)]
    kind = "Series" if series else "DataFrame"
    return {
        "kind": kind,  # type: ignore[typeddict-item]
        "source": source,  # type: ignore[typeddict-item]
        "shape": [count, 1] if series else [count, len(frame.columns)],
        "columns": [_label(column) for column in shown.columns],
        "dtypes": [_label(dtype) for dtype in shown.dtypes],
        "index_name": None if frame.index.name is None else _label(frame.index.name),
        "index": [_label(label) for label in shown.index],
        "rows": rows,
        "positions": positions,
        "printed": printed,
    }


def _cell(value: Any) -> Cell:
    """A cell as JSON: numbers and booleans as they are (NaN and infinities as null), the rest as
    its text."""
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.generic) and value.dtype.kind in "biuf":
        value = value.item()
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value[:MAX_CELL_CHARS]
    if _missing(value):
        return None
    return _label(value)


def _missing(value: Any) -> bool:
    pandas = sys.modules.get("pandas")
    try:
        return pandas is not None and bool(pandas.isna(value))
    except (TypeError, ValueError):
        return False


def _label(value: Any) -> str:
    return str(value)[:MAX_CELL_CHARS]
