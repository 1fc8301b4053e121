// Native libraries (Python C extensions, numpy's and pandas' .so files) in a sandbox.
//
// Emscripten's dynamic linker links a side module into the WebAssembly memory (a block from
// calloc for its data) and the function table (slots from the table's end), and keeps what it
// linked in JavaScript: LDSO (the libraries by name and by dlopen handle) and GOT (their symbols'
// addresses). Memory is carried by checkpoints and copied back by recycling; the JavaScript side
// is what this file records, replays and resets:
// - a checkpoint records the libraries loaded since the clean point, in order, with where each
//   calloc for them landed and the table's length then;
// - a restore loads the same libraries the same way into a clean sandbox, with each calloc given
//   the address it had and the table padded to the length it had, so every address and table slot
//   in the restored memory means what it meant; then the memory is copied over;
// - a recycle forgets them (LDSO, GOT, table slots), and the memory copy-back frees their data.
//
// The one hook is calloc, which the linker calls from JavaScript for a library's data: it is
// wrapped when Pyodide's WebAssembly instance is made (instance.ts), before any program runs.

type Dso = { name: string; global: boolean; refcount: number; exports: unknown };
type Ldso = { loadedLibsByName: Record<string, Dso>; loadedLibsByHandle: Record<string, Dso> };
export type LinkerModule = {
  LDSO: Ldso;
  GOT: Record<string, WebAssembly.Global>;
  wasmTable: WebAssembly.Table;
  HEAPU32: Uint32Array;
  HEAP8: Int8Array;
  loadDynamicLibrary(
    name: string,
    flags: { global: boolean; nodelete: boolean; loadAsync: boolean; allowUndefined: boolean },
    localScope: object | null,
    handle?: number,
  ): unknown;
};

// One calloc the linker made for a library's data, and the table's length then (its table base).
type Allocation = { at: number; size: number; table: number };

export type LibraryRecord = { name: string; global: boolean; nodelete: boolean; handles: number[] };

// What a checkpoint carries of the linker: enough to load the same libraries the same way.
export type LinkerRecord = {
  libraries: LibraryRecord[];
  allocations: Allocation[];
  // The GOT entries that are new or changed since the clean point: checked after the replay.
  got: [string, number][];
  table: number;
};

//: More table slots than this past the clean point and a sandbox is replaced rather than recycled:
//: a table cannot shrink, and each library loaded after a recycle takes new slots.
const MAX_TABLE_GROWTH = 1 << 18;

let table: WebAssembly.Table | null = null;
let recording = false;
const allocations: Allocation[] = [];
let replaying: Allocation[] | null = null;
let replayProblem: string | null = null;

export type Instance = { exports: Record<string, unknown> };
export type Imports = { env: Record<string, unknown> };
type Calloc = (count: number, size: number) => number;

// Called with the main module's exports as the runtime's JavaScript relocated them (a copy of
// its own, rewrites.ts), before it links them, as Pyodide's WebAssembly is instantiated
// (instance.ts): its JavaScript side calls calloc through the hook. Everything else keeps the real
// calloc: its GOT entry, kept from the relocation (made when a library asks, rewrites.ts), holds
// the real one's table slot (so the function table, and a memory snapshot, are laid out as without
// the hook), and its symbol is put back once the instance is linked (`restoreCalloc`).
export function hookCalloc(imports: Imports, exports: Record<string, unknown>): void {
  table = imports.env.__indirect_function_table as WebAssembly.Table;
  exports.calloc = hooked(exports.calloc as Calloc);
}

export function restoreCalloc(imports: Imports, instance: Instance): void {
  imports.env.calloc = instance.exports.calloc;
}

function hooked(calloc: Calloc): Calloc {
  return (count: number, size: number): number => {
    if (replaying !== null) return replayed(count * size) ?? calloc(count, size);
    const at = calloc(count, size);
    if (recording) allocations.push({ at, size: count * size, table: table!.length });
    return at;
  };
}

// During a replay: the address this calloc had, with the table grown to the length it had.
function replayed(size: number): number | null {
  const next = replaying!.shift();
  if (next === undefined || next.size !== size) {
    replayProblem ??= "the libraries asked for memory in another order than when they were first loaded";
    return null;
  }
  if (table!.length > next.table) {
    replayProblem ??= "this sandbox's function table is longer than the checkpoint's (a recycled sandbox)";
    return null;
  }
  if (table!.length < next.table) table!.grow(next.table - table!.length);
  return next.at;
}

// Each GOT entry's value by name. By its keys: `Object.entries` of its ~10,000 entries took twice
// as long, in every new sandbox's clean point.
function gotValues(got: Record<string, WebAssembly.Global>): Map<string, number> {
  const names = Object.keys(got);
  const values = new Map<string, number>();
  for (let i = 0; i < names.length; i++) values.set(names[i], Number(got[names[i]].value));
  return values;
}

// The linker's state at the clean point, to record, replay and reset against.
export class LinkerClean {
  private readonly names: Set<string>;
  private readonly handles: Set<string>;
  private readonly got: Map<string, number>;
  readonly table: number;

  constructor(private readonly module: LinkerModule) {
    this.names = new Set(Object.keys(module.LDSO.loadedLibsByName));
    this.handles = new Set(Object.keys(module.LDSO.loadedLibsByHandle));
    this.got = gotValues(module.GOT);
    this.table = module.wasmTable.length;
    allocations.length = 0;
    recording = true;
  }

  record(): LinkerRecord {
    const ldso = this.module.LDSO;
    const libraries = Object.entries(ldso.loadedLibsByName)
      .filter(([name]) => !this.names.has(name))
      .map(([name, dso]) => ({
        name,
        global: dso.global,
        nodelete: dso.refcount === Infinity,
        handles: Object.entries(ldso.loadedLibsByHandle)
          .filter(([handle, other]) => other === dso && !this.handles.has(handle))
          .map(([handle]) => Number(handle)),
      }));
    return { libraries, allocations: [...allocations], got: this.gotChanges(), table: this.module.wasmTable.length };
  }

  private gotChanges(): [string, number][] {
    return [...gotValues(this.module.GOT)].filter(([name, value]) => this.got.get(name) !== value);
  }

  // Loads the recorded libraries into this sandbox, which must be at its clean point with its
  // memory grown to the checkpoint's size and the libraries' files in place. What they write
  // into memory is overwritten by the checkpoint's memory afterwards. Null, or why it failed.
  replay(record: LinkerRecord): string | null {
    if (!record.libraries.length) return null;
    const module = this.module;
    replaying = [...record.allocations];
    replayProblem = null;
    try {
      for (const library of record.libraries) {
        const handle = library.handles[0];
        const flags = { global: library.global, nodelete: library.nodelete, loadAsync: false, allowUndefined: true };
        if (handle !== undefined) {
          // A dlopen handle is a C struct in memory: the linker reads a library's bytes from it
          // when these words are set, and this sandbox's memory there is not the session's yet.
          module.HEAPU32[(handle + 28) >>> 2] = 0;
          module.HEAPU32[(handle + 32) >>> 2] = 0;
        }
        module.loadDynamicLibrary(library.name, flags, library.global ? null : {}, handle);
        const dso = module.LDSO.loadedLibsByName[library.name];
        for (const other of library.handles.slice(1)) module.LDSO.loadedLibsByHandle[other] = dso;
        if (replayProblem !== null) return replayProblem;
      }
    } catch (error) {
      return `a native library could not be loaded again: ${error}`;
    } finally {
      replaying = null;
    }
    if (module.wasmTable.length < record.table) module.wasmTable.grow(record.table - module.wasmTable.length);
    if (module.wasmTable.length !== record.table) {
      return "the function table did not come back to the checkpoint's length";
    }
    const got = new Map(this.gotChanges());
    for (const [name, value] of record.got) {
      if (got.get(name) !== value) return `the native symbol ${name} did not link where it was`;
    }
    return null;
  }

  // Forgets the libraries loaded since the clean point (a recycle copies the memory back), and
  // empties the table slots taken since, the main module's functions' too: one asked for again
  // gets a new slot (rewrites.ts). Null, or why this sandbox is not fit to recycle.
  reset(): string | null {
    const module = this.module;
    if (module.wasmTable.length - this.table > MAX_TABLE_GROWTH) {
      return "its native libraries took too many table slots";
    }
    const ldso = module.LDSO;
    for (const name of Object.keys(ldso.loadedLibsByName)) {
      if (!this.names.has(name)) delete ldso.loadedLibsByName[name];
    }
    for (const handle of Object.keys(ldso.loadedLibsByHandle)) {
      if (!this.handles.has(handle)) delete ldso.loadedLibsByHandle[handle];
    }
    for (const name of Object.keys(module.GOT)) {
      const before = this.got.get(name);
      if (before === undefined) delete module.GOT[name];
      else if (Number(module.GOT[name].value) !== before) module.GOT[name].value = before;
    }
    for (let slot = this.table; slot < module.wasmTable.length; slot++) module.wasmTable.set(slot, null);
    allocations.length = 0;
    return null;
  }
}
