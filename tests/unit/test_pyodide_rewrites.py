"""Pyodide's runtime script as every worker runs it (rewrites.ts): each rewrite fits the Pyodide the
runner pins, and one the sandbox depends on refuses a script it does not fit instead of leaving
the linker unhooked."""

from __future__ import annotations

import json

from mcp_sandbox.backends.pyodide import RUNNER_DIR
from tests.helpers import runner_deno

# Prints what `body` (TypeScript, with the script's text as `source`) makes of Pyodide's script.
PRELUDE = f"""
import {{ pyodideScript, REWRITES, SCRIPT_URL, unfit }} from "{(RUNNER_DIR / "rewrites.ts").as_uri()}";
const source = Deno.readTextFileSync(new URL(SCRIPT_URL));
const print = (value: unknown) => console.log(JSON.stringify(value));
"""


def run_deno(body: str) -> object:
    done = runner_deno("eval", PRELUDE + body)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_every_rewrite_fits_the_pinned_pyodide() -> None:
    found = run_deno("print({ unfit: unfit(source), count: REWRITES.length });")
    assert found == {"unfit": [], "count": found["count"]}  # type: ignore[index]
    assert found["count"] >= 4  # type: ignore[index]


def test_a_script_without_the_calloc_hook_is_refused_and_an_optional_rewrite_is_left_out() -> None:
    found = run_deno(
        """
        const hook = 'mergeLibSymbols(wasmExports,"main");';
        const withoutHook = source.replace(hook, "mergeLibSymbols(wasmExports, 'main');");
        let refused = null;
        try { pyodideScript(withoutHook); } catch (error) { refused = String(error); }
        const copy = "wasmExports=Object.assign({},wasmExports);";
        const withoutCopy = source.replace(copy, "wasmExports={...wasmExports};");
        const made = pyodideScript(withoutCopy);
        print({
          refused,
          unfit: unfit(withoutCopy),
          hooked: made.includes('Module["exportsRelocated"]?.(wasmExports)'),
          copyKept: made.includes("wasmExports={...wasmExports};"),
          untouched: pyodideScript(source).includes(copy),
        });
        """
    )
    assert found == {
        "refused": "Error: this Pyodide's runtime script does not fit: "
        "calloc hooked in the relocated exports",
        "unfit": ["signature conversions in place"],
        "hooked": True,
        "copyKept": True,
        "untouched": False,
    }
