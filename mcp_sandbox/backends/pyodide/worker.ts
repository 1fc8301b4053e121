/// <reference lib="deno.worker" />
// Sandbox side: hosts Pyodide and runs programs through the guest runtime
// (the package mcp_sandbox/guest/), which returns each outcome as JSON text. Messages and
// constants come from protocol.ts; the exact Pyodide version is pinned once, in deno.json.
import { loadPyodide, type PyodideInterface } from "pyodide";
import { HOME, PYODIDE_OPTIONS } from "./options.ts";
import { loadGuestModules } from "./modules.ts";
import { asTheWorker, CleanState, decode, guardRealm, hostSetTimeout, type RecycleOutcome, taint } from "./recycle.ts";
import { restoreCheckpoint, takeCheckpoint } from "./checkpoint.ts";
import { fileOptions, type Hooked, hookInstance, Killed, type Snapshot, Unwinding } from "./instance.ts";
import { PYODIDE_DIR, runPyodideScript } from "./script.ts";
import {
  type CheckpointedMessage,
  type ControlAnswer,
  type ControlRequest,
  DATA_DIR,
  GUEST_RUNTIME_MODULE,
  type GuestLimits,
  INTERRUPT_SIGNAL,
  JIT_WARM_UP_IDLE_MS,
  JIT_WARM_UP_ROUNDS_AT_START,
  OUTPUT_DIR,
  REPLY_INTERRUPTED,
  type RestoredMessage,
  type RunMessage,
  type RunnerMessage,
  SIGNAL_INTERRUPT,
  SIGNAL_KILL,
  type SnapshotPages,
  SYNC_LENGTH,
  SYNC_REPLY_READY,
  SYNC_STATE,
  SYNC_WAITING,
  type WorkerAhead,
  type WorkerCheckpoint,
  type WorkerCleanMemory,
  type WorkerData,
  type WorkerInit,
  type WorkerMessage,
  type WorkerModule,
  type WorkerPost,
  type WorkerRecycle,
  type WorkerRecycled,
  type WorkerRecycledCrash,
  type WorkerRestore,
  type WorkerWarmedUp,
} from "./protocol.ts";

type PyCallable = ((...args: unknown[]) => unknown) & {
  destroy?: () => void;
  callPromising?: (...args: unknown[]) => Promise<unknown>;
};
type PyModule = { [name: string]: PyCallable } & { destroy(): void };

type PathSettings = Record<string, unknown>;

// The worker's whole state. The fields `initial` leaves out are set by init, which is handled
// before any other message; the rest change with runs, recycles, restores and the warm-up.
type WorkerState = {
  // -- Set by init, for the worker's life --
  pyodide: PyodideInterface;
  // The guest runtime's interpreter, and its entry points (module functions of the guest runtime).
  interpreter: unknown;
  runJson: PyCallable;
  jitWarmUp: PyCallable;
  cancelRun: PyCallable;
  noteTasks: PyCallable;
  reseed: PyCallable;
  // Names in the session's globals that hold JavaScript objects (a checkpoint's refusal names them).
  jsHolders: PyCallable;
  // A module function taking the channel, never `channel.deliver`: Pyodide caches the proxy of a bound
  // method in JavaScript, which neither a recycle nor a checkpoint's restore brings back with memory.
  // Unset before init: a tool_result then answers a call of the worker this one replaced.
  deliver?: PyCallable;
  channel: unknown; // the guest's ToolChannel, which each tool_result goes to through `deliver`
  // What a run reports when its interrupt lands in the runtime's own code (guest.interrupted_json).
  interruptedOutcome: string;
  // Pyodide's interrupt buffer and the kill flag (SIGNAL_INTERRUPT, SIGNAL_KILL; see protocol.py).
  signals: Int32Array;
  // A blocking tool call's state and reply, shared with the main thread (blockOnToolCall).
  syncState: Int32Array;
  syncData: SharedArrayBuffer;
  // The runner's private channel for recycle, checkpoint and restore (in this module: out of reach).
  control: MessagePort;
  // Each host path this worker knows, with its neutral name, the longest first (scrub).
  hostPaths: [string, string][];
  // Pyodide's settings, and those of them that hold a host path, real and neutral (withRealPaths).
  pyodideSettings: PathSettings;
  realPaths: PathSettings;
  neutralPaths: PathSettings;
  // The packages folder, with what finds a program's imports and sys.modules; null: no packages.
  packagesDir: string | null;
  findImports: PyCallable | null;
  importedModules: { has(name: string): boolean } | null;

  // -- The run in progress --
  currentId: number | null;
  // Its program exited (os._exit), with this status: the run ends as a crash whatever caught it.
  exitStatus: number | null;
  // It awaits (parked between its awaits), and a waiter for an interrupt is armed (cancelOnInterrupt).
  awaiting: boolean;
  watchingInterrupts: boolean;

  // -- The clean point --
  clean: CleanState | null;
  // A program ran since the clean point (or the last recycle): a restore needs a clean sandbox.
  ranSinceClean: boolean;
  // A program ran, or a checkpoint was restored, in this worker: never reset by a recycle.
  ranAny: boolean;
  // The wheels loaded from the packages folder, and those of them loaded before the clean point
  // (a recycle goes back to them).
  loadedWheels: Set<string>;
  cleanWheels: Set<string>;

  // Pyodide's runtime script, run before init by a worker started ahead (WorkerAhead), or why not.
  ahead?: RanScript | Error;

  // -- Messages and the JIT warm-up --
  // init, data and run are handled one after another, in order (enqueue).
  queue: Promise<void>;
  waiting: number; // messages queued or being handled
  lastMessageAt: number; // when the last one was done: the warm-up waits for quiet
  warmUpLeft: number; // rounds still to run (warmUpStep)
};

const initial: Partial<WorkerState> = {
  hostPaths: [],
  realPaths: {},
  neutralPaths: {},
  packagesDir: null,
  findImports: null,
  importedModules: null,
  currentId: null,
  exitStatus: null,
  awaiting: false,
  watchingInterrupts: false,
  clean: null,
  ranSinceClean: false,
  ranAny: false,
  loadedWheels: new Set(),
  cleanWheels: new Set(),
  queue: Promise.resolve(),
  waiting: 0,
  lastMessageAt: 0,
  warmUpLeft: 0,
};
// Without a prototype: what sandboxed code adds to Object.prototype is never read as the worker's state.
const state = Object.assign(Object.create(null), initial) as WorkerState;

// The control channel's answers are built and sent with the originals: a program may replace
// JSON.stringify or MessagePort.prototype.postMessage, and must not be able to forge a verdict.
const stringify = JSON.stringify;
const portPost = MessagePort.prototype.postMessage;

function answer(
  reply: ControlAnswer | WorkerModule | WorkerCleanMemory | WorkerRecycledCrash | WorkerWarmedUp,
  transfer: Transferable[] = [],
): void {
  portPost.call(state.control, reply, { transfer });
}

// On the private channel too: what a program posts with the worker's own postMessage (a result for
// the next caller's run, from a callback that outlived a recycle) is never read.
function post(id: number | null, json: string, exiting = false, syncCall?: number): void {
  const message: WorkerPost = { id, json, exiting, ...(syncCall === undefined ? {} : { syncCall }) };
  portPost.call(state.control, message);
}

function postRunnerMessage(id: number | null, message: RunnerMessage, exiting = false): void {
  post(id, JSON.stringify(message), exiting);
}

// A blocking tool call: post it, then sleep in Atomics.wait until the main thread has the
// reply in shared memory (see runner.ts and protocol.py).
function blockOnToolCall(call: number, message: string): string {
  if (Atomics.load(state.signals, SIGNAL_INTERRUPT) !== 0) {
    // Interrupted already (the deadline passed inside C code): the call is never made.
    state.signals[SIGNAL_INTERRUPT] = 0;
    return REPLY_INTERRUPTED;
  }
  Atomics.store(state.syncState, SYNC_STATE, SYNC_WAITING);
  post(null, message, false, call);
  Atomics.wait(state.syncState, SYNC_STATE, SYNC_WAITING);
  if (Atomics.load(state.syncState, SYNC_STATE) !== SYNC_REPLY_READY) {
    // The guest raises KeyboardInterrupt itself; a buffer left set would raise a second one
    // later, inside the runtime's own reporting.
    state.signals[SIGNAL_INTERRUPT] = 0;
    return REPLY_INTERRUPTED;
  }
  const length = state.syncState[SYNC_LENGTH];
  // TextDecoder refuses views of shared memory, so the reply is copied out first.
  const bytes = new Uint8Array(length);
  bytes.set(new Uint8Array(state.syncData, 0, length));
  return decode(bytes);
}

// The guest's waits (time.sleep and the rest, guest.install_waits): asleep in Atomics.wait, with no
// CPU, until the deadline or the runner's notify of an interrupt, which it takes from the buffer and
// answers true for, so the guest raises KeyboardInterrupt in Python (through checkInterrupt, Pyodide
// would also print its traceback to stderr). After a kill it returns at once, for the interpreter's
// next signal check to end the run.
const now = performance.now.bind(performance);

// V8's full collection (the runner's flag --expose-gc), off the global before any program runs: a
// sandbox goes idle with no garbage from its start or its warm-up, and only the worker collects.
// The "last-resort" flavour also compacts the heap and returns its free pages (7 MB a worker).
const collectGarbage: () => void = (() => {
  type Collect = (options?: { type: "major"; execution: "sync"; flavor: "last-resort" }) => void;
  const gc = (globalThis as { gc?: Collect }).gc;
  // Deno's global property cannot be deleted, only emptied.
  if (gc) Object.defineProperty(globalThis, "gc", { value: undefined, writable: false });
  return gc ? () => gc({ type: "major", execution: "sync", flavor: "last-resort" }) : () => {};
})();

function waitInterruptibly(seconds: number): boolean {
  const deadline = now() + seconds * 1000;
  for (;;) {
    if (Atomics.load(state.signals, SIGNAL_KILL) !== 0) return false;
    if (Atomics.compareExchange(state.signals, SIGNAL_INTERRUPT, INTERRUPT_SIGNAL, 0) !== 0) return true;
    const left = deadline - now();
    if (left <= 0) return false;
    Atomics.wait(state.signals, SIGNAL_INTERRUPT, 0, left);
  }
}

// An interrupt while the program awaits (top-level `await`, or asyncio.run) finds no Python running
// to raise in: its tasks are cancelled instead. One waiter at a time, re-armed after it fires.
const waitAsync = Atomics.waitAsync.bind(Atomics); // before guardRealm flags its use

function cancelOnInterrupt(): void {
  if (state.watchingInterrupts) return;
  const waiter = waitAsync(state.signals, SIGNAL_INTERRUPT, 0);
  const fired = () => {
    state.watchingInterrupts = false;
    if (!state.awaiting || Atomics.load(state.signals, SIGNAL_INTERRUPT) === 0) return;
    // KeyboardInterrupt comes from the cancellation, not from the buffer (which would raise it in
    // cancel_run itself); with nothing to cancel, the buffer keeps it for the next Python code.
    state.signals[SIGNAL_INTERRUPT] = 0;
    let cancelled = false;
    try {
      cancelled = state.cancelRun() === true;
    } finally {
      if (!cancelled) Atomics.store(state.signals, SIGNAL_INTERRUPT, INTERRUPT_SIGNAL);
    }
  };
  state.watchingInterrupts = true;
  if (waiter.async) waiter.value.then(fired);
  else fired();
}

// Sandboxed code may end the worker itself (js.Deno.exit, js.close); a worker that ends
// silently would leave the host waiting, so each way out says so first. The wrappers are
// non-configurable: sandboxed code can neither replace nor unwrap them.
function announceExit(target: object, name: string): void {
  const original = (target as Record<string, (...args: unknown[]) => unknown>)[name].bind(target);
  Object.defineProperty(target, name, {
    configurable: false,
    writable: false,
    value: (...args: unknown[]) => {
      const message = `the sandbox called ${name}(${args.map(String).join(", ")})`;
      postRunnerMessage(state.currentId, { type: "crashed", id: state.currentId, message }, true);
      return original(...args);
    },
  });
}
announceExit(Deno, "exit");
announceExit(self, "close");

// Several sandboxes share this process (runner.ts): what a program could reach another one's
// worker through, or leave for a later process, is refused before anything else runs. Deno
// delivers a BroadcastChannel's messages to every worker of the process that opened one of that
// name, and keeps what `caches` holds on disk, in the Deno dir, for every later process. A worker
// that a program starts (node:worker_threads cannot be refused here) has both again: its `caches`
// finds no folder to keep anything in (the backend's refuse_web_storage), and its BroadcastChannel
// reaches only workers that open one, which no sandbox can.
function refuseShared(): void {
  // A function, not an arrow: `new` must reach the refusal too.
  const refuse = (what: string) =>
    function refused(): never {
      throw new Deno.errors.NotCapable(`${what}: the sandbox shares its process with other sandboxes`);
    };
  const fixed = { configurable: false, enumerable: false };
  Object.defineProperties(globalThis, {
    BroadcastChannel: { ...fixed, writable: false, value: refuse("BroadcastChannel is refused") },
    caches: { ...fixed, get: refuse("the Cache API is refused") },
  });
}
refuseShared();
// Before Pyodide loads: what could leave work behind for a later call is wrapped (recycle.ts).
const readDirSync = Deno.readDirSync;
const openSync = Deno.openSync;
guardRealm(["execPath"]);

// Sandboxed code learns no host path. Each path this worker knows has a neutral name, which is
// all that error texts, stack traces and Pyodide's own settings show.

function scrub(text: string): string {
  for (const [path, name] of state.hostPaths) text = text.replaceAll(path, name);
  return text;
}

// Pyodide reads its own folder's path from its settings when it loads a package: the real
// paths are there only while this worker loads packages, before any program runs.
async function withRealPaths<T>(load: () => Promise<T>): Promise<T> {
  Object.assign(state.pyodideSettings, state.realPaths);
  try {
    return await load();
  } finally {
    Object.assign(state.pyodideSettings, state.neutralPaths);
    const loaded = state.pyodide.loadedPackages as Record<string, string>;
    for (const name of Object.keys(loaded)) loaded[name] = scrub(loaded[name]);
  }
}

function hideHostPaths(known: [string | undefined, string][]): void {
  state.pyodideSettings = (state.pyodide as unknown as { _api: { config: PathSettings } })._api.config;
  known.push([state.pyodideSettings.indexURL as string, "/pyodide"]);
  for (const [path, name] of known) if (path) state.hostPaths.push([path.replace(/\/+$/, ""), name]);
  state.hostPaths.sort((a, b) => b[0].length - a[0].length); // the longest path first, when one holds another
  for (const [key, value] of Object.entries(state.pyodideSettings)) {
    if (typeof value === "string" && scrub(value) !== value) {
      state.realPaths[key] = value;
      state.neutralPaths[key] = scrub(value);
    }
  }
  Object.assign(state.pyodideSettings, state.neutralPaths);
  const fixed = (target: object, name: string, value: unknown) =>
    Object.defineProperty(target, name, { configurable: false, writable: false, value });
  fixed(Deno, "execPath", () => {
    throw new Deno.errors.NotCapable("the sandbox does not tell the host's paths");
  });
  fixed(globalThis, "location", undefined);
  // Stack traces name each file, not its folder on the host.
  fixed(Error, "prepareStackTrace", (error: Error, frames: NodeJS.CallSite[]) => {
    const lines = frames.map((frame) => {
      const file = String(frame.getFileName() ?? "<native>").split("/").pop();
      return `    at ${frame.getFunctionName() ?? "<anonymous>"} (${file}:${frame.getLineNumber()})`;
    });
    return scrub([`${error.name}: ${error.message}`, ...lines].join("\n"));
  });
}

// The session's working directory: data/ is a read-only copy of the host's data folder, sent
// by the runner's main thread (this worker may not read the folder); output/ is where the
// program leaves files for the host.
const GUEST_DATA = `${HOME}/${DATA_DIR}`;

function setFolderModes(folder: string, mode: number): void {
  const FS = state.pyodide.FS;
  FS.chmod(folder, mode);
  for (const name of FS.readdir(folder)) {
    if (name === "." || name === "..") continue;
    const path = `${folder}/${name}`;
    if (FS.isDir(FS.stat(path).mode)) setFolderModes(path, mode);
  }
}

function applyData({ files, removed }: WorkerData): void {
  const FS = state.pyodide.FS;
  setFolderModes(GUEST_DATA, 0o755);
  try {
    for (const path of removed) {
      try {
        FS.unlink(`${GUEST_DATA}/${path}`);
      } catch { /* already gone */ }
    }
    for (const { path, bytes } of files) {
      const target = `${GUEST_DATA}/${path}`;
      FS.mkdirTree(target.slice(0, target.lastIndexOf("/")));
      if (FS.analyzePath(target).exists) FS.chmod(target, 0o644);
      FS.writeFile(target, bytes);
      FS.chmod(target, 0o444);
    }
  } finally {
    setFolderModes(GUEST_DATA, 0o555);
  }
  state.clean?.dataApplied();
}

// Packages: imports of Pyodide's own packages (numpy, pandas, ...) and of wheels placed in the
// packages folder load from that folder on demand; the sandbox has no network to fetch them.

function normalize(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "_");
}

function wheelsInFolder(): Map<string, string> {
  const wheels = new Map<string, string>();
  for (const entry of readDirSync(state.packagesDir!)) {
    if (entry.isFile && entry.name.endsWith(".whl")) {
      wheels.set(normalize(entry.name.split("-")[0]), `${state.packagesDir}/${entry.name}`);
    }
  }
  return wheels;
}

// Pyodide reports a package it could not load as two lines: this header, then the error.
const LOAD_FAILED = /^The following error occurred while loading (.+):$/;

async function loadImports(code: string): Promise<string[]> {
  // Only an import statement can need a package: most programs skip the parse altogether.
  if (state.packagesDir === null || !code.includes("import")) return [];
  const problems: string[] = [];
  let loading = "";
  const onError = (text: string) => {
    const header = LOAD_FAILED.exec(text);
    if (header) loading = `${header[1]}: `;
    // A file not in the folder (yet) is the host's to explain: it knows what is being fetched.
    else if (!text.includes("ENOENT")) problems.push(loading + text);
  };
  const quiet = { messageCallback: () => {}, errorCallback: onError };
  try {
    const found = state.findImports!(code) as { toJs(): string[]; destroy(): void };
    const names = found.toJs();
    found.destroy();
    // A module the session has imported already needs no package.
    if (names.every((name) => state.importedModules!.has(name.split(".")[0]))) return [];
    await asTheWorker(() => withRealPaths(() => state.pyodide.loadPackagesFromImports(code, quiet)));
    // Pyodide's own packages were loaded just above, by its lock file: loading their files again
    // as wheels would only earn a note ("URI mismatch ... already loaded").
    const loaded = new Set(Object.keys(state.pyodide.loadedPackages).map(normalize));
    const wanted = names.map((name) => normalize(name.split(".")[0]))
      .filter((n) => !state.loadedWheels.has(n) && !loaded.has(n));
    if (wanted.length) {
      const wheels = wheelsInFolder();
      for (const name of wanted) {
        const wheel = wheels.get(name);
        if (wheel === undefined) continue;
        await asTheWorker(() => withRealPaths(() => state.pyodide.loadPackage(wheel, quiet)));
        state.loadedWheels.add(name);
      }
    }
  } catch (error) {
    // The run's interrupt landed in the import scan: the run is interrupted, not a package.
    if ((error as { type?: unknown }).type === "KeyboardInterrupt") throw error;
    problems.push(String(error));
  }
  return problems.map((text) => `package loading: ${scrub(text)}`);
}

type CacheOutcome = "used" | "refused" | "damaged";
type RanScript = { cache?: CacheOutcome };

// Pyodide's runtime script run here rather than by loadPyodide, so that its module factory can be
// wrapped (instance.ts), and what became of the code cache it was given.
async function runScript(given: Partial<Omit<WorkerAhead, "type">>): Promise<RanScript> {
  if (given.script === undefined) throw new Error("Pyodide's runtime script was sent neither ahead nor with init");
  const cache = given.codeCache;
  // `given` may live as long as the worker: the script's and the cache's 1 MB each need not.
  delete given.codeCache;
  // A module's exports are objects the realm walk does not reach: one a program changed would
  // be the next caller's (the Node built-ins are shared by every import of them).
  const script = await runPyodideScript(given.script, cache, () => taint("it imported a JavaScript module"));
  delete given.script;
  if (given.codeCacheDamaged) return { cache: "damaged" };
  return cache ? { cache: script.cacheRejected ? "refused" : "used" } : {};
}

async function init(message: WorkerInit): Promise<void> {
  const started = performance.now();
  // From the worker's creation (its time origin) to here: Deno's worker runtime and the modules;
  // none for a worker started ahead (runner.ts), whose start counts from here.
  const origin = message.spare ? started : 0;
  const phases: [string, number][] = [["worker start", Math.round(started - origin)]];
  let stepStarted = started;
  const step = (name: string) => {
    const now = performance.now();
    phases.push([name, Math.round(now - stepStarted)]);
    stepStarted = now;
  };
  const { packagesDir: packages, snapshot } = message;
  let snapshotPages: SnapshotPages | undefined; // found by this worker's restore, if it reads it whole
  let hooked: Hooked | undefined;
  let cacheOutcome: CacheOutcome | undefined;
  const opened = snapshot
    ? openSnapshot(snapshot, message.clean?.snapshot, (found) => snapshotPages = found)
    : undefined;
  step("snapshot read");
  state.signals = message.signals as Int32Array;
  try {
    const ran = state.ahead ?? await runScript(message);
    if (ran instanceof Error) throw ran;
    cacheOutcome = ran.cache;
    if (state.ahead === undefined) step("pyodide.asm.js");
    hooked = hookInstance({
      maxBytes: message.memoryMaxBytes,
      signals: state.signals,
      running: () => state.currentId !== null,
      exited: (status) => {
        state.exitStatus ??= status;
      },
      module: message.module as WebAssembly.Module | undefined,
      compiled: (module) => {
        if (!message.module) answer({ module } satisfies WorkerModule);
      },
      ...(opened ? { snapshot: opened.snapshot } : {}),
    });
    state.pyodide = await loadPyodide({
      ...PYODIDE_OPTIONS,
      ...fileOptions(PYODIDE_DIR, message.module !== undefined),
      ...(packages ? { packageBaseUrl: `${packages}/` } : {}),
      // Restoring the interpreter's memory skips most of the start-up (see snapshot.ts).
      ...(opened ? { _loadSnapshot: opened.snapshot.bytes } : {}),
    });
  } finally {
    opened?.close();
  }
  // Pyodide keeps a reference to its options: detaching a snapshot read whole frees ~20 MB.
  opened?.snapshot.bytes.buffer.transfer(0);
  step("Pyodide");
  if (packages) {
    state.packagesDir = packages;
    state.findImports = state.pyodide.pyimport("pyodide.code").find_imports;
    state.importedModules = state.pyodide.pyimport("sys").modules;
    // Imported now, into the clean point, rather than by every recycled sandbox that installs a
    // package: its checkpoint would carry them too (what it imports of the standard library is
    // in the memory snapshot already, snapshot.ts).
    state.pyodide.pyimport("pyodide._package_loader");
  }
  state.pyodide.FS.mkdirTree(`${HOME}/${OUTPUT_DIR}`);
  state.pyodide.FS.mkdirTree(GUEST_DATA);
  state.pyodide.FS.chdir(HOME);
  // Pyodide's interrupt buffer is attached only while a run runs (run): between runs an earlier
  // run's task or a warm-up round would take the next run's interrupt, which may arrive first.
  // The runner's stdin carries the host's messages: neither Pyodide's stdin nor Deno's reads it,
  // nor Deno's internals (their `core.readSync(0, ...)` reads any open resource).
  state.pyodide.setStdin({ error: true });
  const refuse = (what: string) => ({
    configurable: false,
    get() {
      throw new Deno.errors.NotCapable(what);
    },
  });
  Object.defineProperty(Deno, "stdin", refuse("the sandbox has no stdin"));
  const internal = (Deno as unknown as { internal: symbol }).internal;
  Object.defineProperty(Deno, internal, refuse("Deno's internals are not the sandbox's"));
  state.syncState = message.syncState as Int32Array;
  state.syncData = message.syncData as SharedArrayBuffer;
  loadGuestModules(state.pyodide, message.guest_modules);
  const sys = state.pyodide.pyimport("sys");
  // Loaded under its dotted name without its parent packages, so it is found in sys.modules.
  const guest = sys.modules.get(GUEST_RUNTIME_MODULE) as PyModule | undefined;
  if (guest === undefined) throw new Error("the guest runtime is neither in the memory snapshot nor sent with init");
  const sendToHost = (json: string) => post(null, json);
  state.channel = guest.ToolChannel(sendToHost, blockOnToolCall);
  state.deliver = guest.deliver;
  const limits = state.pyodide.toPy(message.limits as GuestLimits);
  // The host cannot read this sandbox's files: output files travel inline.
  state.interpreter = guest.Interpreter(limits, state.channel, true);
  limits.destroy();
  state.runJson = guest.run_json;
  state.cancelRun = guest.cancel_run;
  state.noteTasks = guest.note_tasks;
  state.reseed = guest.reseed;
  guest.install_waits(waitInterruptibly);
  guest.install_interrupt_handlers();
  state.jitWarmUp = guest.jit_warm_up; // borrowed from the module's proxy, which therefore stays
  // The first runs compile much of the runtime lazily (the first takes ~20 ms): do a few before
  // `ready`, in a throwaway interpreter, so a sandbox's first calls from the pool do not pay for it.
  // Every sandbox runs them, a replacement worker too: a checkpoint needs the same clean memory.
  step("guest runtime");
  state.jitWarmUp(JIT_WARM_UP_ROUNDS_AT_START);
  step("first rounds");
  hideHostPaths([
    [packages, "/packages"],
    [PYODIDE_DIR, "/pyodide"],
    [snapshot, "/snapshot"],
    [new URL(".", import.meta.url).pathname, "/runner"],
    [Deno.execPath(), "deno"],
  ]);
  state.jsHolders = guest.js_holders;
  state.interruptedOutcome = guest.interrupted_json() as string;
  const facade = limitPyodideModule(guest.forget_modules);
  // A program that reaches past what a recycle checks (ctypes, gc, tracing) taints the sandbox.
  guest.report_reaching_past((event: string) => taint(`it used ${event}`));
  const preloadFailed = await preload(message.preload ?? []);
  await settleMessagePorts();
  // Pyodide's own read of its binary may end after it has started (instance.ts): the clean point
  // comes once WebAssembly's functions are their own again.
  await hooked?.unhooked();
  step("preload");
  state.clean = new CleanState(state.pyodide, GUEST_DATA, [facade], message.clean);
  // The process's first clean memory goes to the main thread, for every later worker to adopt.
  if (message.clean === undefined) {
    answer(
      {
        cleanMemory: state.clean.memory,
        fingerprint: state.clean.fingerprint,
        copied: state.clean.pages.copied,
        zero: state.clean.pages.zero,
        ...(snapshotPages ? { snapshot: snapshotPages } : {}),
      } satisfies WorkerCleanMemory,
    );
  }
  step("clean point");
  postRunnerMessage(null, {
    type: "ready",
    python: sys.version.split(" ")[0],
    pyodide: state.pyodide.version,
    load_ms: Math.round(performance.now() - origin),
    ...(cacheOutcome ? { code_cache: cacheOutcome } : {}),
    ...(opened ? { snapshot_read: "pages" in opened.snapshot ? "pages" : "whole" } as const : {}),
    ...(preloadFailed.length ? { preload_failed: preloadFailed } : {}),
    phases,
  });
  // Work that need not delay `ready`: the recycle's checks compiled, and the start's garbage (a
  // third of the JavaScript heap, which would otherwise stay for the sandbox's life) collected.
  whenQuiet(() => {
    // Only before any program: the check runs on built-ins a program could have replaced since.
    if (!state.ranAny) state.clean?.compileChecks();
    collectGarbage();
  });
}

// The memory snapshot as this worker gives it to Pyodide (instance.ts, Snapshot): its header alone
// when the process's first worker said where its pages are and the file is the one it read; else
// read whole, and `found` is told where its pages are.
function openSnapshot(
  path: string,
  pages: SnapshotPages | undefined,
  found: (pages: SnapshotPages) => void,
): { snapshot: Snapshot; close: () => void } {
  const file = openSync(path);
  try {
    const info = file.statSync();
    // Its birth time, which marking the file used (cache_files.py) leaves alone; else its change time.
    const identity = `${info.dev}:${info.ino}:${info.size}:${(info.birthtime ?? info.ctime)?.getTime()}`;
    if (pages?.identity === identity) {
      const read = (into: Uint8Array, at: number) => readAt(file, into, at);
      return { snapshot: { bytes: pages.header.slice(), pages, read }, close: () => file.close() };
    }
    const bytes = new Uint8Array(info.size);
    readAt(file, bytes, 0);
    file.close();
    return { snapshot: { bytes, restored: (runs) => found({ identity, ...runs }) }, close: () => {} };
  } catch (error) {
    file.close();
    throw error;
  }
}

function readAt(file: Deno.FsFile, into: Uint8Array, position: number): void {
  file.seekSync(position, Deno.SeekMode.Start);
  for (let done = 0; done < into.length;) {
    const read = file.readSync(into.subarray(done));
    if (read === null) throw new Error("the memory snapshot file ended early");
    done += read;
  }
}

// Packages loaded and imported before the clean point: every caller's `import` finds them done,
// and recycling, checkpoints and restores hold them by construction. What failed, with why.
async function preload(names: string[]): Promise<string[]> {
  const failed: string[] = [];
  for (const name of names) {
    const module = normalize(name);
    const problems = await loadImports(`import ${module}`);
    try {
      state.pyodide.pyimport(module).destroy();
    } catch (error) {
      failed.push(`${name}: ${scrub([...problems, String(error).trim().split("\n").pop()].join("; "))}`);
    }
  }
  state.cleanWheels = new Set(state.loadedWheels);
  return failed;
}

// Deno finishes setting up message ports when the first port message arrives (it redefines
// queueMicrotask then): one round trip before the clean point, or every used sandbox's realm
// would differ from its clean walk and none would ever be recycled.
function settleMessagePorts(): Promise<void> {
  return new Promise((resolve) => {
    const { port1, port2 } = new MessageChannel();
    port1.onmessage = () => {
      port1.close();
      resolve();
    };
    port2.postMessage(null);
  });
}

type CStack = { stackSave(): number; stackRestore(at: number): void };

function runtime(): CStack {
  return (state.pyodide as unknown as { _module: CStack })._module;
}

// The run ends here, its worker to be replaced (the runner's renew): the kill flag's error reached
// it, or the kill found it parked.
function postKilled(id: number): void {
  postRunnerMessage(id, { type: "crashed", id, message: new Killed().message }, true);
}

async function run(message: RunMessage): Promise<void> {
  const id = message.id;
  state.currentId = id;
  state.exitStatus = null;
  // A sandbox fresh from its clean point holds the generators every other one starts with.
  if (!state.ranSinceClean) state.reseed();
  state.ranSinceClean = state.ranAny = true;
  let outcome: unknown;
  let problems: string[] = [];
  let unwound: Unwinding | null = null;
  try {
    // From here on the run awaits (loading packages, then its program's awaits): an earlier run's
    // task may run meanwhile, and an interrupt cancels this run's tasks (cancelOnInterrupt).
    state.noteTasks();
    state.pyodide.setInterruptBuffer(state.signals as unknown as Uint8Array);
    state.awaiting = true;
    cancelOnInterrupt();
    problems = await loadImports(message.code);
    // Called as a promising entrypoint, so the program may block on a coroutine through stack
    // switching: asyncio.run and loop.run_until_complete work as they do on CPython.
    // A promising call leaves the C stack 16 bytes lower than it found it (Pyodide 0.29.3): put
    // back, or each run would shrink the stack, and no checkpoint would see Python at rest.
    const stack = runtime().stackSave();
    try {
      outcome = await state.runJson.callPromising!(state.interpreter, message.code, message.tools);
      if (typeof outcome !== "string") {
        // A program with top-level `await` comes back as an awaitable.
        const awaitable = outcome as Promise<string> & { destroy?: () => void };
        outcome = await awaitable;
        awaitable.destroy?.();
      }
    } finally {
      runtime().stackRestore(stack);
    }
  } catch (error) {
    const cause = (error as { cause?: unknown }).cause;
    if (error instanceof Unwinding || cause instanceof Unwinding) {
      unwound = error instanceof Unwinding ? error : cause as Unwinding;
    } else if ((error as { type?: unknown }).type === "KeyboardInterrupt") {
      // The deadline passed before the program began, so the interrupt landed in the runtime's
      // own code: the run was interrupted, as the CPython runners report it.
      outcome = state.interruptedOutcome;
    } else {
      // The guest runtime catches every other Python exception: this is Pyodide itself failing.
      postRunnerMessage(id, { type: "crashed", id, message: String(error) }, true);
      return;
    }
  } finally {
    state.awaiting = false;
    state.pyodide.setInterruptBuffer(undefined as unknown as Uint8Array);
    state.currentId = null;
  }
  if (state.exitStatus !== null) return endUnwound(id, `Exit: Program terminated with exit(${state.exitStatus})`);
  if (unwound !== null) return endUnwound(id, unwound.message);
  if (problems.length) {
    const parsed = JSON.parse(outcome as string);
    parsed.notes = [...problems, ...(parsed.notes ?? [])];
    outcome = JSON.stringify(parsed);
  }
  post(id, `{"type":"result","id":${id},"outcome":${outcome as string}}`);
}

// The program was ended where it stood (instance.ts's Unwinding): the interpreter is mid-call, so
// the sandbox goes back to its clean point in place, or, if it cannot, its worker is replaced.
function endUnwound(id: number, message: string): void {
  // Left set by the promising call that the unwinding cut short (Pyodide's callPyObjectKwargsPromising).
  (runtime() as unknown as { validSuspender: { value: boolean } }).validSuspender.value = false;
  const outcome = backToClean();
  if (outcome.clean) {
    answer({ crashed: id, message, dataLost: outcome.dataLost } satisfies WorkerRecycledCrash);
  } else {
    postRunnerMessage(id, { type: "crashed", id, message }, true);
  }
}

// `import pyodide_js` gives only what Pyodide's own Python modules use, not the whole API: the
// runtime's internals (the memory, the file system) stay out of programs' reach.
function limitPyodideModule(forgetModules: PyCallable): object {
  const api = (state.pyodide as unknown as { _api: Record<string, unknown> })._api;
  const facade = {
    _api: { scheduleCallback: api.scheduleCallback, config: api.config, abortSignalAny: api.abortSignalAny },
    loadedPackages: state.pyodide.loadedPackages,
    version: state.pyodide.version,
  };
  state.pyodide.unregisterJsModule("pyodide_js");
  state.pyodide.registerJsModule("pyodide_js", facade);
  forgetModules("pyodide_js");
  return facade;
}

// Recycling (recycle.ts): back to the clean state, in idle time between two callers.
function backToClean(): RecycleOutcome {
  state.warmUpLeft = 0;
  const outcome = state.clean === null
    ? { clean: false as const, reason: "it has no clean state" }
    : state.clean.recycle();
  if (outcome.clean) {
    state.ranSinceClean = false;
    // Their files and libraries are gone with the rest; the preloaded ones stay.
    state.loadedWheels.clear();
    for (const name of state.cleanWheels) state.loadedWheels.add(name);
  }
  return outcome;
}

function recycle(message: WorkerRecycle): void {
  const started = performance.now();
  const outcome = backToClean();
  const reply: WorkerRecycled = {
    type: "recycled",
    id: message.id,
    clean: outcome.clean,
    reason: outcome.clean ? null : outcome.reason,
    ms: Math.round((performance.now() - started) * 100) / 100,
    dataLost: outcome.clean && outcome.dataLost,
  };
  answer({ json: stringify(reply) });
}

// Checkpoints (checkpoint.ts): the session's state as data, in idle time between runs.

function checkpoint(message: WorkerCheckpoint): void {
  const started = performance.now();
  const holders = (): string[] => {
    const names = state.jsHolders(state.interpreter) as { toJs(): string[]; destroy(): void };
    try {
      return names.toJs();
    } finally {
      names.destroy();
    }
  };
  let outcome: ReturnType<typeof takeCheckpoint>;
  try {
    outcome = state.clean === null
      ? { saved: false, reason: "the sandbox has no clean state" }
      : takeCheckpoint(state.clean, holders);
  } catch (error) {
    outcome = { saved: false, reason: `the checkpoint failed: ${scrub(String(error))}` }; // answered, not left waiting
  }
  const reply: CheckpointedMessage = {
    type: "checkpointed",
    id: message.id,
    saved: outcome.saved,
    reason: outcome.saved ? null : outcome.reason,
    lost: outcome.saved ? outcome.lost : [],
    bytes: outcome.saved ? outcome.blob.length : 0,
    ms: Math.round((performance.now() - started) * 100) / 100,
  };
  const sent: ControlAnswer = { json: stringify(reply) };
  if (outcome.saved) sent.blob = outcome.blob;
  answer(sent, outcome.saved ? [outcome.blob.buffer as ArrayBuffer] : []);
}

function restore(message: WorkerRestore): void {
  const started = performance.now();
  state.warmUpLeft = 0;
  let reason: string | null;
  if (state.clean === null) reason = "the sandbox has no clean state";
  else if (state.ranSinceClean) reason = "the sandbox has run a program since it was clean";
  else {
    try {
      reason = restoreCheckpoint(state.clean, message.blob as Uint8Array);
    } catch (error) {
      // Answered at once (the host closes a sandbox whose restore failed), not left to time out.
      reason = `the checkpoint could not be restored: ${scrub(String(error))}`;
    }
  }
  if (reason === null) state.ranSinceClean = state.ranAny = true;
  const reply: RestoredMessage = {
    type: "restored",
    id: message.id,
    restored: reason === null,
    reason,
    ms: Math.round((performance.now() - started) * 100) / 100,
  };
  answer({ json: stringify(reply) });
}

// JIT warm-up: V8 compiles Pyodide's hot WebAssembly functions only after they have run many
// times, so a new sandbox runs Python several times slower for its first few hundred calls.
// Asked to, a sandbox spends idle time between calls running a sample program, one round per
// task, and only once no message has come for a while: a caller sending calls back to back
// never waits behind it.

function warmUpStep(): void {
  if (state.warmUpLeft <= 0) return;
  // The interrupt buffer is detached between runs: one that arrives now is for the run queued
  // behind this round.
  try {
    state.jitWarmUp(1);
    state.warmUpLeft -= 1;
  } catch {
    state.warmUpLeft = 0; // a sandbox whose warm-up fails still serves calls, only slower
    return whenQuiet(collectGarbage);
  }
  if (state.warmUpLeft > 0) {
    hostSetTimeout(() => whenQuiet(warmUpStep), 0);
    return;
  }
  // Every round ran (a recycle or restore cuts them short): no other worker need warm up.
  answer({ warmedUp: true } satisfies WorkerWarmedUp);
  whenQuiet(collectGarbage);
}

// Runs `task` once no message has come for JIT_WARM_UP_IDLE_MS and none is waiting.
// While a message is handled, it looks again a whole quiet time later (a long run is not polled).
function whenQuiet(task: () => void): void {
  const quiet = now() - state.lastMessageAt;
  if (state.waiting > 0) hostSetTimeout(() => whenQuiet(task), JIT_WARM_UP_IDLE_MS);
  else if (quiet < JIT_WARM_UP_IDLE_MS) hostSetTimeout(() => whenQuiet(task), JIT_WARM_UP_IDLE_MS - quiet + 1);
  else task();
}

// A kill that reaches this worker's event loop finds its program parked (awaiting): no signal check
// will come, so the run ends here, and the runner replaces this worker.
function kill(id: number): void {
  if (state.currentId === id) postKilled(id);
}

// init, data and run are handled one after another, in order; a tool_result must not wait
// behind the run that is waiting for it, so it is handled at once.

type Queued = WorkerMessage | Exclude<ControlRequest, { type: "kill" | "tool_result" }>;

async function handle(message: Queued): Promise<void> {
  switch (message.type) {
    case "init":
      try {
        await init(message);
      } catch (error) {
        postRunnerMessage(null, { type: "fatal", message: `Pyodide failed to load: ${error}` });
      }
      break;
    case "ahead":
      // Its modules' garbage first: the last-resort collection would drop the script's code too.
      collectGarbage();
      try {
        state.ahead = await runScript(message);
      } catch (error) {
        const failed = state.ahead = error instanceof Error ? error : new Error(String(error));
        // Uncaught, it reaches the runner as this worker's error: a spare no sandbox took is dropped.
        hostSetTimeout(() => {
          throw failed;
        }, 0);
      }
      break;
    case "data":
      applyData(message);
      break;
    case "run":
      await run(message);
      break;
    case "recycle":
      recycle(message);
      break;
    case "checkpoint":
      checkpoint(message);
      break;
    case "restore":
      restore(message);
      break;
    case "jit_warm_up":
      if (state.warmUpLeft <= 0) whenQuiet(warmUpStep);
      state.warmUpLeft = message.rounds;
      break;
  }
}

function enqueue(message: Queued): void {
  state.waiting++;
  state.queue = state.queue.then(() => handle(message)).catch((error) => {
    postRunnerMessage(null, { type: "progress", line: `sandbox set-up failed: ${error}` });
  }).finally(() => {
    state.waiting--;
    state.lastMessageAt = now(); // quiet time counts from the end of the last run
  });
}

// The worker's own channel carries a script to run ahead and the init, and nothing after: sandboxed
// code can post and dispatch to it, or call this handler, so what comes later is a program's.
self.onmessage = (event: MessageEvent<WorkerMessage>) => {
  if (state.control !== undefined) return;
  const message = event.data;
  if (message.type === "ahead") return enqueue(message);
  if (message.type !== "init") return;
  // Taken before any sandboxed code runs, and kept only here (see ControlRequest in protocol.py).
  state.control = message.control;
  state.control.onmessage = (request: MessageEvent<ControlRequest>) => {
    const data = request.data;
    if (data.type === "kill") {
      kill(data.id);
    } else if (data.type === "tool_result") {
      // Before init, it answers a call of the worker this one replaced: nobody is waiting for it.
      if (state.deliver !== undefined) state.deliver(state.channel, data.call, data.reply);
    } else {
      enqueue(data);
    }
  };
  enqueue(message);
};
