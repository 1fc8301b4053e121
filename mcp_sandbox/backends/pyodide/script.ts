// Pyodide's runtime script, pyodide.asm.js, run as Node's CommonJS loader runs it but compiled
// through node:vm, so that a worker can start from V8's code cache of it (made with the memory
// snapshot, snapshot.ts): Deno's own code cache does not serve this file, and compiling it, then
// each of its functions as Pyodide started, took about 80 ms of every start.
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import vm from "node:vm";

const SCRIPT_URL = import.meta.resolve("pyodide/pyodide.asm.js");
// Pyodide's folder, where its runtime files are.
export const PYODIDE_DIR = `${dirname(fileURLToPath(SCRIPT_URL))}/`;

export type PyodideScript = {
  // V8's code for the script and for each of its functions compiled so far.
  codeCache(): Uint8Array;
  // A code cache was given and V8 refused it (another V8, other flags, another file).
  cacheRejected: boolean;
};

// Each rewrite is a list of replacements, each of a text found exactly once in the script, applied
// all or none: one not found (another Pyodide) is left out whole.
export type Rewrite = { why: string; replace: [string, string][] };

export const REWRITES: Rewrite[] = [
  {
    // Emscripten's linker walks each of the ~10,000 exports and GOT entries with `Object.entries`,
    // which costs twice what a walk of the keys does in a new worker's cold code. The same entries
    // in the same order, and the object left as it is.
    why: "keys, not entries",
    replace: [
      [
        "for(var[sym,exp]of Object.entries(exports)){",
        "for(var sym of Object.keys(exports)){var exp=exports[sym];",
      ],
      [
        "for(var[symName,entry]of Object.entries(GOT)){",
        "for(var symName of Object.keys(GOT)){var entry=GOT[symName];",
      ],
    ],
  },
  {
    // The main module's ~9,700 exports each got a GOT entry (a WebAssembly.Global) at every start,
    // for a C extension to import; few ever are. Their values are kept in a map instead, and an
    // entry is made, holding its value, when first asked for. A function export still takes its
    // table slot in the same order, so the table is laid out as the memory snapshot expects.
    why: "the main module's GOT entries made when asked for",
    replace: [
      [
        "var GOT={};",
        "var GOT={};var mainGOT=new Map,mainGOTOpen=false;" +
        'var newGOTEntry=symName=>new WebAssembly.Global({value:"i32",mutable:true},mainGOT.get(symName)??0);',
      ],
      [
        'if(!rtn){rtn=GOT[symName]=new WebAssembly.Global({value:"i32",mutable:true})}',
        "if(!rtn){rtn=GOT[symName]=newGOTEntry(symName)}",
      ],
      [
        'var value=exports[symName];GOT[symName]||=new WebAssembly.Global({value:"i32",mutable:true});',
        'var value=exports[symName];if(mainGOTOpen&&!GOT[symName]){if(typeof value=="function"){' +
        'mainGOT.set(symName,addFunction(value));continue}if(typeof value=="number"){mainGOT.set(symName,value);' +
        "continue}}GOT[symName]||=newGOTEntry(symName);",
      ],
      [
        'GOT["__heap_base"].value=end;',
        'GOT["__heap_base"]||=newGOTEntry("__heap_base");GOT["__heap_base"].value=end;',
      ],
      [
        "wasmExports=relocateExports(wasmExports,1024);",
        "mainGOTOpen=true;wasmExports=relocateExports(wasmExports,1024);mainGOTOpen=false;",
      ],
    ],
  },
];

function found(source: string, text: string): number | null {
  const at = source.indexOf(text);
  return at >= 0 && source.indexOf(text, at + 1) < 0 ? at : null;
}

// Pyodide's runtime script with the rewrites that fit it applied. The runner makes it once for its
// workers: each text is looked for in the whole 1 MB script, about 0.5 ms each.
export function pyodideScript(): string {
  let source = Deno.readTextFileSync(fileURLToPath(SCRIPT_URL)); // decoded: a folder's name may hold a space
  for (const rewrite of REWRITES) {
    if (rewrite.replace.some(([from]) => found(source, from) === null)) continue;
    for (const [from, to] of rewrite.replace) {
      const at = found(source, from)!;
      source = source.slice(0, at) + to + source.slice(at + from.length);
    }
  }
  return source;
}

// Defines Pyodide's module factory (`_createPyodideModule`), which loadPyodide then uses instead of
// loading the script itself.
export function runPyodideScript(source: string, codeCache?: Uint8Array): PyodideScript {
  const file = fileURLToPath(SCRIPT_URL);
  const require = createRequire(file);
  // The wrapper is CommonJS's, on the script's first line: its `require` and `__dirname` are the
  // ones the script reads when it runs in Node (as Pyodide's loader runs it here).
  const wrapped = `(function (exports, require, module, __filename, __dirname) {${source}\n})`;
  const script = new vm.Script(wrapped, {
    filename: SCRIPT_URL,
    ...(codeCache ? { cachedData: codeCache } : {}),
    // A program's `import()` through Pyodide's functions lands here too: bare names resolve from
    // Pyodide's package, as they would for the script imported, and a name that does not resolve
    // is refused without the host's paths that `require.resolve` would put in its message.
    importModuleDynamically: ((specifier: string) => {
      if (/^[a-z]+:/.test(specifier)) return import(specifier);
      let resolved: string;
      try {
        resolved = require.resolve(specifier);
      } catch {
        throw new TypeError(`Cannot find module '${specifier}'`);
      }
      return import(pathToFileURL(resolved).href);
    }) as never,
  });
  const run = script.runInThisContext() as (...args: unknown[]) => void;
  const module = { exports: {} };
  run.call(module.exports, module.exports, require, module, file, dirname(file));
  return {
    codeCache: () => script.createCachedData(),
    cacheRejected: codeCache !== undefined && script.cachedDataRejected === true,
  };
}
