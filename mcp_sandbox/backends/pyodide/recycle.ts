// Recycling: a used sandbox put back into its clean state in place, so a call without a session,
// or a new session, costs milliseconds instead of a new process (docs/clean-sandbox.md).
//
// Exact for what lives in WebAssembly memory (copied back), the JS reference table and the file
// system (restored). The JavaScript realm cannot be copied back, so it is guarded and checked:
// what can schedule code for later is wrapped before Pyodide loads, and everything reachable from
// the realm's roots is walked and compared with the clean walk. A sandbox whose realm changed is
// not recycled; the host replaces it with a new process.
import { Buffer } from "node:buffer";
import type { PyodideInterface } from "pyodide";
import { LinkerClean, type LinkerModule } from "./linker.ts";
import type { WorkerCleanMemory } from "./protocol.ts";

export type FSNode = {
  name: string;
  mode: number;
  ctime: number;
  mtime: number;
  atime: number;
  parent: FSNode;
  mounted: unknown;
};
type FSStream = { fd: number; path?: string };
type EmscriptenFS = {
  streams: (FSStream | null)[];
  ignorePermissions: boolean;
  lookupPath(path: string, options: { follow: boolean }): { node: FSNode };
  readdir(path: string): string[];
  isDir(mode: number): boolean;
  isChrdev(mode: number): boolean;
  isFile(mode: number): boolean;
  isLink(mode: number): boolean;
  analyzePath(path: string, dontResolveLastLink: boolean): { exists: boolean };
  readFile(path: string): Uint8Array;
  readlink(path: string): string;
  writeFile(path: string, data: Uint8Array): void;
  mkdir(path: string, mode: number): void;
  symlink(target: string, path: string): void;
  chmod(path: string, mode: number): void;
  utime(path: string, atime: number, mtime: number): void;
  unlink(path: string): void;
  rmdir(path: string): void;
  close(stream: FSStream): void;
  cwd(): string;
  chdir(path: string): void;
};
type Module = LinkerModule & {
  // Emscripten's: grows the memory to `size` bytes (64 KB pages) and renews every view of it.
  growMemory(size: number): number | undefined;
  stackSave(): number;
  stackRestore(pointer: number): void;
  __hiwire_get(index: number): unknown;
  __hiwire_set(index: number, value: unknown): number;
  __hiwire_immortal_get(index: number): unknown;
  __hiwire_immortal_add(value: unknown): number;
  finalizationRegistry: FinalizationRegistry<unknown>;
  FS: EmscriptenFS;
};

//: A sandbox whose WebAssembly memory grew by more than this is replaced: memory cannot shrink.
const MAX_MEMORY_GROWTH = 64 * 1024 * 1024;

// Taken before any program runs. A program can replace typed arrays' getters and methods and the
// constructors on globalThis, and one of them called on the clean memory would be handed it to
// write into: the clean memory is read only through these, and by index, its length kept aside.
export const Bytes = Uint8Array;
export const Words = Int32Array;
const apply = Reflect.apply;
const construct = Reflect.construct;
const setAdd = Set.prototype.add;
const arrayPush = Array.prototype.push;
// What the wrappers below note while a program runs, through functions taken now: a built-in a
// program replaced only around its call would otherwise drop the note, and the check at the
// recycle would find the built-in as it was.
const note = <T>(set: Set<T>, value: T): void => void apply(setAdd, set, [value]);
const typedArray = Object.getPrototypeOf(Uint8Array.prototype);
const typedArraySet = typedArray.set;
const typedArraySubarray = typedArray.subarray;
const typedArrayFill = typedArray.fill;

// Text to UTF-8 and back, as the intrinsics: TextEncoder and TextDecoder are behind Deno's lazy
// getters, which the realm walk does not follow, so a method a program replaced there would
// outlive the recycle (and read a later caller's tool replies or checkpoint).
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const encodeText = TextEncoder.prototype.encode;
const decodeText = TextDecoder.prototype.decode;
export const encode = (text: string): Uint8Array => apply(encodeText, encoder, [text]);
export const decode = (bytes: Uint8Array): string => apply(decodeText, decoder, [bytes]);

// `target.set(source, offset)`, as the intrinsic, whatever a program made of `set`.
export function copyInto(target: Uint8Array, source: Uint8Array, offset = 0): void {
  apply(typedArraySet, target, [source, offset]);
}

// Taken at module load, before any program runs: the built-ins' own check runs on these only.
const ownKeys = Reflect.ownKeys;
const describe = Reflect.getOwnPropertyDescriptor;
const prototypeOf = Reflect.getPrototypeOf;
const isExtensible = Reflect.isExtensible;
const hasOwn = Object.hasOwn;
const same = Object.is;

// The built-ins every check and reset here runs on, as they were at the clean point: each object
// reachable from globalThis's own properties, their `prototype`s, the iterators' prototypes and
// every prototype above them, with its prototype and each own property. A program that replaced
// one (a Set's `has` that calls every object opaque, a Map iterator that yields nothing, a getter
// added to Object.prototype that runs while the realm is compared) would steer the checks made of
// it: these are compared first, with functions taken before any program ran, by index only.
class BuiltIns {
  private readonly objects: object[] = [];
  private readonly prototypes: (object | null)[] = [];
  private readonly keyCounts: number[] = [];
  private readonly owners: object[] = [];
  private readonly keys: PropertyKey[] = [];
  private readonly values: unknown[] = [];
  private readonly setters: unknown[] = [];

  constructor() {
    const seen = new Set<object>();
    const add = (value: unknown): void => {
      for (let object = value; object !== null && object !== undefined;) {
        if ((typeof object !== "object" && typeof object !== "function") || seen.has(object)) return;
        seen.add(object);
        const keys = ownKeys(object);
        this.objects.push(object);
        this.prototypes.push(prototypeOf(object));
        this.keyCounts.push(keys.length);
        for (const key of keys) {
          const d = describe(object, key)!;
          this.owners.push(object);
          this.keys.push(key);
          this.values.push(hasOwn(d, "value") ? d.value : d.get);
          this.setters.push(hasOwn(d, "set") ? d.set : undefined);
        }
        object = prototypeOf(object);
      }
    };
    add(globalThis);
    for (const key of ownKeys(globalThis)) {
      const d = describe(globalThis, key)!;
      if (!hasOwn(d, "value")) continue;
      add(d.value);
      const prototype = typeof d.value === "function" ? describe(d.value, "prototype") : undefined;
      if (prototype && hasOwn(prototype, "value")) add(prototype.value);
    }
    const typedArray = prototypeOf(Uint8Array)!;
    add(typedArray);
    add((typedArray as { prototype: object }).prototype);
    for (const iterator of [[][Symbol.iterator](), new Map().entries(), new Set().values(), ""[Symbol.iterator]()]) {
      add(prototypeOf(iterator));
    }
    add(prototypeOf((function* () {})()));
    add(prototypeOf(async function () {}));
  }

  // The first built-in that changed since, or null.
  changed(): string | null {
    for (let i = 0; i < this.objects.length; i++) {
      const object = this.objects[i];
      if (prototypeOf(object) !== this.prototypes[i]) return "a built-in object's prototype was changed";
      if (ownKeys(object).length !== this.keyCounts[i]) {
        return `a property was added to or deleted from a built-in (${describeKey(object, "*")})`;
      }
    }
    for (let i = 0; i < this.owners.length; i++) {
      const d = describe(this.owners[i], this.keys[i]);
      if (d === undefined) return "a property of a built-in was deleted";
      const setter = hasOwn(d, "set") ? d.set : undefined;
      if (!same(hasOwn(d, "value") ? d.value : d.get, this.values[i]) || setter !== this.setters[i]) {
        return `a built-in was replaced (${describeKey(this.owners[i], this.keys[i])})`;
      }
    }
    return null;
  }
}

export const PAGE = 4096;
//: Pages in which two sandboxes' clean memories may differ and still be the same clean point: those
//: holding the timestamps of their starts (7 in Pyodide 0.29.5). More means they did not start alike.
export const MAX_CLEAN_DRIFT_PAGES = 64;

// What happened since the clean point that makes this sandbox unfit to recycle.
const taints = new Set<string>();
// Timers set since the clean point (asyncio's callbacks, a program's own): cleared on recycling.
const timers = new Set<ReturnType<typeof setTimeout>>();
// And setImmediate's, cleared with clearImmediate as it was before any program.
const immediates = new Set<unknown>();
let clearImmediate: (immediate: unknown) => void = () => {};
let watching = false;

// WebAssembly stacks suspended by stack switching (run_sync, asyncio.run through it) and not
// resumed yet. One resumed after a recycle would write its saved C stack and thread state into
// memory that by then is the clean state, or the next caller's.
let suspendedStacks = 0;

// Called with the runtime's imports before it is instantiated (instance.ts): Pyodide saves a
// stack's state as it suspends (`saveState`) and puts it back as it resumes (`restoreState`).
export function watchSuspensions(env: Record<string, unknown>): void {
  const save = env.saveState as (() => unknown) | undefined;
  const restore = env.restoreState as ((state: unknown) => void) | undefined;
  if (!save || !restore) return;
  env.saveState = () => {
    const state = save();
    if (typeof state === "object" && state !== null && "stackState" in state) suspendedStacks++;
    return state;
  };
  env.restoreState = (state: unknown) => {
    restore(state);
    suspendedStacks--;
  };
}

// Pyodide's PyProxy finalizers, by token: each calls Py_DecRef on the pointer its proxy was made
// for, at whatever V8 garbage collection finds the proxy gone. Those registered before the clean
// point are dropped there (the worker's own proxies, which it let go of during its start): one
// that ran later would take a reference from the object at that address in memory as it is then,
// which after a restore holds another sandbox's state, where that reference was given back
// already, so an object still in use is freed. Those registered since are dropped by a recycle
// or a restore, before the memory they point into is replaced.
const finalizers: object[] = [];
const watchedRegistries = new WeakSet<object>();

// Called with Pyodide's registry as soon as it is made, before any proxy is (instance.ts).
export function watchFinalizers(registry: FinalizationRegistry<unknown>): void {
  if (watchedRegistries.has(registry)) return;
  watchedRegistries.add(registry);
  const register = registry.register.bind(registry);
  fix(registry, "register", (target: object, held: unknown, token?: object) => {
    if (token !== undefined) apply(arrayPush, finalizers, [token]);
    else taint("a finalizer was registered without a token");
    return register(target, held, token);
  });
}

// The references the finalizers registered so far would give back are kept for good instead.
function forgetFinalizers(registry: FinalizationRegistry<unknown>): void {
  for (const token of finalizers) registry.unregister(token);
  finalizers.length = 0;
}

// The originals, for this worker's own use: wrapped ones would count its timers as a program's.
export const hostSetTimeout = globalThis.setTimeout.bind(globalThis);

function fix(target: object, name: PropertyKey, value: unknown): void {
  Object.defineProperty(target, name, { value, writable: false, configurable: false, enumerable: false });
}

// A function or constructor whose use after the clean point leaves work the realm would run later.
function flagUse(target: Record<PropertyKey, unknown>, name: string, label: string): void {
  const original = target[name];
  // Not a function, or fixed already (the worker refuses it outright: nothing to flag).
  if (typeof original !== "function" || !Object.getOwnPropertyDescriptor(target, name)?.configurable) return;
  fix(
    target,
    name,
    new Proxy(original, {
      apply(fn, self, args) {
        if (watching) note(taints, label);
        return apply(fn, self, args);
      },
      construct(fn, args, newTarget) {
        if (watching) note(taints, label);
        return construct(fn, args, newTarget);
      },
    }),
  );
}

// Installed when the worker starts, before Pyodide loads and before any program runs, so no
// program ever holds an unwrapped original. `fixedLater`: Deno functions the worker fixes itself.
export function guardRealm(fixedLater: string[]): void {
  const realSetTimeout = globalThis.setTimeout as (...args: unknown[]) => ReturnType<typeof setTimeout>;
  const realSetInterval = globalThis.setInterval as (...args: unknown[]) => ReturnType<typeof setTimeout>;
  fix(globalThis, "setTimeout", (handler: () => void, delay?: number, ...args: unknown[]) => {
    const id = apply(realSetTimeout, globalThis, [handler, delay, ...args]);
    if (watching) note(timers, id);
    return id;
  });
  fix(globalThis, "setInterval", (handler: () => void, delay?: number, ...args: unknown[]) => {
    const id = apply(realSetInterval, globalThis, [handler, delay, ...args]);
    if (watching) note(timers, id);
    return id;
  });
  // Node's setImmediate (Pyodide's asyncio schedules its callbacks with it): a chain of them
  // outlived the recycle and ran in the next caller's call.
  const global = globalThis as unknown as Record<PropertyKey, unknown>;
  const realSetImmediate = global.setImmediate as ((...args: unknown[]) => unknown) | undefined;
  const realClearImmediate = global.clearImmediate as ((immediate: unknown) => void) | undefined;
  if (realSetImmediate && realClearImmediate) {
    fix(globalThis, "setImmediate", (handler: () => void, ...args: unknown[]) => {
      const immediate = apply(realSetImmediate, globalThis, [handler, ...args]);
      if (watching) note(immediates, immediate);
      return immediate;
    });
    clearImmediate = (immediate) => apply(realClearImmediate, globalThis, [immediate]);
  }
  // The file system stamps a change with Date.now: a program that faked it around a write to a
  // clean file hid the write from the recycle, and the next caller read what it wrote.
  fix(Date, "now", Date.now);
  fix(globalThis, "Date", Date);
  const channels = ["WebSocket", "WebSocketStream", "BroadcastChannel", "MessageChannel", "EventSource"];
  for (const name of ["FinalizationRegistry", "Worker", "fetch", ...channels]) flagUse(global, name, `it used ${name}`);
  flagUse(Atomics as unknown as Record<PropertyKey, unknown>, "waitAsync", "it used Atomics.waitAsync");
  const events = EventTarget.prototype as unknown as Record<PropertyKey, unknown>;
  flagUse(events, "addEventListener", "it added an event listener");
  // Node's built-in modules and internal bindings, each one object for every caller: not walked.
  const nodeProcess = (globalThis as unknown as { process?: object }).process;
  for (const name of ["getBuiltinModule", "binding", "dlopen"]) {
    const owner = ownerOf(nodeProcess, name);
    if (owner) flagUse(owner, name, `it called process.${name}`);
  }
  // Work that finishes after the call (a key derivation's promise), or state Deno keeps outside
  // any object the walk reaches (performance entries, held locks): the next caller saw each.
  const subtle = (globalThis as unknown as { SubtleCrypto?: { prototype: Record<PropertyKey, unknown> } })
    .SubtleCrypto?.prototype;
  for (const name of subtle ? Object.getOwnPropertyNames(subtle) : []) {
    if (name !== "constructor") flagUse(subtle!, name, `it used crypto.subtle.${name}`);
  }
  const performanceOwner = ownerOf(globalThis.performance, "mark");
  for (const name of ["mark", "measure"]) {
    if (performanceOwner) flagUse(performanceOwner, name, `it called performance.${name}`);
  }
  const locks = (globalThis as unknown as { LockManager?: { prototype: Record<PropertyKey, unknown> } })
    .LockManager?.prototype;
  if (locks) flagUse(locks, "request", "it requested a Web Lock");
  // Every Deno call that may finish later (file reads, timers of its own) counts.
  const deno = Deno as unknown as Record<PropertyKey, unknown>;
  for (const name of Object.keys(deno)) {
    const descriptor = Object.getOwnPropertyDescriptor(deno, name);
    if (fixedLater.includes(name) || !descriptor?.configurable || typeof descriptor.value !== "function") continue;
    flagUse(deno, name, `it called Deno.${name}`);
  }
}

// The object on `target`'s prototype chain that holds `name` itself.
function ownerOf(target: object | undefined, name: string): Record<PropertyKey, unknown> | undefined {
  for (let at = target ?? null; at !== null; at = Object.getPrototypeOf(at)) {
    if (Object.hasOwn(at, name)) return at as Record<PropertyKey, unknown>;
  }
  return undefined;
}

// The getter of `name` as `target` has it (own or inherited), if it is an accessor.
function getterOf(target: object | undefined, name: string): (() => unknown) | undefined {
  const owner = ownerOf(target, name);
  return owner ? Object.getOwnPropertyDescriptor(owner, name)?.get : undefined;
}

// Deno's and Node's exit codes, read through getters taken before any program: one a program set
// would be the process's (and the next caller's to read).
const exitCodeReaders = ([["Deno", "exitCode"], ["process", "exitCode"]] as const).map(([global, name]) => {
  const target = (globalThis as unknown as Record<string, object | undefined>)[global];
  const get = getterOf(target, name);
  return get ? () => apply(get, target, []) : () => undefined;
});

function exitCodes(): unknown[] {
  return exitCodeReaders.map((read) => read());
}

// The event handlers a program could replace to read the next call's messages.
const HANDLERS = ["onmessage", "onmessageerror", "onerror", "onunhandledrejection", "onrejectionhandled"];

// One walk of the realm: every object reachable from the roots by own properties and
// prototypes, with what each property holds. Typed arrays and buffers are data, not code. Kept
// in flat arrays, by index: a map for each of ~2,100 objects and an array for each of ~6,200
// properties made most of a new sandbox's clean point.
class RealmWalk {
  readonly objects: object[] = [];
  readonly prototypes: (object | null)[] = [];
  readonly extensible: boolean[] = [];
  // objects[i]'s keys are keys[firstKey[i]] up to keys[firstKey[i + 1]], as ownKeys listed them.
  readonly firstKey: number[] = [0];
  readonly keys: PropertyKey[] = [];
  readonly values: unknown[] = [];
  readonly getters: unknown[] = [];
  readonly setters: unknown[] = [];
  // writable (0 for an accessor, 1 true, 2 false) | configurable 4 | enumerable 8
  readonly flags: number[] = [];

  constructor(roots: unknown[]) {
    const seen = new Set<object>();
    const stack: unknown[] = [...roots];
    while (stack.length) {
      const value = stack.pop();
      if (value === null || (typeof value !== "object" && typeof value !== "function")) continue;
      const object = value as object;
      if (seen.has(object)) continue;
      seen.add(object);
      if (opaque(object)) continue;
      // An object that throws part-way (a revoked proxy) keeps what was read of it.
      this.objects.push(object);
      this.prototypes.push(null);
      this.extensible.push(true);
      try {
        const prototype = prototypeOf(object);
        this.prototypes[this.prototypes.length - 1] = prototype;
        this.extensible[this.extensible.length - 1] = isExtensible(object);
        for (const key of ownKeys(object)) {
          const d = describe(object, key);
          if (!d) continue;
          this.keys.push(key);
          this.values.push(d.value);
          this.getters.push(d.get);
          this.setters.push(d.set);
          this.flags.push(descriptorFlags(d));
          stack.push(d.value, d.get, d.set);
        }
        stack.push(prototype);
      } catch { /* nothing more to compare */ }
      this.firstKey.push(this.keys.length);
    }
  }
}

function descriptorFlags(d: PropertyDescriptor): number {
  return (d.writable === undefined ? 0 : d.writable ? 1 : 2) | (d.configurable ? 4 : 0) | (d.enumerable ? 8 : 0);
}

// Not walked: a PyProxy's properties are its Python object's, which the memory copy restores
// (and listing them would run Python code); Pyodide's internals are out of programs' reach
// (the pyodide_js facade, ctypes taints), and walking them would take 60 ms.
let isPyProxy: (value: object) => boolean = () => false;
const internals = new Set<object>();

function opaque(object: object): boolean {
  return ArrayBuffer.isView(object) || object instanceof ArrayBuffer || object instanceof SharedArrayBuffer ||
    internals.has(object) || isPyProxy(object);
}

function describeKey(object: object, key: PropertyKey): string {
  let owner = "an object";
  try {
    owner = object === globalThis
      ? "globalThis"
      : typeof object === "function"
      ? (object as { name?: string }).name || "a function"
      : object.constructor?.name ?? "an object";
  } catch { /* a proxy that refuses */ }
  return `${owner}.${String(key)}`;
}

// The first difference between the clean walk and now, or null.
function realmChange(clean: RealmWalk): string | null {
  const { objects, prototypes, extensible, firstKey, keys, values, getters, setters, flags } = clean;
  for (let i = 0; i < objects.length; i++) {
    const object = objects[i];
    if (opaque(object)) continue;
    let now: PropertyKey[];
    try {
      if (prototypeOf(object) !== prototypes[i]) return "an object's prototype was changed";
      if (isExtensible(object) !== extensible[i]) return "an object was frozen or sealed";
      now = ownKeys(object);
    } catch {
      continue;
    }
    const first = firstKey[i];
    const count = firstKey[i + 1] - first;
    if (now.length !== count) {
      const before = new Set(keys.slice(first, first + count));
      const added = now.find((key) => !before.has(key));
      return added === undefined ? "a property was deleted" : `a property was added (${describeKey(object, added)})`;
    }
    for (let j = 0; j < count; j++) {
      const key = now[j];
      const k = first + j;
      // Another key here: one was replaced, or deleted and added again (the order is the next
      // caller's to see).
      const d = keys[k] === key ? describe(object, key) : undefined;
      if (!d) return `a property was replaced (${describeKey(object, key)})`;
      if (
        !same(d.value, values[k]) || !same(d.get, getters[k]) || !same(d.set, setters[k]) ||
        descriptorFlags(d) !== flags[k]
      ) {
        return `a property was changed (${describeKey(object, key)})`;
      }
    }
  }
  return null;
}

// A memory's pages in two lists: the runs of pages not all zero, as [start, end) byte offsets, and
// the pages all zero. Made before any program runs (Buffer's compare is a program's to replace).
export type PageRuns = { copied: Int32Array; zero: Int32Array };

function pageRuns(memory: Uint8Array): PageRuns {
  const zero = Buffer.alloc(PAGE);
  const bytes = Buffer.from(memory.buffer, memory.byteOffset, memory.length);
  const copied: number[] = [];
  const zeroPages: number[] = [];
  for (let start = 0; start < memory.length; start += PAGE) {
    const end = Math.min(start + PAGE, memory.length);
    if (bytes.compare(zero, 0, end - start, start, end) === 0) zeroPages.push(start / PAGE);
    else if (copied.length && copied[copied.length - 1] === start) copied[copied.length - 1] = end;
    else copied.push(start, end);
  }
  return { copied: Words.from(copied), zero: Words.from(zeroPages) };
}

// Copies the runs of `source` that are not all zero into `target` at `offset`.
function copyRuns(target: Uint8Array, source: Uint8Array, copied: Int32Array, offset = 0): void {
  for (let run = 0; run < copied.length; run += 2) {
    copyInto(target, apply(typedArraySubarray, source, [copied[run], copied[run + 1]]), offset + copied[run]);
  }
}

// This sandbox's clean memory, and its pages. The process's, when `heap` differs from it in a few
// pages only (its start's timestamps): those are written over, and one copy, with the pages its
// first worker found, serves every sandbox of the process. Else a copy of its own: in shared
// memory when the process has none yet, to be the process's; its zero pages are left unwritten.
function cleanMemory(
  heap: Uint8Array,
  shared: WorkerCleanMemory | undefined,
  first: boolean,
): { memory: Uint8Array; pages: PageRuns } {
  if (shared !== undefined && shared.cleanMemory.length === heap.length) {
    const memory = shared.cleanMemory;
    const pages = differingPages(heap, memory, MAX_CLEAN_DRIFT_PAGES);
    if (pages !== null) {
      for (const page of pages) heap.set(memory.subarray(page * PAGE, (page + 1) * PAGE), page * PAGE);
      return { memory, pages: { copied: shared.copied, zero: shared.zero } };
    }
  }
  const own = new Uint8Array(first ? new SharedArrayBuffer(heap.length) : new ArrayBuffer(heap.length));
  const pages = pageRuns(heap);
  copyRuns(own, heap, pages.copied);
  return { memory: own, pages };
}

// `target.set(source, offset)`, leaving alone each page of `target` that is zero and stays zero: a
// page of memory never written is never resident, and a snapshot is 9 MB of zero pages in 24.
// Run before any program, as pageRuns. Says which pages it copied.
export function copySparsely(target: Uint8Array, source: Uint8Array, offset = 0): PageRuns {
  const pages = pageRuns(source);
  copyRuns(target, source, pages.copied, offset);
  clearZeroPages(target.subarray(offset, offset + source.length), pages.zero);
  return pages;
}

// The same from a file, given its pages (copySparsely's answer): `read(into, at)` fills `into` with
// the file's bytes from `at` on. Only those pages are read; the rest of `target` is left zero.
export function readSparsely(
  target: Uint8Array,
  pages: PageRuns,
  read: (into: Uint8Array, at: number) => void,
): void {
  for (let run = 0; run < pages.copied.length; run += 2) {
    read(target.subarray(pages.copied[run], pages.copied[run + 1]), pages.copied[run]);
  }
  clearZeroPages(target, pages.zero);
}

// Zeroes those of `zero`'s pages of `target` that are not (the module's data, written as it was
// instantiated), and leaves the others unwritten.
function clearZeroPages(target: Uint8Array, zero: Int32Array): void {
  const empty = Buffer.alloc(PAGE);
  const to = Buffer.from(target.buffer, target.byteOffset, target.length);
  for (let i = 0; i < zero.length; i++) {
    const start = zero[i] * PAGE;
    const end = Math.min(start + PAGE, target.length);
    if (to.compare(empty, 0, end - start, start, end) !== 0) to.fill(0, start, end);
  }
}

// The pages in which `a` and `b` (of one length, whole pages) differ, or null past `most` of them.
// Halves that compare equal (natively: Buffer's compare) are skipped, so a few pages that differ
// take a few hundred compares, not a JavaScript loop over every word.
function differingPages(a: Uint8Array, b: Uint8Array, most: number): number[] | null {
  const x = Buffer.from(a.buffer, a.byteOffset, a.length);
  const y = Buffer.from(b.buffer, b.byteOffset, b.length);
  const pages: number[] = [];
  const visit = (first: number, count: number): boolean => {
    const start = first * PAGE;
    const end = (first + count) * PAGE;
    if (x.compare(y, start, end, start, end) === 0) return true;
    if (count === 1) return pages.push(first) <= most;
    const half = count >> 1;
    return visit(first, half) && visit(first + half, count - half);
  };
  return visit(0, a.length / PAGE) ? pages : null;
}

// The file system when clean: each node by path, with the times that any change moves.
export type NodeRecord = { node: FSNode; mode: number; ctime: number; mtime: number; atime: number };

function fileTree(FS: EmscriptenFS, root: string, skip: Set<string>): Map<string, NodeRecord> {
  const tree = new Map<string, NodeRecord>();
  const visit = (path: string): void => {
    const node = FS.lookupPath(path, { follow: false }).node;
    tree.set(path, { node, mode: node.mode, ctime: node.ctime, mtime: node.mtime, atime: node.atime });
    if (!FS.isDir(node.mode) || skip.has(path)) return;
    for (const name of FS.readdir(path)) {
      if (name !== "." && name !== "..") visit(path === "/" ? `/${name}` : `${path}/${name}`);
    }
  };
  visit(root);
  return tree;
}

// Removes `paths` of `tree`, deepest first, so a folder is empty by the time it is removed.
function remove(FS: EmscriptenFS, tree: Map<string, NodeRecord>, paths: string[]): void {
  for (const path of [...paths].sort((a, b) => b.length - a.length)) {
    if (FS.isDir(tree.get(path)!.node.mode)) FS.rmdir(path);
    else FS.unlink(path);
  }
}

// The JS reference table's length: the first index it refuses, from `known` on.
export function tableLength(module: Module, known: number, get = module.__hiwire_get): number {
  for (let length = known;; length++) {
    try {
      get(length);
    } catch {
      return length;
    }
  }
}

// Runs the worker's own work (loading the packages a program imports from the packages folder)
// without counting what it calls as the program's.
export async function asTheWorker<T>(work: () => Promise<T>): Promise<T> {
  const was = watching;
  watching = false;
  try {
    return await work();
  } finally {
    watching = was;
  }
}

// The guest's audit hook reports ctypes here: raw memory and C calls reach past every check.
export function taint(reason: string): void {
  if (watching) note(taints, reason);
}

// What has reached past the checks so far: a checkpoint carries it to the sandbox it restores into.
export function taintsSoFar(): string[] {
  return [...taints];
}

// A clean point's sizes: two sandboxes whose clean points differ in them did not start alike, so
// neither takes the other's clean memory or checkpoints.
export type CleanShape = { memory: number; stackPointer: number; table: number; wasmTable: number; libraries: number };

export type RecycleOutcome = { clean: true; dataLost: boolean } | { clean: false; reason: string };

export class CleanState {
  // Read by checkpoint.ts too: a checkpoint is the difference from this clean point.
  readonly module: Module;
  // Read only through copyInto and by index (see Bytes above), with its length from here.
  readonly memory: Uint8Array;
  readonly memoryLength: number;
  readonly memoryWords: Int32Array;
  readonly shape: CleanShape;
  // The shape, the values interned and the packages loaded: a worker adopts another's clean
  // memory only with the same.
  readonly fingerprint: string;
  // Its pages not all zero, in runs, and its pages all zero (resetMemory).
  readonly pages: PageRuns;
  // Each page's hash, made by the first checkpoint or restore that needs them (checkpoint.ts).
  pageHashes: { hashes: Int32Array; bytes: Uint8Array } | null = null;
  readonly stackPointer: number;
  readonly table: unknown[];
  // Pyodide's table of JS values it keeps for good (interned): it only grows.
  readonly immortals: number;
  readonly wasmTableLength: number;
  // The function table's entries: a C callback made since (ctypes) may fill a free slot.
  readonly wasmTableEntries: unknown[];
  readonly libraries: number;
  // The dynamic linker's own state (linker.ts): native libraries loaded since are carried and reset.
  readonly linker: LinkerClean;
  private readonly realm: RealmWalk;
  private readonly builtIns: BuiltIns;
  readonly files: Map<string, NodeRecord>;
  // Not restored with the rest of the tree: data/ has its own check, /proc is made as it is read.
  // /dev is (a program's files in /dev/shm were the next caller's), but for its devices' times.
  readonly skipped: Set<string>;
  readonly streams: Set<number>;
  private readonly cwd: string;
  // Pyodide's record of the packages it loaded, and its clean entries.
  private readonly loadedPackages: Record<string, unknown>;
  private readonly cleanPackages: Record<string, unknown>;
  private readonly onmessage: unknown;
  private readonly exitCodes: unknown[];
  private readonly suspendedStacks: number;
  private data: Map<string, NodeRecord> = new Map();

  // Taken once the worker is ready and before its first program: from here on, everything a
  // program does is either copied back, restored, or found by the checks. `shared`: the process's
  // clean memory (its first worker's), adopted when this one's differs from it in a few pages only.
  constructor(
    pyodide: PyodideInterface,
    readonly dataDir: string,
    realmRoots: unknown[],
    shared: WorkerCleanMemory | undefined,
  ) {
    const module = (pyodide as unknown as { _module: Module })._module;
    this.module = module;
    this.stackPointer = module.stackSave();
    this.table = Array.from({ length: tableLength(module, 0) }, (_, i) => module.__hiwire_get(i));
    this.immortals = tableLength(module, 0, module.__hiwire_immortal_get);
    this.wasmTableLength = module.wasmTable.length;
    this.wasmTableEntries = Array.from({ length: this.wasmTableLength }, (_, i) => module.wasmTable.get(i));
    this.libraries = Object.keys(module.LDSO.loadedLibsByName).length;
    this.linker = new LinkerClean(module);
    this.loadedPackages = pyodide.loadedPackages as Record<string, unknown>;
    this.cleanPackages = { ...this.loadedPackages };
    const FS = module.FS;
    this.skipped = new Set([this.dataDir, "/proc"]);
    this.files = fileTree(FS, "/", this.skipped);
    this.streams = new Set(FS.streams.flatMap((stream, fd) => (stream ? [fd] : [])));
    this.cwd = FS.cwd();
    this.onmessage = getterOf(globalThis, "onmessage")?.call(globalThis);
    this.exitCodes = exitCodes();
    this.suspendedStacks = suspendedStacks;
    // Proxies that Python objects get during a run register with Pyodide's finalizer; after the
    // memory is copied back, their finalizers would free someone else's objects. Those of the start
    // go now (watchFinalizers; watched here too in case the registry was made out of sight).
    watchFinalizers(module.finalizationRegistry);
    forgetFinalizers(module.finalizationRegistry);
    for (const internal of [pyodide, module, (pyodide as unknown as { _api: object })._api]) internals.add(internal);
    const PyProxy = pyodide.ffi.PyProxy;
    // Pyodide's own test, as it is now: a program may reach the class and replace it.
    const pyProxyTest = (PyProxy as unknown as Record<symbol, (value: unknown) => boolean>)[Symbol.hasInstance];
    isPyProxy = (value) => apply(pyProxyTest, PyProxy, [value]);
    this.builtIns = new BuiltIns();
    this.realm = new RealmWalk([globalThis, ...realmRoots, ...this.table]);
    this.shape = {
      memory: module.HEAP8.buffer.byteLength,
      stackPointer: this.stackPointer,
      table: this.table.length,
      wasmTable: this.wasmTableLength,
      libraries: this.libraries,
    };
    this.fingerprint = JSON.stringify([this.shape, this.immortals, Object.keys(this.cleanPackages).sort()]);
    const adoptable = shared?.fingerprint === this.fingerprint ? shared : undefined;
    ({ memory: this.memory, pages: this.pages } = cleanMemory(
      new Bytes(module.HEAP8.buffer),
      adoptable,
      shared === undefined,
    ));
    this.memoryLength = this.memory.length;
    this.memoryWords = new Words(this.memory.buffer, this.memory.byteOffset, this.memoryLength / 4);
    watching = true;
  }

  // Runs the realm's check twice, so V8 compiles it before the first caller's recycle needs it.
  // Only while no program has run in the worker: the check runs on built-ins a program could replace.
  compileChecks(): void {
    for (let i = 0; i < 2; i++) realmChange(this.realm);
  }

  // Files the host sends into data/ after the clean point are part of the clean state too. Their
  // change time is set to 0, which any later change moves, however soon it comes.
  dataApplied(): void {
    this.data = fileTree(this.module.FS, this.dataDir, new Set());
    for (const record of this.data.values()) record.node.ctime = record.ctime = 0;
  }

  // Before the memory is replaced (a recycle, a restore): no finalizer registered since the clean
  // point may run on what replaces it.
  forgetFinalizers(): void {
    forgetFinalizers(this.module.finalizationRegistry);
  }

  // A clean slot of the function table holds something else: a C callback (ctypes) filled it.
  cleanSlotsChanged(): boolean {
    const table = this.module.wasmTable;
    return this.wasmTableEntries.some((entry, i) => table.get(i) !== entry);
  }

  // A built-in a program replaced: nothing below may run on it (BuiltIns). First, always.
  builtInChanged(): string | null {
    return this.builtIns.changed();
  }

  recycle(): RecycleOutcome {
    const builtIn = this.builtInChanged();
    if (builtIn !== null) return { clean: false, reason: `its JavaScript built-ins changed: ${builtIn}` };
    // Packages loaded since are forgotten with their files (restoreFiles) and libraries (linker).
    for (const name of Object.keys(this.loadedPackages)) {
      if (!(name in this.cleanPackages)) delete this.loadedPackages[name];
    }
    const reason = this.whyNot();
    if (reason !== null) return { clean: false, reason };
    for (const id of timers) clearTimeout(id); // clears intervals too
    timers.clear();
    for (const immediate of immediates) clearImmediate(immediate);
    immediates.clear();
    this.forgetFinalizers();
    const files = this.restoreFiles();
    if (files !== null) return { clean: false, reason: files };
    const linker = this.linker.reset();
    if (linker !== null) return { clean: false, reason: linker };
    const dataLost = this.restoreData();
    this.restoreMemory();
    return { clean: true, dataLost };
  }

  private whyNot(): string | null {
    if (taints.size) return [...taints][0];
    if (suspendedStacks !== this.suspendedStacks) return "a program's stack is still suspended, waiting on JavaScript";
    const module = this.module;
    if (module.HEAP8.buffer.byteLength - this.memoryLength > MAX_MEMORY_GROWTH) {
      return `its memory grew to ${Math.round(module.HEAP8.buffer.byteLength / 2 ** 20)} MB`;
    }
    if (this.cleanSlotsChanged()) return "it changed the function table (a C callback)";
    if (exitCodes().some((code, i) => !same(code, this.exitCodes[i]))) return "it set the process's exit code";
    if (getterOf(globalThis, "onmessage")?.call(globalThis) !== this.onmessage) {
      return "its message handler was replaced";
    }
    for (const name of HANDLERS.slice(1)) {
      if (getterOf(globalThis, name)?.call(globalThis)) return `it set ${name}`;
    }
    const change = realmChange(this.realm);
    return change === null ? null : `its JavaScript realm changed: ${change}`;
  }

  private restoreFiles(): string | null {
    const FS = this.module.FS;
    FS.ignorePermissions = true;
    try {
      for (let fd = 0; fd < FS.streams.length; fd++) {
        const stream = FS.streams[fd];
        if (stream && !this.streams.has(fd)) FS.close(stream);
      }
      const now = fileTree(FS, "/", this.skipped);
      remove(FS, now, [...now.keys()].filter((path) => !this.files.has(path)));
      for (const [path, record] of this.files) {
        if (path === this.dataDir) continue; // restoreData's
        const node = now.get(path)?.node;
        if (node !== record.node) return `a file it did not make was replaced (${path})`;
        if (node.ctime !== record.ctime && !FS.isDir(record.mode) && !FS.isChrdev(record.mode)) {
          return `a file it did not make was changed (${path})`;
        }
        Object.assign(node, { mode: record.mode, ctime: record.ctime, mtime: record.mtime, atime: record.atime });
      }
      FS.chdir(this.cwd);
      return null;
    } catch (error) {
      return `its files could not be restored: ${error}`;
    } finally {
      FS.ignorePermissions = false;
    }
  }

  // data/ is the host's: if a program changed it, it is emptied and the host sends it again.
  private restoreData(): boolean {
    const FS = this.module.FS;
    const now = fileTree(FS, this.dataDir, new Set());
    const same = now.size === this.data.size &&
      [...this.data].every(([path, record]) => {
        const node = now.get(path)?.node;
        return node === record.node && node.ctime === record.ctime && node.mode === record.mode;
      });
    if (same) return false;
    FS.ignorePermissions = true;
    try {
      remove(FS, now, [...now.keys()].filter((path) => path !== this.dataDir));
    } finally {
      FS.ignorePermissions = false;
    }
    this.data = fileTree(FS, this.dataDir, new Set());
    return true;
  }

  // The WebAssembly memory becomes the clean memory again, and zeros past it (memory a program grew
  // into: the next must not find its bytes there). A page zero in both is not written: one never
  // written stays out of memory (copySparsely). Only intrinsics and indexes, as for all of it.
  resetMemory(): void {
    const buffer = this.module.HEAP8.buffer;
    const heap = new Bytes(buffer);
    const { copied, zero } = this.pages;
    copyRuns(heap, this.memory, copied);
    const words = new Words(buffer, 0, this.memoryLength / 4);
    const wordsPerPage = PAGE / 4;
    for (let i = 0; i < zero.length; i++) {
      const first = zero[i] * wordsPerPage;
      // Eight words a test: word by word, the loop took 1.45 ms of a recycle, this way 1.0.
      for (let word = first; word < first + wordsPerPage; word += 8) {
        if (
          (words[word] | words[word + 1] | words[word + 2] | words[word + 3] | words[word + 4] | words[word + 5] |
            words[word + 6] | words[word + 7]) !== 0
        ) {
          apply(typedArrayFill, heap, [0, zero[i] * PAGE, (zero[i] + 1) * PAGE]);
          break;
        }
      }
    }
    apply(typedArrayFill, heap, [0, this.memoryLength]);
  }

  private restoreMemory(): void {
    const module = this.module;
    this.resetMemory();
    module.stackRestore(this.stackPointer);
    const length = tableLength(module, this.table.length);
    for (let i = 0; i < length; i++) module.__hiwire_set(i, i < this.table.length ? this.table[i] : undefined);
  }
}
