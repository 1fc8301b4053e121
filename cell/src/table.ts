// A DataFrame or Series as a table: its shape, scrollable, sorted by clicking a column header
// (ascending, descending, as sent). Rows sent are the head and tail of longer tables: a gap row
// says how many rows between them were not sent.
import type { Table, Value } from "./contract.ts";
import { el, formatCount } from "./dom.ts";

type Order = { column: number; descending: boolean } | null;

const NUMERIC = /^(u?int|float|complex|Int|UInt|Float)/;

function show(value: Value, dtype: string): string {
  if (value === null) return dtype.startsWith("float") || dtype.startsWith("Float") ? "NaN" : "None";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    const size = Math.abs(value);
    if (size !== 0 && (size < 1e-4 || size >= 1e16)) return value.toExponential(6);
    return value.toLocaleString("en-US", { maximumFractionDigits: 6, useGrouping: false });
  }
  return String(value);
}

function compare(a: Value, b: Value): number {
  if (a === null || b === null) return a === b ? 0 : a === null ? 1 : -1;
  if (typeof a === "number" && typeof b === "number") return a - b;
  if (typeof a === "boolean" && typeof b === "boolean") return Number(a) - Number(b);
  return String(a).localeCompare(String(b), undefined, { numeric: true });
}

/** Column -1 is the index. */
function valueAt(table: Table, row: number, column: number): Value {
  return column < 0 ? table.index[row] ?? null : table.rows[row][column] ?? null;
}

export function describe(table: Table): string {
  const [rows, columns] = table.shape;
  const shape = table.kind === "Series"
    ? `${formatCount(rows)} rows`
    : `${formatCount(rows)} rows × ${formatCount(columns)} columns`;
  const sent = table.rows.length < rows ? ` (${formatCount(table.rows.length)} shown)` : "";
  return `${table.kind} · ${shape}${sent}`;
}

export function renderTable(table: Table): HTMLElement {
  const figure = el("figure", "table");
  const caption = el("figcaption", undefined, describe(table));
  const scroll = el("div", "scroll");
  scroll.tabIndex = 0;
  const grid = el("table");
  const head = el("thead");
  const body = el("tbody");
  grid.append(head, body);
  scroll.append(grid);
  figure.append(caption, scroll);

  const numeric = table.columns.map((_, i) => NUMERIC.test(table.dtypes[i] ?? ""));
  let order: Order = null;
  const headers: HTMLTableCellElement[] = [];
  const headRow = el("tr");
  const addHeader = (column: number, name: string, dtype: string | undefined) => {
    const th = el("th", "sortable", name);
    th.scope = "col";
    th.tabIndex = 0;
    th.title = "Sort by this column";
    th.setAttribute("aria-sort", "none");
    th.dataset.column = String(column);
    if (dtype) th.append(el("span", "dtype", dtype));
    const sort = () => {
      order = order?.column !== column
        ? { column, descending: false }
        : order.descending
        ? null
        : { column, descending: true };
      fill();
    };
    th.addEventListener("click", sort);
    th.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        sort();
      }
    });
    headers.push(th);
    headRow.append(th);
  };
  addHeader(-1, table.indexName ?? "", undefined);
  table.columns.forEach((name, i) => addHeader(i, name, table.dtypes[i]));
  head.append(headRow);

  const fill = () => {
    const rows = table.rows.map((_, i) => i);
    if (order) {
      const { column, descending } = order;
      rows.sort((a, b) => {
        const by = compare(valueAt(table, a, column), valueAt(table, b, column));
        return (descending ? -by : by) || a - b;
      });
    }
    for (const th of headers) {
      const column = Number(th.dataset.column);
      const sorted = order?.column === column;
      th.setAttribute("aria-sort", sorted ? (order!.descending ? "descending" : "ascending") : "none");
      th.dataset.sorted = sorted ? (order!.descending ? "▼" : "▲") : "";
    }
    const lines: HTMLTableRowElement[] = [];
    let previous = -1;
    for (const i of rows) {
      const position = table.positions[i];
      if (!order && position > previous + 1 && previous >= 0) lines.push(gap(position - previous - 1));
      previous = position;
      const tr = el("tr");
      const th = el("th", undefined, table.index[i] ?? "");
      th.scope = "row";
      tr.append(th);
      table.columns.forEach((_, column) => {
        const value = table.rows[i][column] ?? null;
        const classes = [numeric[column] || typeof value === "number" ? "num" : "", value === null ? "null" : ""];
        const text = show(value, table.dtypes[column] ?? "");
        const td = el("td", classes.filter(Boolean).join(" "), text);
        if (text.length > 40) td.title = text;
        tr.append(td);
      });
      lines.push(tr);
    }
    const last = table.positions.length ? Math.max(...table.positions) : -1;
    if (!order && last >= 0 && last < table.shape[0] - 1) lines.push(gap(table.shape[0] - 1 - last));
    body.replaceChildren(...lines);
    caption.textContent = describe(table) +
      (order
        ? " · sorted by " + (headers[order.column + 1].firstChild?.textContent || "index") +
          (order.descending ? ", descending" : "") + (table.rows.length < table.shape[0] ? ", the rows shown" : "")
        : "");
  };
  const gap = (missing: number) => {
    const tr = el("tr", "gap");
    const td = el("td", undefined, `⋯ ${formatCount(missing)} more rows ⋯`);
    td.colSpan = table.columns.length + 1;
    tr.append(td);
    return tr;
  };
  fill();
  return figure;
}
