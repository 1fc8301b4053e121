// Pyodide's runtime script (pyodide.asm.js) as every worker runs it (script.ts): rewritten where
// its linker costs a new worker's start. Made once per process by the runner's main thread, which
// loads no Node module for it (each costs that thread's heap megabytes).
export const SCRIPT_URL = import.meta.resolve("pyodide/pyodide.asm.js");

// Each rewrite is a list of replacements, each of a text found exactly once in the script, applied
// all or none: one not found (another Pyodide) is left out whole, or, if `required`, the script is
// refused (pyodideScript throws): the sandbox depends on it.
export type Rewrite = { why: string; required?: true; replace: [string, string][] };

// Called by the rewritten script with the main module's exports once relocated (a plain object of
// its own), before they are linked: calloc is hooked there (instance.ts, linker.ts).
export const EXPORTS_RELOCATED = "exportsRelocated";

export const REWRITES: Rewrite[] = [
  {
    // The linker's calloc is hooked in the exports the runtime's JavaScript links, which were a
    // copy of the instance's ~9,700 exports (6 ms of every start): the relocated object is its own.
    why: "calloc hooked in the relocated exports",
    required: true,
    replace: [
      [
        'mergeLibSymbols(wasmExports,"main");',
        `Module["${EXPORTS_RELOCATED}"]?.(wasmExports);mergeLibSymbols(wasmExports,"main");`,
      ],
    ],
  },
  {
    // The signature conversions wrap ~10 exports in a copy of all ~9,700 (3 ms of every start):
    // the relocated object, which nothing else holds, is changed in place.
    why: "signature conversions in place",
    replace: [["wasmExports=Object.assign({},wasmExports);", ""]],
  },
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
    // The main module's ~9,700 exports each got a GOT entry (a WebAssembly.Global) and each of its
    // ~5,500 functions not in the table yet a table slot, at every start, for a C extension to
    // import; few ever are. They are kept in a map instead, and an entry is made, with the
    // function's slot, when first asked for. The memory snapshot is made with this script too
    // (snapshot.ts), so the table is laid out as it expects.
    why: "the main module's GOT entries and table slots made when asked for",
    replace: [
      [
        "var GOT={};",
        "var GOT={};var mainGOT=new Map,mainGOTOpen=false;" +
        'var newGOTEntry=symName=>{var value=mainGOT.get(symName);return new WebAssembly.Global({value:"i32",' +
        'mutable:true},typeof value=="function"?addFunction(value):value??0)};',
      ],
      [
        // A slot a recycle emptied (linker.ts) is no longer its function's: asked for again, the
        // function gets a new one.
        "return functionsInTableMap.get(func)||0}",
        "var slot=functionsInTableMap.get(func)||0;return slot&&wasmTable.get(slot)!==null?slot:0}",
      ],
      [
        'if(!rtn){rtn=GOT[symName]=new WebAssembly.Global({value:"i32",mutable:true})}',
        "if(!rtn){rtn=GOT[symName]=newGOTEntry(symName)}",
      ],
      [
        'var value=exports[symName];GOT[symName]||=new WebAssembly.Global({value:"i32",mutable:true});',
        'var value=exports[symName];if(mainGOTOpen&&!GOT[symName]){if(typeof value=="function"){' +
        'mainGOT.set(symName,value);continue}if(typeof value=="number"){mainGOT.set(symName,value);' +
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

function foundOnce(source: string, text: string): number | null {
  const at = source.indexOf(text);
  return at >= 0 && source.indexOf(text, at + 1) < 0 ? at : null;
}

type Edit = [at: number, length: number, to: string];

// Where `rewrite` edits `source`, or null if it does not fit it.
function edits(source: string, rewrite: Rewrite): Edit[] | null {
  const found = rewrite.replace.map(([from, to]): Edit | null => {
    const at = foundOnce(source, from);
    return at === null ? null : [at, from.length, to];
  });
  return found.every((edit) => edit !== null) ? found as Edit[] : null;
}

// The rewrites that do not fit `source`, by why: none for the Pyodide the runner pins.
export function unfit(source: string): string[] {
  return REWRITES.filter((rewrite) => edits(source, rewrite) === null).map((rewrite) => rewrite.why);
}

// Pyodide's runtime script with the rewrites that fit it applied, put together once: replacing
// one text after another made a new 1 MB string each time, garbage in the runner's idle heap.
export function pyodideScript(source = Deno.readTextFileSync(new URL(SCRIPT_URL))): string {
  const all: Edit[] = [];
  for (const rewrite of REWRITES) {
    const found = edits(source, rewrite);
    if (found !== null) all.push(...found);
    else if (rewrite.required) throw new Error(`this Pyodide's runtime script does not fit: ${rewrite.why}`);
  }
  all.sort((a, b) => a[0] - b[0]);
  const parts: string[] = [];
  let done = 0;
  for (const [at, length, to] of all) {
    if (at < done) throw new Error("two of the rewrites overlap"); // a mistake in REWRITES
    parts.push(source.slice(done, at), to);
    done = at + length;
  }
  parts.push(source.slice(done));
  return parts.join("");
}
