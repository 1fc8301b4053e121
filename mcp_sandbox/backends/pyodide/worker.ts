/// <reference lib="deno.worker" />
// Sandbox side: hosts Pyodide and runs programs through the guest runtime
// (the package mcp_sandbox/guest/), which returns each outcome as JSON text. Messages and
// constants come from protocol.ts; the exact Pyodide version is pinned once, in deno.json.
import { loadPyodide, type PyodideInterface } from "pyodide";
import { HOME, PYODIDE_OPTIONS } from "./options.ts";
import { asTheWorker, CleanState, guardRealm, hostSetTimeout, taint } from "./recycle.ts";
import { restoreCheckpoint, takeCheckpoint } from "./checkpoint.ts";
import { hookInstance, Killed } from "./instance.ts";
import {
  type CheckpointedMessage,
  DATA_DIR,
  GUEST_RUNTIME_MODULE,
  type GuestLimits,
  JIT_WARM_UP_IDLE_MS,
  JIT_WARM_UP_ROUNDS_AT_START,
  OUTPUT_DIR,
  REPLY_INTERRUPTED,
  type RestoredMessage,
  type RunMessage,
  type RunnerMessage,
  type ControlAnswer,
  type ControlRequest,
  INTERRUPT_SIGNAL,
  SIGNAL_INTERRUPT,
  SIGNAL_KILL,
  SYNC_LENGTH,
  SYNC_REPLY_READY,
  SYNC_STATE,
  SYNC_WAITING,
  type WorkerCheckpoint,
  type WorkerData,
  type WorkerInit,
  type WorkerMessage,
  type WorkerModule,
  type WorkerPost,
  type WorkerRecycle,
  type WorkerRecycled,
  type WorkerRestore,
} from "./protocol.ts";

type PyCallable = ((...args: unknown[]) => unknown) & {
  destroy?: () => void;
  callPromising?: (...args: unknown[]) => Promise<unknown>;
};
type PyModule = { [name: string]: PyCallable } & { destroy(): void };

let pyodide: PyodideInterface;
let interpreter: unknown;
let runJson: PyCallable;
let jitWarmUp: PyCallable;
// A module function taking the channel, never `channel.deliver`: Pyodide caches the proxy of a bound
// method in JavaScript, which neither a recycle nor a checkpoint's restore brings back with memory.
let deliver: PyCallable;
let channel: unknown; // the guest's ToolChannel, which each tool_result goes to through `deliver`
// Pyodide's interrupt buffer and the kill flag (SIGNAL_INTERRUPT, SIGNAL_KILL; see protocol.py).
let signals: Int32Array;
let cancelRun: PyCallable;
let noteTasks: PyCallable;
let currentId: number | null = null;
let clean: CleanState | null = null;
// The runner's private channel for recycle, checkpoint and restore (module scope: out of reach).
let control: MessagePort;
// A program ran since the clean point (or the last recycle): a restore needs a clean sandbox.
let ranSinceClean = false;
// Names in the session's globals that hold JavaScript objects (a checkpoint's refusal names them).
let jsHolders: PyCallable;
// What a run reports when its interrupt lands in the runtime's own code (guest.interrupted_json).
let interruptedOutcome: string;
const postToMain = self.postMessage.bind(self);
// The control channel's answers are built and sent with the originals: a program may replace
// JSON.stringify or MessagePort.prototype.postMessage, and must not be able to forge a verdict.
const stringify = JSON.stringify;
const portPost = MessagePort.prototype.postMessage;

function answer(reply: ControlAnswer | WorkerModule, transfer: Transferable[] = []): void {
  portPost.call(control, reply, { transfer });
}

function post(id: number | null, json: string, exiting = false, syncCall?: number): void {
  const message: WorkerPost = { id, json, exiting, ...(syncCall === undefined ? {} : { syncCall }) };
  postToMain(message);
}

function postRunnerMessage(id: number | null, message: RunnerMessage, exiting = false): void {
  post(id, JSON.stringify(message), exiting);
}

// A blocking tool call: post it, then sleep in Atomics.wait until the main thread has the
// reply in shared memory (see runner.ts and protocol.py).
let syncState: Int32Array;
let syncData: SharedArrayBuffer;
const decoder = new TextDecoder();

function blockOnToolCall(call: number, message: string): string {
  if (Atomics.load(signals, SIGNAL_INTERRUPT) !== 0) {
    // Interrupted already (the deadline passed inside C code): the call is never made.
    signals[SIGNAL_INTERRUPT] = 0;
    return REPLY_INTERRUPTED;
  }
  Atomics.store(syncState, SYNC_STATE, SYNC_WAITING);
  post(null, message, false, call);
  Atomics.wait(syncState, SYNC_STATE, SYNC_WAITING);
  if (Atomics.load(syncState, SYNC_STATE) !== SYNC_REPLY_READY) {
    // The guest raises KeyboardInterrupt itself; a buffer left set would raise a second one
    // later, inside the runtime's own reporting.
    signals[SIGNAL_INTERRUPT] = 0;
    return REPLY_INTERRUPTED;
  }
  const length = syncState[SYNC_LENGTH];
  // TextDecoder refuses views of shared memory, so the reply is copied out first.
  const bytes = new Uint8Array(length);
  bytes.set(new Uint8Array(syncData, 0, length));
  return decoder.decode(bytes);
}

// The guest's waits (time.sleep and the rest, guest.install_waits): asleep in Atomics.wait, with no
// CPU, until the deadline or the runner's notify of an interrupt, which raises KeyboardInterrupt
// here. After a kill it returns at once, for the interpreter's next signal check to end the run.
const now = performance.now.bind(performance);

function waitInterruptibly(seconds: number): void {
  const deadline = now() + seconds * 1000;
  for (;;) {
    if (Atomics.load(signals, SIGNAL_KILL) !== 0) return;
    if (Atomics.load(signals, SIGNAL_INTERRUPT) !== 0) {
      pyodide.checkInterrupt();
      return;
    }
    const left = deadline - now();
    if (left <= 0) return;
    Atomics.wait(signals, SIGNAL_INTERRUPT, 0, left);
  }
}

// An interrupt while the program awaits (top-level `await`, or asyncio.run) finds no Python running
// to raise in: its tasks are cancelled instead. One waiter at a time, re-armed after it fires.
const waitAsync = Atomics.waitAsync.bind(Atomics); // before guardRealm flags its use
let awaiting = false;
let watchingInterrupts = false;

function cancelOnInterrupt(): void {
  if (watchingInterrupts) return;
  const waiter = waitAsync(signals, SIGNAL_INTERRUPT, 0);
  const fired = () => {
    watchingInterrupts = false;
    if (!awaiting || Atomics.load(signals, SIGNAL_INTERRUPT) === 0) return;
    // KeyboardInterrupt comes from the cancellation, not from the buffer (which would raise it in
    // cancel_run itself); with nothing to cancel, the buffer keeps it for the next Python code.
    signals[SIGNAL_INTERRUPT] = 0;
    let cancelled = false;
    try {
      cancelled = cancelRun() === true;
    } finally {
      if (!cancelled) Atomics.store(signals, SIGNAL_INTERRUPT, INTERRUPT_SIGNAL);
    }
  };
  watchingInterrupts = true;
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
      postRunnerMessage(currentId, { type: "crashed", id: currentId, message }, true);
      return original(...args);
    },
  });
}
announceExit(Deno, "exit");
announceExit(self, "close");
// Before Pyodide loads: what could leave work behind for a later call is wrapped (recycle.ts).
const readDirSync = Deno.readDirSync;
const readFileSync = Deno.readFileSync;
guardRealm(["execPath"]);

// Sandboxed code learns no host path. Each path this worker knows has a neutral name, which is
// all that error texts, stack traces and Pyodide's own settings show.
const hostPaths: [string, string][] = [];

function scrub(text: string): string {
  for (const [path, name] of hostPaths) text = text.replaceAll(path, name);
  return text;
}

type PathSettings = Record<string, unknown>;
let pyodideSettings: PathSettings;
const realPaths: PathSettings = {};
const neutralPaths: PathSettings = {};

// Pyodide reads its own folder's path from its settings when it loads a package: the real
// paths are there only while this worker loads packages, before any program runs.
async function withRealPaths<T>(load: () => Promise<T>): Promise<T> {
  Object.assign(pyodideSettings, realPaths);
  try {
    return await load();
  } finally {
    Object.assign(pyodideSettings, neutralPaths);
    const loaded = pyodide.loadedPackages as Record<string, string>;
    for (const name of Object.keys(loaded)) loaded[name] = scrub(loaded[name]);
  }
}

function hideHostPaths(known: [string | undefined, string][]): void {
  pyodideSettings = (pyodide as unknown as { _api: { config: PathSettings } })._api.config;
  known.push([pyodideSettings.indexURL as string, "/pyodide"]);
  for (const [path, name] of known) if (path) hostPaths.push([path.replace(/\/+$/, ""), name]);
  hostPaths.sort((a, b) => b[0].length - a[0].length); // the longest path first, when one holds another
  for (const [key, value] of Object.entries(pyodideSettings)) {
    if (typeof value === "string" && scrub(value) !== value) {
      realPaths[key] = value;
      neutralPaths[key] = scrub(value);
    }
  }
  Object.assign(pyodideSettings, neutralPaths);
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
  const FS = pyodide.FS;
  FS.chmod(folder, mode);
  for (const name of FS.readdir(folder)) {
    if (name === "." || name === "..") continue;
    const path = `${folder}/${name}`;
    if (FS.isDir(FS.stat(path).mode)) setFolderModes(path, mode);
  }
}

function applyData({ files, removed }: WorkerData): void {
  const FS = pyodide.FS;
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
  clean?.dataApplied();
}

// Packages: imports of Pyodide's own packages (numpy, pandas, ...) and of wheels placed in the
// packages folder load from that folder on demand; the sandbox has no network to fetch them.
let packagesDir: string | null = null;
let findImports: PyCallable | null = null;
let importedModules: { has(name: string): boolean } | null = null; // sys.modules
const loadedWheels = new Set<string>();
// Those loaded before the clean point: a recycle goes back to them.
let cleanWheels = new Set<string>();

function normalize(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "_");
}

function wheelsInFolder(): Map<string, string> {
  const wheels = new Map<string, string>();
  for (const entry of readDirSync(packagesDir!)) {
    if (entry.isFile && entry.name.endsWith(".whl")) {
      wheels.set(normalize(entry.name.split("-")[0]), `${packagesDir}/${entry.name}`);
    }
  }
  return wheels;
}

// Pyodide reports a package it could not load as two lines: this header, then the error.
const LOAD_FAILED = /^The following error occurred while loading (.+):$/;

async function loadImports(code: string): Promise<string[]> {
  // Only an import statement can need a package: most programs skip the parse altogether.
  if (packagesDir === null || !code.includes("import")) return [];
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
    const found = findImports!(code) as { toJs(): string[]; destroy(): void };
    const names = found.toJs();
    found.destroy();
    // A module the session has imported already needs no package.
    if (names.every((name) => importedModules!.has(name.split(".")[0]))) return [];
    await asTheWorker(() => withRealPaths(() => pyodide.loadPackagesFromImports(code, quiet)));
    // Pyodide's own packages were loaded just above, by its lock file: loading their files again
    // as wheels would only earn a note ("URI mismatch ... already loaded").
    const loaded = new Set(Object.keys(pyodide.loadedPackages).map(normalize));
    const wanted = names.map((name) => normalize(name.split(".")[0]))
      .filter((n) => !loadedWheels.has(n) && !loaded.has(n));
    if (wanted.length) {
      const wheels = wheelsInFolder();
      for (const name of wanted) {
        const wheel = wheels.get(name);
        if (wheel === undefined) continue;
        await asTheWorker(() => withRealPaths(() => pyodide.loadPackage(wheel, quiet)));
        loadedWheels.add(name);
      }
    }
  } catch (error) {
    problems.push(String(error));
  }
  return problems.map((text) => `package loading: ${scrub(text)}`);
}

// Installs the guest's modules (mcp_sandbox.protocol, then the guest runtime) from their source,
// as the CPython worker's load_module does, calling Python's own types.ModuleType, compile and exec.
function loadGuestModules(modules: [string, string][]): void {
  const builtins = pyodide.pyimport("builtins");
  const types = pyodide.pyimport("types");
  const sys = pyodide.pyimport("sys");
  const loaded = sys.modules;
  for (const [name, source] of modules) {
    const module = types.ModuleType(name);
    const namespace = module.__dict__;
    namespace.set("__file__", `<${name}>`);
    loaded.set(name, module);
    const code = builtins.compile(source, `<${name}>`, "exec");
    builtins.exec(code, namespace);
    for (const proxy of [code, namespace, module]) proxy.destroy();
  }
  for (const proxy of [loaded, sys, types, builtins]) proxy.destroy();
}

async function init(message: WorkerInit): Promise<void> {
  const started = performance.now();
  const { packagesDir: packages, snapshot } = message;
  const snapshotBytes = snapshot ? readFileSync(snapshot) : undefined;
  signals = message.signals as Int32Array;
  // Imported here rather than by loadPyodide, so its module factory can be wrapped (instance.ts).
  await import("pyodide/pyodide.asm.js");
  hookInstance({
    maxBytes: message.memoryMaxBytes,
    signals,
    module: message.module as WebAssembly.Module | undefined,
    compiled: (module) => {
      if (!message.module) answer({ module } satisfies WorkerModule);
    },
  });
  pyodide = await loadPyodide({
    ...PYODIDE_OPTIONS,
    ...(packages ? { packageBaseUrl: `${packages}/` } : {}),
    // Restoring the interpreter's memory skips most of the start-up (see snapshot.ts).
    ...(snapshotBytes ? { _loadSnapshot: snapshotBytes } : {}),
  });
  // Pyodide keeps a reference to its options: detaching the copied-in snapshot frees ~20 MB.
  snapshotBytes?.buffer.transfer(0);
  if (packages) {
    packagesDir = packages;
    findImports = pyodide.pyimport("pyodide.code").find_imports;
    importedModules = pyodide.pyimport("sys").modules;
    // Imported now, into the clean point, rather than by every recycled sandbox that installs a
    // package: its checkpoint would carry them too (what it imports of the standard library is
    // in the memory snapshot already, snapshot.ts).
    pyodide.pyimport("pyodide._package_loader");
  }
  pyodide.FS.mkdirTree(`${HOME}/${OUTPUT_DIR}`);
  pyodide.FS.mkdirTree(GUEST_DATA);
  pyodide.FS.chdir(HOME);
  pyodide.setInterruptBuffer(signals as unknown as Uint8Array);
  // The runner's stdin carries the host's messages: neither Pyodide's stdin nor Deno's reads it,
  // nor Deno's internals (their `core.readSync(0, ...)` reads any open resource).
  pyodide.setStdin({ error: true });
  const refuse = (what: string) => ({
    configurable: false,
    get() {
      throw new Deno.errors.NotCapable(what);
    },
  });
  Object.defineProperty(Deno, "stdin", refuse("the sandbox has no stdin"));
  Object.defineProperty(Deno, (Deno as unknown as { internal: symbol }).internal, refuse("Deno's internals are not the sandbox's"));
  syncState = message.syncState as Int32Array;
  syncData = message.syncData as SharedArrayBuffer;
  loadGuestModules(message.guest_modules);
  const sys = pyodide.pyimport("sys");
  // Loaded under its dotted name without its parent packages, so it is found in sys.modules.
  const guest = sys.modules.get(GUEST_RUNTIME_MODULE) as PyModule;
  const sendToHost = (json: string) => post(null, json);
  channel = guest.ToolChannel(sendToHost, blockOnToolCall);
  deliver = guest.deliver;
  const limits = pyodide.toPy(message.limits as GuestLimits);
  // The host cannot read this sandbox's files: output files travel inline.
  interpreter = guest.Interpreter(limits, channel, true);
  limits.destroy();
  runJson = guest.run_json;
  cancelRun = guest.cancel_run;
  noteTasks = guest.note_tasks;
  guest.install_waits(waitInterruptibly);
  jitWarmUp = guest.jit_warm_up; // borrowed from the module's proxy, which therefore stays
  // The first runs compile much of the runtime lazily (the first takes ~20 ms): do a few before
  // `ready`, in a throwaway interpreter, so a sandbox's first calls from the pool do not pay for it.
  // Every sandbox runs them, a replacement worker too: a checkpoint needs the same clean memory.
  jitWarmUp(JIT_WARM_UP_ROUNDS_AT_START);
  hideHostPaths([
    [packages, "/packages"],
    [snapshot, "/snapshot"],
    [new URL(".", import.meta.url).pathname, "/runner"],
    [Deno.execPath(), "deno"],
  ]);
  jsHolders = guest.js_holders;
  interruptedOutcome = guest.interrupted_json() as string;
  const facade = limitPyodideModule(guest.forget_modules);
  // A program that reaches past what a recycle checks (ctypes, gc, tracing) taints the sandbox.
  guest.report_reaching_past((event: string) => taint(`it used ${event}`));
  const preloadFailed = await preload(message.preload ?? []);
  await settleMessagePorts();
  clean = new CleanState(pyodide, GUEST_DATA, [facade]);
  postRunnerMessage(null, {
    type: "ready",
    python: sys.version.split(" ")[0],
    pyodide: pyodide.version,
    load_ms: Math.round(performance.now() - started),
    ...(preloadFailed.length ? { preload_failed: preloadFailed } : {}),
  });
}

// Packages loaded and imported before the clean point: every caller's `import` finds them done,
// and recycling, checkpoints and restores hold them by construction. What failed, with why.
async function preload(names: string[]): Promise<string[]> {
  const failed: string[] = [];
  for (const name of names) {
    const module = normalize(name);
    const problems = await loadImports(`import ${module}`);
    try {
      pyodide.pyimport(module).destroy();
    } catch (error) {
      failed.push(`${name}: ${scrub([...problems, String(error).trim().split("\n").pop()].join("; "))}`);
    }
  }
  cleanWheels = new Set(loadedWheels);
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
  return (pyodide as unknown as { _module: CStack })._module;
}

// The run ends here, its worker to be replaced (the runner's renew): the kill flag's error reached
// it, or the kill found it parked.
function postKilled(id: number): void {
  postRunnerMessage(id, { type: "crashed", id, message: new Killed().message }, true);
}

async function run(message: RunMessage): Promise<void> {
  const id = message.id;
  currentId = id;
  ranSinceClean = true;
  let outcome: unknown;
  let problems: string[] = [];
  try {
    problems = await loadImports(message.code);
    // Called as a promising entrypoint, so the program may block on a coroutine through stack
    // switching: asyncio.run and loop.run_until_complete work as they do on CPython. Between its
    // awaits the program is parked, and an interrupt cancels its tasks (cancelOnInterrupt).
    noteTasks();
    awaiting = true;
    cancelOnInterrupt();
    // A promising call leaves the C stack 16 bytes lower than it found it (Pyodide 0.29.3): put
    // back, or each run would shrink the stack, and no checkpoint would see Python at rest.
    const stack = runtime().stackSave();
    try {
      outcome = await runJson.callPromising!(interpreter, message.code, message.tools);
      if (typeof outcome !== "string") {
        // A program with top-level `await` comes back as an awaitable.
        const awaitable = outcome as Promise<string> & { destroy?: () => void };
        outcome = await awaitable;
        awaitable.destroy?.();
      }
    } finally {
      awaiting = false;
      runtime().stackRestore(stack);
    }
  } catch (error) {
    if (error instanceof Killed || (error as { cause?: unknown }).cause instanceof Killed) {
      postKilled(id);
      return;
    }
    if ((error as { type?: unknown }).type === "KeyboardInterrupt") {
      // The deadline passed before the program began, so the interrupt landed in the runtime's
      // own code: the run was interrupted, as the CPython runners report it.
      outcome = interruptedOutcome;
    } else {
      // The guest runtime catches every other Python exception: this is Pyodide itself failing.
      postRunnerMessage(id, { type: "crashed", id, message: String(error) }, true);
      return;
    }
  } finally {
    currentId = null;
  }
  if (problems.length) {
    const parsed = JSON.parse(outcome as string);
    parsed.notes = [...problems, ...(parsed.notes ?? [])];
    outcome = JSON.stringify(parsed);
  }
  post(id, `{"type":"result","id":${id},"outcome":${outcome as string}}`);
}

// `import pyodide_js` gives only what Pyodide's own Python modules use, not the whole API: the
// runtime's internals (the memory, the file system) stay out of programs' reach.
function limitPyodideModule(forgetModules: PyCallable): object {
  const api = (pyodide as unknown as { _api: Record<string, unknown> })._api;
  const facade = {
    _api: { scheduleCallback: api.scheduleCallback, config: api.config, abortSignalAny: api.abortSignalAny },
    loadedPackages: pyodide.loadedPackages,
    version: pyodide.version,
  };
  pyodide.unregisterJsModule("pyodide_js");
  pyodide.registerJsModule("pyodide_js", facade);
  forgetModules("pyodide_js");
  return facade;
}

// Recycling (recycle.ts): back to the clean state, in idle time between two callers.
function recycle(message: WorkerRecycle): void {
  const started = performance.now();
  warmUpLeft = 0;
  const outcome = clean === null ? { clean: false as const, reason: "it has no clean state" } : clean.recycle();
  const reply: WorkerRecycled = {
    type: "recycled",
    id: message.id,
    clean: outcome.clean,
    reason: outcome.clean ? null : outcome.reason,
    ms: Math.round((performance.now() - started) * 100) / 100,
    dataLost: outcome.clean && outcome.dataLost,
  };
  if (outcome.clean) {
    ranSinceClean = false;
    // Their files and libraries are gone with the rest; the preloaded ones stay.
    loadedWheels.clear();
    for (const name of cleanWheels) loadedWheels.add(name);
  }
  answer({ json: stringify(reply) });
}

// Checkpoints (checkpoint.ts): the session's state as data, in idle time between runs.

function checkpoint(message: WorkerCheckpoint): void {
  const started = performance.now();
  const holders = (): string[] => {
    const names = jsHolders(interpreter) as { toJs(): string[]; destroy(): void };
    try {
      return names.toJs();
    } finally {
      names.destroy();
    }
  };
  let outcome: ReturnType<typeof takeCheckpoint>;
  try {
    outcome = clean === null ? { saved: false, reason: "the sandbox has no clean state" } : takeCheckpoint(clean, holders);
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
  warmUpLeft = 0;
  let reason: string | null;
  if (clean === null) reason = "the sandbox has no clean state";
  else if (ranSinceClean) reason = "the sandbox has run a program since it was clean";
  else {
    try {
      reason = restoreCheckpoint(clean, message.blob as Uint8Array);
    } catch (error) {
      // Answered at once (the host closes a sandbox whose restore failed), not left to time out.
      reason = `the checkpoint could not be restored: ${scrub(String(error))}`;
    }
  }
  if (reason === null) ranSinceClean = true;
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
let warmUpLeft = 0;
let waiting = 0;
let lastMessageAt = 0;

function warmUpStep(): void {
  if (warmUpLeft <= 0) return;
  const quiet = performance.now() - lastMessageAt;
  if (waiting > 0 || quiet < JIT_WARM_UP_IDLE_MS) {
    hostSetTimeout(warmUpStep, JIT_WARM_UP_IDLE_MS - Math.min(quiet, JIT_WARM_UP_IDLE_MS) + 1);
    return;
  }
  // Detached: an interrupt that arrives now is for the run queued behind this round.
  pyodide.setInterruptBuffer(undefined as unknown as Uint8Array);
  try {
    jitWarmUp(1);
    warmUpLeft -= 1;
  } catch {
    warmUpLeft = 0; // a sandbox whose warm-up fails still serves calls, only slower
  } finally {
    pyodide.setInterruptBuffer(signals as unknown as Uint8Array);
  }
  hostSetTimeout(warmUpStep, 0);
}

// A kill that reaches this worker's event loop finds its program parked (awaiting): no signal check
// will come, so the run ends here, and the runner replaces this worker.
function kill(id: number): void {
  if (currentId === id) postKilled(id);
}

// init, data and run are handled one after another, in order; a tool_result must not wait
// behind the run that is waiting for it, so it is handled at once.
let queue: Promise<void> = Promise.resolve();

async function handle(message: Exclude<WorkerMessage, { type: "tool_result" }> | ControlRequest): Promise<void> {
  switch (message.type) {
    case "init":
      try {
        await init(message);
      } catch (error) {
        postRunnerMessage(null, { type: "fatal", message: `Pyodide failed to load: ${error}` });
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
      if (warmUpLeft <= 0) hostSetTimeout(warmUpStep, JIT_WARM_UP_IDLE_MS);
      warmUpLeft = message.rounds;
      break;
  }
}

function enqueue(message: Exclude<WorkerMessage, { type: "tool_result" }> | ControlRequest): void {
  waiting++;
  queue = queue.then(() => handle(message)).catch((error) => {
    postRunnerMessage(null, { type: "progress", line: `sandbox set-up failed: ${error}` });
  }).finally(() => {
    waiting--;
    lastMessageAt = performance.now(); // quiet time counts from the end of the last run
  });
}

self.onmessage = (event: MessageEvent<WorkerMessage>) => {
  const message = event.data;
  if (message.type === "tool_result") {
    // Before init, it answers a call of the worker this one replaced: nobody is waiting for it.
    if (deliver !== undefined) deliver(channel, message.call, message.reply);
  } else if (message.type === "init") {
    // Taken before any sandboxed code runs, and kept only here (see ControlRequest in protocol.py).
    control = message.control;
    control.onmessage = (request: MessageEvent<ControlRequest>) => {
      if (request.data.type === "kill") kill(request.data.id);
      else enqueue(request.data);
    };
    enqueue(message);
  } else {
    enqueue(message);
  }
};
