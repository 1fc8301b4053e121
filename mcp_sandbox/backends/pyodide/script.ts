// Pyodide's runtime script, pyodide.asm.js, run as Node's CommonJS loader runs it but compiled
// through node:vm, so that a worker can start from V8's code cache of it (made with the memory
// snapshot, snapshot.ts): Deno's own code cache does not serve this file, and compiling it, then
// each of its functions as Pyodide started, took about 80 ms of every start.
import { dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import vm from "node:vm";
import { SCRIPT_URL } from "./rewrites.ts";

// The script's file, decoded (a cache folder's name may hold a space), and Pyodide's folder.
const SCRIPT_FILE = fileURLToPath(SCRIPT_URL);
export const PYODIDE_DIR = `${dirname(SCRIPT_FILE)}/`;

// The Node built-ins the script asks for as it starts, by each name it uses. Node's module loader
// (node:module) costs a worker 2-3 ms to load: it serves only what else is asked, when asked.
const STARTING = ["fs", "path"];

type Require = ((name: string) => unknown) & { resolve(name: string): string };

// Taken as this module loads, before the worker flags a program's use of it (recycle.ts) and before
// any program could replace it: the runtime's own lazy loads (node:crypto for its first random
// bytes) are not a program's.
const { process } = globalThis as unknown as { process: { getBuiltinModule(name: string): unknown } };
const builtIn = process.getBuiltinModule.bind(process);

export type PyodideScript = {
  // V8's code for the script and for each of its functions compiled so far.
  codeCache(): Uint8Array;
  // A code cache was given and V8 refused it (another V8, other flags, another file).
  cacheRejected: boolean;
};

// Defines Pyodide's module factory (`_createPyodideModule`), which loadPyodide then uses instead of
// loading the script itself. `imported` hears of every `import()` the script's code, or code it
// evaluates (a program's through Pyodide's functions), makes.
export async function runPyodideScript(
  source: string,
  codeCache?: Uint8Array,
  imported: (specifier: string) => void = () => {},
): Promise<PyodideScript> {
  const require = await scriptRequire(SCRIPT_FILE);
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
      imported(specifier);
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
  run.call(module.exports, module.exports, require, module, SCRIPT_FILE, dirname(SCRIPT_FILE));
  return {
    codeCache: () => script.createCachedData(),
    cacheRejected: codeCache !== undefined && script.cachedDataRejected === true,
  };
}

// `require` as CommonJS gives it to the script: the built-ins it starts with already loaded, the
// rest (and names resolved from Pyodide's package) through Node's module loader, loaded when asked.
async function scriptRequire(file: string): Promise<Require> {
  const loaded = new Map<string, unknown>();
  for (const name of STARTING) {
    const module = (await import(`node:${name}`)).default;
    loaded.set(name, module).set(`node:${name}`, module);
  }
  let node: Require | undefined;
  const nodeRequire = () => {
    node ??= (builtIn("node:module") as { createRequire(file: string): Require }).createRequire(file);
    return node;
  };
  // Pyodide asks node:tty only whether its standard streams are terminals: Deno answers that for
  // them without loading node:tty (3 ms of every start).
  const streams = [Deno.stdin, Deno.stdout, Deno.stderr];
  type Tty = { isatty(fd: number): boolean };
  const tty: Tty = {
    isatty: (fd) => streams[fd]?.isTerminal() ?? (nodeRequire()("node:tty") as Tty).isatty(fd),
  };
  loaded.set("tty", tty).set("node:tty", tty);
  const require = (name: string) => loaded.has(name) ? loaded.get(name) : nodeRequire()(name);
  require.resolve = (name: string) => nodeRequire().resolve(name);
  return require;
}
