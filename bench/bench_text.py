"""What the model reads of a result: the text block of execute_python over a fixed corpus of
ordinary calls, against the JSON text it was before (MCP_SANDBOX_RESULT_TEXT=json) and against
pydantic's mcp-run-python rendering the same results.

Run from the repository root:  .venv/bin/python bench/bench_text.py [--backend pyodide] [--json PATH]

Real servers over stdio, through the real MCP client, with MCP_SANDBOX_MAX_OUTPUT_CHARS=2000 so the
cut output is cut at 2,000 characters. mcp-run-python's rendering (its default `xml` return mode:
`<status>`, `<output>` with one line an entry, stdout then stderr, `<return_value>` as JSON with an
indent of 2, or `<error>`) is rebuilt here from the same structured results, so both render the
same runs; a sandbox outcome (a timeout) is its error, as `Type: message`, and a note goes into its
error, where mcp-run-python writes install errors. Tokens are estimated as characters / 4, as in
bench_tokens.py. About 30 seconds.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import json
import sys
from pathlib import Path
from typing import Any

import anyio
from common import save
from mcp import Client, StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "text.json"
MAX_OUTPUT_CHARS = 2000

#: The corpus: (name, code, timeout or None).
CORPUS: list[tuple[str, str, float | None]] = [
    ("value", "x = 6 * 7; x", None),
    ("print", "print('hello, world')", None),
    ("five lines", "for i in range(5):\n    print(f'row {i}: {i * i}')", None),
    ("error", "def mean(xs):\n    return sum(xs) / len(xs)\nmean([])", None),
    ("list", "[n * n for n in range(12)]", None),
    ("nothing", "y = 1", None),
    ("stdout and stderr", "import sys\nprint('done')\nprint('warning: slow', file=sys.stderr)", None),
    ("timeout", "import time\ntime.sleep(5)", 0.5),
    ("cut output", "for i in range(1000):\n    print(f'line {i}')", None),
    ("failed import with its note", "import pandas as pd", None),
]


def return_value_json(result: str) -> str:
    """mcp-run-python's return value: the value as JSON (indent 2), else its text as a JSON string."""
    try:
        return json.dumps(ast.literal_eval(result), indent=2)
    except (ValueError, SyntaxError, TypeError):
        return json.dumps(result)


def run_python_text(result: dict[str, Any]) -> str:
    """The same result as mcp-run-python's text block."""
    output = [*result["stdout"].splitlines(), *result["stderr"].splitlines()]
    parts = [f"<status>{'success' if result['success'] else 'run-error'}</status>"]
    if output:
        parts += ["<output>", *output, "</output>"]
    if result["success"]:
        if result["result"] is not None:
            parts += ["<return_value>", return_value_json(result["result"]), "</return_value>"]
    else:
        error = result["error"] or ""
        if not error.startswith("Traceback"):
            error = f"{result['error_type']}: {error}"
        parts += ["<error>", error.rstrip("\n"), *result["notes"], "</error>"]
    return "\n".join(parts)


async def texts(backend: str, result_text: str) -> list[tuple[str, dict[str, Any]]]:
    """Each corpus call's text block and structured result, from a fresh server."""
    env = {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_POOL_SIZE": "1",
        "MCP_SANDBOX_MAX_OUTPUT_CHARS": str(MAX_OUTPUT_CHARS),
        "MCP_SANDBOX_RESULT_TEXT": result_text,
    }
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_sandbox"], env=env, cwd=str(REPO))
    found = []
    async with Client(params) as client:
        for name, code, timeout in CORPUS:
            arguments: dict[str, Any] = {"code": code, "session_id": "bench"}
            if timeout is not None:
                arguments["timeout"] = timeout
            answer = await client.call_tool("execute_python", arguments)
            assert not answer.is_error, f"{name}: {answer}"
            text = answer.content[0].text  # type: ignore[union-attr]
            assert answer.structured_content is not None
            found.append((text, answer.structured_content))
    return found


async def measure(backend: str) -> dict[str, Any]:
    compact = await texts(backend, "compact")
    before = await texts(backend, "json")
    rows = []
    for (name, _code, _timeout), (text, result), (json_text, _) in zip(CORPUS, compact, before, strict=True):
        rows.append(
            {
                "call": name,
                "json": len(json_text),
                "compact": len(text),
                "mcp_run_python": len(run_python_text(result)),
                "text": text,
            }
        )
    totals = {key: sum(row[key] for row in rows) for key in ("json", "compact", "mcp_run_python")}
    return {
        "backend": backend,
        "rows": rows,
        "totals": totals,
        "ratio_to_mcp_run_python": totals["compact"] / totals["mcp_run_python"],
        "ratio_before": totals["json"] / totals["mcp_run_python"],
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        f"execute_python's text block on {results['backend']}: characters (tokens ~ chars / 4)",
        "",
        "| call | before (JSON) | now | mcp-run-python |",
        "| --- | --- | --- | --- |",
    ]
    for row in results["rows"]:
        lines.append(f"| {row['call']} | {row['json']:,} | {row['compact']:,} | {row['mcp_run_python']:,} |")
    totals = results["totals"]
    lines.append(
        f"| all ({len(results['rows'])}) | {totals['json']:,} (~{tokens_of(totals['json'])}) | "
        f"{totals['compact']:,} (~{tokens_of(totals['compact'])}) | "
        f"{totals['mcp_run_python']:,} (~{tokens_of(totals['mcp_run_python'])}) |"
    )
    lines.append("")
    lines.append(
        f"against mcp-run-python: before {results['ratio_before']:.2f}x, now "
        f"{results['ratio_to_mcp_run_python']:.2f}x"
    )
    return "\n".join(lines)


def tokens_of(characters: int) -> int:
    return round(characters / 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="pyodide")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--show", action="store_true", help="print each text block too")
    options = parser.parse_args()
    results = anyio.run(measure, options.backend)
    results["date"] = datetime.date.today().isoformat()
    save(results, options.json, table(results))
    if options.show:
        for row in results["rows"]:
            print(f"\n--- {row['call']}\n{row['text']}")


if __name__ == "__main__":
    main()
