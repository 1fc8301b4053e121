// Pyodide's WebAssembly instance, as a sandbox makes it: its memory capped, its signal check able
// to end a program that ignores KeyboardInterrupt, calloc hooked for the linker (linker.ts), and
// a replacement worker instantiating the module its process compiled once.
//
// Pyodide passes no Emscripten settings through loadPyodide, so its module factory is wrapped
// after pyodide.asm.js has run (script.ts) and before loadPyodide calls it.
import { fileURLToPath } from "node:url";
import { hookCalloc, type Imports, type Instance, restoreCalloc } from "./linker.ts";
import { SIGNAL_KILL, type SnapshotPages } from "./protocol.ts";
import { copySparsely, hostSetTimeout, readSparsely, watchFinalizers, watchSuspensions } from "./recycle.ts";
import { EXPORTS_RELOCATED } from "./rewrites.ts";

type Done = (instance: Instance, module: WebAssembly.Module) => void;
type Settings = {
  instantiateWasm?: (imports: Imports, done: Done) => unknown;
  wasmMemory?: WebAssembly.Memory;
  INITIAL_MEMORY?: number; // a memory snapshot's size, when Pyodide starts from one
};
type Instantiate = typeof WebAssembly.instantiate;

const PAGE = 65_536;
const BINARY_READ_S = 30;
// Emscripten's own first size for Pyodide's memory, when no snapshot sets it.
const INITIAL_BYTES = 20_971_520;

// Thrown through the interpreter on purpose, to end a program where it stands. Pyodide passes
// its own NoGilError on untouched instead of declaring itself dead (its fatal_error), so the
// worker can put the sandbox back to its clean point, or, if that fails, be replaced.
export class Unwinding extends Error {
  constructor(message: string) {
    super(message);
    // Not the NoGilError its prototype passes for (whose `name` is read-only).
    Object.defineProperty(this, "name", { value: "Unwinding", configurable: true });
  }
}

// Thrown by the signal check once the kill flag is set, during a run.
export class Killed extends Unwinding {
  constructor() {
    super("the program ignored its interrupt and was stopped");
  }
}

// Thrown by the runtime's exit (os._exit) in place of Emscripten's ExitStatus, which would end
// the runtime for good.
export class ProgramExited extends Unwinding {
  constructor(readonly status: number) {
    super(`Program terminated with exit(${status})`);
    Object.defineProperty(this, "name", { value: "Exit" }); // as Pyodide names it
  }
}

// Where Pyodide reads its files from (loadPyodide's options). It reads its binary (8.6 MB) from
// `indexURL` at every start, even when a compiled module is given, and that read ends late enough
// to hold up the clean point (instantiateCompiled): a worker with the module points `indexURL` at an
// empty file of that name, if it is there, and names where the other files are. Pyodide 0.29 reads
// nothing else from `indexURL`.
const NO_BINARY = fileURLToPath(new URL("./no-binary/", import.meta.url));

export function fileOptions(pyodideDir: string, compiled: boolean) {
  let empty = false;
  try {
    empty = compiled && Deno.statSync(`${NO_BINARY}pyodide.asm.wasm`).size === 0;
  } catch { /* not installed with the runner: Pyodide reads its binary */ }
  return {
    indexURL: empty ? NO_BINARY : pyodideDir,
    stdLibURL: `${pyodideDir}python_stdlib.zip`,
    lockFileURL: `${pyodideDir}pyodide-lock.json`,
  };
}

export type InstanceOptions = {
  // The most the memory may grow to: past it, malloc fails and Python raises MemoryError.
  maxBytes?: number;
  signals: Int32Array;
  // A run is in progress: a kill flag left set between runs is for nobody.
  running: () => boolean;
  // The program exited (os._exit): its run ends as a crash, even if a JavaScript frame caught it.
  exited: (status: number) => void;
  // A module compiled before (by this process's first worker): instantiated instead of the binary.
  module?: WebAssembly.Module;
  // Called with the compiled module once it is instantiated.
  compiled: (module: WebAssembly.Module) => void;
  // The memory snapshot Pyodide is given, when it starts from one.
  snapshot?: Snapshot;
};

// A memory snapshot as a worker gives it to Pyodide: the whole file, whose restore then says where
// its pages not all zero are (a process's first worker); or the file's header alone, the rest
// read from the file (`read(into, position)`) straight into memory, those pages only.
export type Snapshot =
  | { bytes: Uint8Array<ArrayBuffer>; restored: (pages: Omit<SnapshotPages, "identity">) => void }
  | { bytes: Uint8Array<ArrayBuffer>; pages: SnapshotPages; read: (into: Uint8Array, position: number) => void };

// Resolves once no hook of WebAssembly's own functions is left (instantiateCompiled): the clean
// point records them as the built-ins a program must leave alone.
export type Hooked = { unhooked: () => Promise<void> };

export function hookInstance(options: InstanceOptions): Hooked {
  let unhooked: Promise<void> = Promise.resolve();
  const global = globalThis as unknown as { _createPyodideModule: (settings: Settings) => Promise<unknown> };
  const create = global._createPyodideModule;
  global._createPyodideModule = (settings: Settings) => {
    // The settings object becomes Emscripten's Module: Pyodide's registry of PyProxy finalizers is
    // watched as it is made, before any proxy is (recycle.ts). Not enumerable, so Emscripten's copy
    // of the settings' own properties, written back later, leaves it alone.
    let registry: FinalizationRegistry<unknown> | undefined;
    Object.defineProperty(settings, "finalizationRegistry", {
      configurable: true,
      get: () => registry,
      set: (value: FinalizationRegistry<unknown>) => {
        registry = value;
        watchFinalizers(value);
      },
    });
    if (options.snapshot) restoreSparsely(settings, options.snapshot);
    if (options.maxBytes !== undefined) {
      const pages = (bytes: number) => Math.ceil(bytes / PAGE);
      const initial = settings.INITIAL_MEMORY ?? INITIAL_BYTES;
      settings.wasmMemory = new WebAssembly.Memory({
        initial: pages(initial),
        maximum: Math.max(pages(initial), pages(options.maxBytes)),
      });
    }
    // Pyodide's instantiateWasm holds the binary it read (8.6 MB) for as long as it is reachable:
    // called once, then let go, so the binary is garbage once the instance is made.
    let instantiate = settings.instantiateWasm;
    if (instantiate) {
      settings.instantiateWasm = (imports, done) => {
        const original = instantiate!;
        instantiate = undefined;
        const api = (settings as { API?: { NoGilError?: typeof Error } }).API;
        if (api?.NoGilError) Object.setPrototypeOf(Unwinding.prototype, api.NoGilError.prototype);
        const check = imports.env._Py_CheckEmscriptenSignals_Helper as () => number;
        const signals = options.signals;
        imports.env._Py_CheckEmscriptenSignals_Helper = () => {
          if (Atomics.load(signals, SIGNAL_KILL) !== 0 && options.running()) throw new Killed();
          return check();
        };
        const exit = (code: number) => {
          options.exited(code);
          Atomics.store(signals, SIGNAL_KILL, 1); // caught by a JavaScript frame, it ends at the next check
          throw new ProgramExited(code);
        };
        watchSuspensions(imports.env);
        for (const name of ["env", "wasi_snapshot_preview1"]) {
          const table = (imports as unknown as Record<string, Record<string, unknown> | undefined>)[name];
          if (table && "proc_exit" in table) table.proc_exit = exit;
        }
        // The rewritten runtime script calls this as it links the instance (`done`).
        let linked = false;
        Object.defineProperty(settings, EXPORTS_RELOCATED, {
          configurable: true,
          value: (exports: Record<string, unknown>) => {
            hookCalloc(imports, exports);
            linked = true;
          },
        });
        const made: Done = (instance, module) => {
          options.compiled(module);
          done(instance, module);
          delete (settings as Record<string, unknown>)[EXPORTS_RELOCATED];
          if (!linked) throw new Error("Pyodide linked its runtime without the sandbox's calloc hook (rewrites.ts)");
          restoreCalloc(imports, instance);
        };
        if (options.module) unhooked = instantiateCompiled(options.module, imports, made);
        return original(imports, made);
      };
    }
    return create(settings);
  };
  return { unhooked: () => unhooked };
}

// Pyodide restores a memory snapshot with one `HEAP8.set`, touching every page: for that call only,
// the zero pages are left untouched (copySparsely, readSparsely), so they take no memory until a
// program writes.
function restoreSparsely(settings: Settings, snapshot: Snapshot): void {
  const api = (settings as { API?: Record<string, unknown> }).API;
  if (!api) {
    // Given the header alone, Pyodide would start from an empty memory.
    if ("pages" in snapshot) throw new Error("Pyodide's API is not where a sparse restore needs it");
    return;
  }
  // What Pyodide sets from the length of what it is given: the whole file's.
  if ("pages" in snapshot) settings.INITIAL_MEMORY = snapshot.bytes.length + snapshot.pages.memoryBytes;
  let restore: ((snapshot: Uint8Array) => unknown) | undefined;
  Object.defineProperty(api, "restoreSnapshot", {
    configurable: true,
    get: () => restore && sparse,
    set: (value: (snapshot: Uint8Array) => unknown) => {
      restore = value;
    },
  });
  const sparse = (given: Uint8Array) => {
    const heap = (settings as { HEAP8: Int8Array }).HEAP8;
    const bytes = new Uint8Array(heap.buffer, heap.byteOffset, heap.length);
    const set = (source: Uint8Array, offset = 0) => {
      if ("pages" in snapshot) {
        const header = snapshot.bytes.length;
        readSparsely(bytes, snapshot.pages, (into, at) => snapshot.read(into, header + at));
        return;
      }
      const pages = copySparsely(bytes, source, offset);
      const header = source.byteOffset - given.byteOffset;
      snapshot.restored({ header: given.slice(0, header), memoryBytes: source.length, ...pages });
    };
    Object.defineProperty(heap, "set", { configurable: true, value: set });
    try {
      return restore!(given);
    } finally {
      delete (heap as { set?: unknown }).set;
    }
  };
}

// Pyodide instantiates its binary itself, with imports only it knows how to make: it sets their
// last one (`sentinel`), then waits for the binary it reads (8.6 MB, ~10 ms of a start; an empty
// file, where fileOptions points it) only to instantiate it. Given the process's compiled module,
// the instance is made as soon as that import is set; Pyodide's own instantiation, when its read
// is done, is then left pending. A Pyodide that sets no such import gets the compiled module when
// it asks. Only a call with those very imports is answered so: no other caller is served
// differently.
function instantiateCompiled(module: WebAssembly.Module, imports: Imports, made: Done): Promise<void> {
  const wasm = WebAssembly as unknown as Record<"instantiate" | "instantiateStreaming", Instantiate>;
  const real = { instantiate: wasm.instantiate, instantiateStreaming: wasm.instantiateStreaming };
  const { promise: unhooked, resolve, reject } = Promise.withResolvers<void>();
  // Past this, Pyodide's read failed (it says so with a warning), and the sandbox fails to start.
  const limit = hostSetTimeout(
    () => reject(new Error(`Pyodide's binary was not read in ${BINARY_READ_S} s`)),
    BINARY_READ_S * 1000,
  );
  let early = false;
  type Call = (source: unknown, imports?: WebAssembly.Imports) => Promise<unknown>;
  const instead = (name: keyof typeof real) =>
    (async (source: unknown, given?: WebAssembly.Imports) => {
      if (given !== (imports as unknown)) return await (real[name] as unknown as Call)(source, given);
      Object.assign(wasm, real);
      clearTimeout(limit);
      resolve();
      if (early) return await new Promise(() => {});
      return { instance: await real.instantiate(module, given), module };
    }) as unknown as Instantiate;
  wasm.instantiate = instead("instantiate");
  wasm.instantiateStreaming = instead("instantiateStreaming");
  Object.defineProperty(imports, "sentinel", {
    configurable: true,
    enumerable: true,
    set(value: unknown) {
      Object.defineProperty(imports, "sentinel", { configurable: true, enumerable: true, writable: true, value });
      early = true;
      real.instantiate(module, imports as unknown as WebAssembly.Imports).then(
        (instance) => made(instance as unknown as Instance, module),
        (error) => console.warn("wasm instantiation failed!", error), // as Pyodide reports it
      );
    },
  });
  return unhooked;
}
