"""SandboxInterpreter, DSPy's PythonInterpreter on a sandbox session: what one execute() costs.

Run from the repository root:  .venv/bin/python bench/bench_dspy.py [--json PATH] [--rounds N]
                               [--backends pyodide,subprocess]

For each backend one interpreter starts (the first row: start() until the sandbox is warm), then
each program below runs `--rounds` times; a row is the median and the 90th percentile of the
wall time of `execute`, measured in this process, as a DSPy module sees it. About a minute.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import save

from mcp_sandbox.integrations.dspy import SandboxInterpreter

BIG = "x" * 10_000_000
#: name, code, variables.
PROGRAMS: list[tuple[str, str, dict[str, Any]]] = [
    ("a value: 1 + 1", "1 + 1", {}),
    ("print", "print('hello')", {}),
    ("a host tool", "lookup(key='x')", {}),
    ("3 small variables", "a + b + len(c)", {"a": 1, "b": 2, "c": [1, 2, 3]}),
    ("SUBMIT", "SUBMIT({'answer': 42})", {}),
    ("an error", "1 / 0", {}),
    ("a 10 MB variable", "len(big)", {"big": BIG}),
]


def lookup(key: str) -> str:
    return {"x": "forty-two"}[key]


def measure(backend: str, rounds: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    started = time.perf_counter()
    with SandboxInterpreter(backend=backend, tools={"lookup": lookup}) as interpreter:
        interpreter.start()
        rows["start()"] = {"median_ms": round((time.perf_counter() - started) * 1000, 1), "p90_ms": None}
        for name, code, variables in PROGRAMS:
            times = []
            for _ in range(rounds if "10 MB" not in name else max(3, rounds // 10)):
                begun = time.perf_counter()
                try:
                    interpreter.execute(code, variables=variables)
                except Exception:  # noqa: BLE001 - the error row measures the error path
                    pass
                times.append((time.perf_counter() - begun) * 1000)
            times.sort()
            rows[name] = {
                "median_ms": round(statistics.median(times), 2),
                "p90_ms": round(times[int(len(times) * 0.9) - 1], 2),
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=Path("bench/results/dspy.json"))
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--backends", default="pyodide,subprocess")
    args = parser.parse_args()
    results: dict[str, Any] = {
        "when": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "rounds": args.rounds,
        "backends": {},
    }
    lines = ["| program | " + " | ".join(f"{b} median / p90 ms" for b in args.backends.split(",")) + " |"]
    lines.append("| --- |" + " --- |" * len(args.backends.split(",")))
    for backend in args.backends.split(","):
        results["backends"][backend] = measure(backend, args.rounds)
        print(f"{backend}: done", file=sys.stderr)
    for name in ["start()", *(p[0] for p in PROGRAMS)]:
        cells = []
        for backend in args.backends.split(","):
            row = results["backends"][backend][name]
            cells.append(f"{row['median_ms']}" + (f" / {row['p90_ms']}" if row["p90_ms"] is not None else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    save(results, args.json, "\n".join(lines))


if __name__ == "__main__":
    main()
