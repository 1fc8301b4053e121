// Pyodide's runtime script, pyodide.asm.js, run as Node's CommonJS loader runs it but compiled
// through node:vm, so that a worker can start from V8's code cache of it (made with the memory
// snapshot, snapshot.ts): Deno's own code cache does not serve this file, and compiling it, then
// each of its functions as Pyodide started, took about 80 ms of every start.
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import vm from "node:vm";
import { SCRIPT_URL } from "./rewrites.ts";

// Pyodide's folder, where its runtime files are.
export const PYODIDE_DIR = `${dirname(fileURLToPath(SCRIPT_URL))}/`;

export type PyodideScript = {
  // V8's code for the script and for each of its functions compiled so far.
  codeCache(): Uint8Array;
  // A code cache was given and V8 refused it (another V8, other flags, another file).
  cacheRejected: boolean;
};

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
