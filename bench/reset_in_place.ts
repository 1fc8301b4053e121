// A candidate for clean sandboxes, measured: resetting a live Pyodide to a clean state in place,
// instead of loading a new one. What the copy-back costs, and what it does and does not undo.
//
//   DENO_DIR=~/.cache/mcp-sandbox/deno .venv/bin/deno run --cached-only --allow-read \
//     --config mcp_sandbox/backends/pyodide/deno.json bench/reset_in_place.ts [rounds]
//
// A reset here is: the WebAssembly memory copied back from a copy taken when clean, the stack
// pointer restored, and the JS reference table (hiwire) set back entry by entry, as Pyodide's
// own snapshot restore does. docs/clean-sandbox.md reads the numbers.
import { loadPyodide, type PyodideInterface } from "pyodide";

type Module = {
  HEAP8: Int8Array;
  stackSave(): number;
  stackRestore(pointer: number): void;
  __hiwire_get(index: number): unknown;
  __hiwire_set(index: number, value: unknown): void;
};

const rounds = Number(Deno.args[0] ?? 300);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const p95 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.95)];

let started = performance.now();
const pyodide: PyodideInterface = await loadPyodide();
const firstLoadMs = performance.now() - started;
const M = (pyodide as unknown as { _module: Module })._module;

pyodide.runPython("import sys, json, js\nkeep = js.Object.new()\nkeep.tag = 'clean'\n");
const stackPointer = M.stackSave();
const memory = new Uint8Array(M.HEAP8.buffer.slice(0));
const table: unknown[] = [];
for (let i = 0;; i++) {
  try {
    table.push(M.__hiwire_get(i));
  } catch {
    break;
  }
}

function tableLength(): number {
  let n = table.length;
  for (;; n++) {
    try {
      M.__hiwire_get(n);
    } catch {
      return n;
    }
  }
}

function reset(): number {
  const t = performance.now();
  new Uint8Array(M.HEAP8.buffer).set(memory);
  M.stackRestore(stackPointer);
  const length = tableLength();
  for (let i = 0; i < length; i++) M.__hiwire_set(i, i < table.length ? table[i] : undefined);
  return performance.now() - t;
}

// A program that taints what it can reach from Python, and frees the JS reference the clean
// state holds (so a reset that forgot the table would hand `keep` a stranger's slot).
const TAINT = `
import json, sys, random, js
json.rt_planted = True
sys.path.insert(0, "/rt-planted")
random.seed(1234)
rt_global = [js.Object.new() for _ in range(50)]
del keep
`;
const PROBE = `
import json, sys
(hasattr(json, "rt_planted"), "/rt-planted" in sys.path, "rt_global" in globals(), keep.tag)
`;

const resets: number[] = [];
let survivors = 0;
for (let i = 0; i < rounds; i++) {
  pyodide.runPython(TAINT);
  resets.push(reset());
  const seen = pyodide.runPython(PROBE).toJs();
  if (seen.join() !== "false,false,false,clean") survivors++;
}

// What the copy-back does not undo: the worker's JavaScript realm and the Emscripten file system.
pyodide.runPython("import js\njs.globalThis.rt_planted = 1\nopen('/tmp/rt-planted', 'w').write('x')");
reset();
const jsGlobalSurvives = pyodide.runPython("import js\nhasattr(js, 'rt_planted')");
const fileSurvives = pyodide.runPython("import os\nos.path.exists('/tmp/rt-planted')");

started = performance.now();
await loadPyodide();
const secondLoadMs = performance.now() - started;

console.log(JSON.stringify({
  memory_mb: memory.length / 2 ** 20,
  rounds,
  reset_p50_ms: Number(median(resets).toFixed(2)),
  reset_p95_ms: Number(p95(resets).toFixed(2)),
  python_taint_survived_resets: survivors,
  js_global_survives_reset: jsGlobalSurvives,
  file_survives_reset: fileSurvives,
  first_load_ms: Math.round(firstLoadMs),
  second_load_in_same_process_ms: Math.round(secondLoadMs),
}, null, 2));
