// A side module that imports a main-module function through the GOT (as a C extension does when
// it takes the address of a CPython function), loaded into Pyodide as a sandbox runs it (its
// runtime script rewritten, started from the memory snapshot given), then forgotten as a recycle
// forgets it (linker.ts) and loaded again (test_native_code.py). Prints, as JSON, the function's
// slot each time and whether the table holds the function there.
import { loadPyodide } from "pyodide";
import { LinkerClean, type LinkerModule } from "../../mcp_sandbox/backends/pyodide/linker.ts";
import { PYODIDE_OPTIONS } from "../../mcp_sandbox/backends/pyodide/options.ts";
import { pyodideScript } from "../../mcp_sandbox/backends/pyodide/rewrites.ts";
import { runPyodideScript } from "../../mcp_sandbox/backends/pyodide/script.ts";

type Module = LinkerModule & {
  FS: { writeFile(path: string, data: Uint8Array): void };
  getFunctionAddress(fn: unknown): number;
};

const leb = (n: number): number[] => {
  const out: number[] = [];
  do {
    const byte = n & 0x7f;
    n >>>= 7;
    out.push(n ? byte | 0x80 : byte);
  } while (n);
  return out;
};
const name = (text: string) => {
  const bytes = [...new TextEncoder().encode(text)];
  return [...leb(bytes.length), ...bytes];
};
const section = (id: number, body: number[]) => [id, ...leb(body.length), ...body];

// The smallest side module Emscripten's linker loads: no memory, no table of its own, one import
// (GOT.func.<symbol>, a mutable i32 global) and one export, `slot`, that returns it.
function sideModule(symbol: string): Uint8Array {
  return new Uint8Array([
    ...[0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00],
    ...section(0, [...name("dylink.0"), 1, 4, 0, 0, 0, 0]), // memory and table: size 0, align 0
    ...section(1, [1, 0x60, 0, 1, 0x7f]), // () -> i32
    ...section(2, [1, ...name("GOT.func"), ...name(symbol), 3, 0x7f, 1]),
    ...section(3, [1, 0]),
    ...section(7, [1, ...name("slot"), 0, 0]),
    ...section(10, [1, 4, 0, 0x23, 0, 0x0b]), // global.get 0, end
  ]);
}

await runPyodideScript(pyodideScript());
const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _loadSnapshot: Deno.readFileSync(Deno.args[0]) });
const module = (pyodide as unknown as { _module: Module })._module;
const main = module.LDSO.loadedLibsByName["__main__"].exports as Record<string, unknown>;
// A CPython function of the main module that is not in the function table yet.
const symbol = Object.keys(main).find((key) =>
  key.startsWith("Py") && typeof main[key] === "function" && String(main[key]).includes("[native code]") &&
  module.getFunctionAddress(main[key]) === 0
);
if (symbol === undefined) throw new Error("every CPython function of the main module is in the table already");
const fn = main[symbol];
module.FS.writeFile("/tmp/libslot.so", sideModule(symbol));

const clean = new LinkerClean(module);
const flags = { global: false, nodelete: false, loadAsync: false, allowUndefined: true };
function load(): { slot: number; holds: boolean } {
  module.loadDynamicLibrary("/tmp/libslot.so", flags, {});
  const exports = module.LDSO.loadedLibsByName["/tmp/libslot.so"].exports as { slot(): number };
  const slot = exports.slot();
  return { slot, holds: module.wasmTable.get(slot) === fn };
}
const first = load();
const reset = clean.reset();
const again = load();
console.log(JSON.stringify({ symbol, cleanTable: clean.table, first, reset, again }));
