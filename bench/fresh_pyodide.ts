// The alternative bench_latency.py compares against: a fresh Deno + Pyodide process per call,
// as per-call-process Pyodide sandboxes do. Loads Pyodide, runs one program, prints its value.
import { loadPyodide } from "pyodide";

const pyodide = await loadPyodide();
console.log(String(pyodide.runPython(Deno.args[0] ?? "1 + 1")));
