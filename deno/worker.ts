// Sandbox side: hosts Pyodide and runs programs through the guest runtime
// (mcp_sandbox/backends/guest_runtime.py), which returns each outcome as a JSON string.
// The exact Pyodide version is pinned once, in deno.json.
import { loadPyodide, type PyodideInterface } from "pyodide";
import { HOME, PYODIDE_OPTIONS } from "./options.ts";

type PyCallable = ((...args: unknown[]) => unknown) & { destroy?: () => void };
type RunMessage = {
  id: number;
  code: string;
  max_output_chars: number;
  output: { max_files: number; max_bytes: number; max_figures: number };
  tools?: string;
};

let pyodide: PyodideInterface;
let runProgram: PyCallable;
let warmUp: PyCallable;
let interruptBuffer: Uint8Array;
let currentId: number | null = null;
const postToMain = self.postMessage.bind(self);

function post(id: number | null, json: string, exiting = false): void {
  postToMain({ id, json, exiting });
}

// Bridged tool calls (the guest runtime's ToolTransport). A blocking call sleeps in
// Atomics.wait until the main thread has the reply (see runner.ts); an async one is a Promise
// settled by a tool_result message, so several can be in flight under asyncio.gather.
let syncState: Int32Array;
let syncData: SharedArrayBuffer;
let callNumber = 0;
const asyncCalls = new Map<number, (reply: string) => void>();
const decoder = new TextDecoder();

function requestTool(call: number, server: string, tool: string, args: string, sync: boolean): void {
  const json = JSON.stringify({ type: "tool_call", call, server, tool, arguments: args });
  postToMain({ id: null, json, exiting: false, ...(sync ? { syncCall: call } : {}) });
}

const transport = {
  progress(line: string): void {
    postToMain({ id: null, json: JSON.stringify({ type: "progress", line }), exiting: false });
  },
  call_sync(server: string, tool: string, args: string): string {
    const call = ++callNumber;
    Atomics.store(syncState, 0, 0);
    requestTool(call, server, tool, args, true);
    Atomics.wait(syncState, 0, 0);
    if (Atomics.load(syncState, 0) !== 1) {
      // The guest raises KeyboardInterrupt itself; a buffer left set would raise a second one
      // later, inside the runtime's own reporting.
      interruptBuffer[0] = 0;
      return '{"ok":false,"interrupted":true}';
    }
    const length = syncState[1];
    // TextDecoder refuses views of shared memory, so the reply is copied out first.
    const bytes = new Uint8Array(length);
    bytes.set(new Uint8Array(syncData, 0, length));
    return decoder.decode(bytes);
  },
  call_async(server: string, tool: string, args: string): Promise<string> {
    const call = ++callNumber;
    return new Promise((resolve) => {
      asyncCalls.set(call, resolve);
      requestTool(call, server, tool, args, false);
    });
  },
};

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
      post(currentId, JSON.stringify({ type: "crashed", id: currentId, message }), true);
      return original(...args);
    },
  });
}
announceExit(Deno, "exit");
announceExit(self, "close");

// The session's working directory: data/ is a read-only copy of the host's data folder, sent
// by the runner's main thread (this worker may not read the folder); output/ is where the
// program leaves files for the host.
const GUEST_DATA = `${HOME}/data`;

function setFolderModes(folder: string, mode: number): void {
  const FS = pyodide.FS;
  FS.chmod(folder, mode);
  for (const name of FS.readdir(folder)) {
    if (name === "." || name === "..") continue;
    const path = `${folder}/${name}`;
    if (FS.isDir(FS.stat(path).mode)) setFolderModes(path, mode);
  }
}

function applyData(files: { path: string; bytes: Uint8Array }[], removed: string[]): void {
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
}

// Packages: imports of Pyodide's own packages (numpy, pandas, ...) and of wheels placed in the
// packages folder load from that folder on demand; the sandbox has no network to fetch them.
let packagesDir: string | null = null;
let findImports: PyCallable | null = null;
let importedModules: { has(name: string): boolean } | null = null; // sys.modules
const loadedWheels = new Set<string>();

function normalize(name: string): string {
  return name.toLowerCase().replace(/[-_.]+/g, "_");
}

function wheelsInFolder(): Map<string, string> {
  const wheels = new Map<string, string>();
  for (const entry of Deno.readDirSync(packagesDir!)) {
    if (entry.isFile && entry.name.endsWith(".whl")) {
      wheels.set(normalize(entry.name.split("-")[0]), `${packagesDir}/${entry.name}`);
    }
  }
  return wheels;
}

async function loadImports(code: string): Promise<string[]> {
  // Only an import statement can need a package: most programs skip the parse altogether.
  if (packagesDir === null || !code.includes("import")) return [];
  const problems: string[] = [];
  const quiet = { messageCallback: () => {}, errorCallback: (text: string) => problems.push(text) };
  try {
    const found = findImports!(code) as { toJs(): string[]; destroy(): void };
    const names = found.toJs();
    found.destroy();
    // A module the session has imported already needs no package.
    if (names.every((name) => importedModules!.has(name.split(".")[0]))) return [];
    await pyodide.loadPackagesFromImports(code, quiet);
    const wanted = names.map((name) => normalize(name.split(".")[0])).filter((n) => !loadedWheels.has(n));
    if (wanted.length) {
      const wheels = wheelsInFolder();
      for (const name of wanted) {
        const wheel = wheels.get(name);
        if (wheel === undefined) continue;
        await pyodide.loadPackage(wheel, quiet);
        loadedWheels.add(name);
      }
    }
  } catch (error) {
    problems.push(String(error));
  }
  return problems.map((text) =>
    `package loading: ${text} (fill the packages folder with \`mcp-sandbox warmup --packages NAME\`)`
  );
}

async function init(
  guestRuntime: string,
  buffer: Uint8Array,
  state: Int32Array,
  data: SharedArrayBuffer,
  packages: string | undefined,
  snapshot: string | undefined,
): Promise<void> {
  const started = performance.now();
  const snapshotBytes = snapshot ? Deno.readFileSync(snapshot) : undefined;
  pyodide = await loadPyodide({
    ...PYODIDE_OPTIONS,
    ...(packages ? { packageBaseUrl: `${packages}/` } : {}),
    // Restoring the interpreter's memory skips most of the start-up (see deno/snapshot.ts).
    ...(snapshotBytes ? { _loadSnapshot: snapshotBytes } : {}),
  });
  // Pyodide keeps a reference to its options: detaching the copied-in snapshot frees ~20 MB.
  snapshotBytes?.buffer.transfer(0);
  if (packages) {
    packagesDir = packages;
    findImports = pyodide.pyimport("pyodide.code").find_imports;
    importedModules = pyodide.pyimport("sys").modules;
  }
  pyodide.FS.mkdirTree(`${HOME}/output`);
  pyodide.FS.mkdirTree(GUEST_DATA);
  pyodide.FS.chdir(HOME);
  interruptBuffer = buffer;
  pyodide.setInterruptBuffer(interruptBuffer);
  const namespace = pyodide.globals.get("dict")();
  pyodide.runPython(guestRuntime, { globals: namespace, filename: "<guest_runtime>" });
  runProgram = namespace.get("run_program_json");
  warmUp = namespace.get("warm_up");
  syncState = state;
  syncData = data;
  const installTransport = namespace.get("install_transport");
  installTransport(transport, true); // the host cannot read this sandbox's files: send them inline
  installTransport.destroy();
  namespace.destroy();
  // The first runs compile much of the runtime lazily (the first takes ~20 ms): do three before
  // `ready`, in a throwaway session, so a sandbox's first calls from the pool do not pay for it.
  warmUp(3, WARM_UP_OUTPUT);
  post(null, JSON.stringify({
    type: "ready",
    pyodide_version: pyodide.version,
    load_ms: Math.round(performance.now() - started),
  }));
}

async function run(message: RunMessage): Promise<void> {
  const id = message.id;
  interruptBuffer[0] = 0;
  currentId = id;
  let outcome: unknown;
  let problems: string[] = [];
  try {
    problems = await loadImports(message.code);
    outcome = runProgram(message.code, message.max_output_chars, message.tools, message.output);
    if (typeof outcome !== "string") {
      // A program with top-level `await` comes back as an awaitable.
      const awaitable = outcome as Promise<string> & { destroy?: () => void };
      outcome = await awaitable;
      awaitable.destroy?.();
    }
  } catch (error) {
    // The guest runtime catches every Python exception, so this is Pyodide itself failing.
    post(id, JSON.stringify({ type: "crashed", id, message: String(error) }), true);
    return;
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

// JIT warm-up: V8 compiles Pyodide's hot WebAssembly functions only after they have run many
// times, so a new sandbox runs Python several times slower for its first few hundred calls.
// Asked to, a sandbox spends idle time between calls running a sample program, one round per
// task, and only once no message has come for a while: a caller sending calls back to back
// never waits behind it.
const WARM_UP_IDLE_MS = 250;
const WARM_UP_OUTPUT = { max_files: 0, max_bytes: 0, max_figures: 0 };
let warmUpLeft = 0;
let waiting = 0;
let lastMessageAt = 0;

function warmUpStep(): void {
  if (warmUpLeft <= 0) return;
  const quiet = performance.now() - lastMessageAt;
  if (waiting > 0 || quiet < WARM_UP_IDLE_MS) {
    setTimeout(warmUpStep, WARM_UP_IDLE_MS - Math.min(quiet, WARM_UP_IDLE_MS) + 1);
    return;
  }
  try {
    warmUp(1, WARM_UP_OUTPUT);
    warmUpLeft -= 1;
  } catch {
    warmUpLeft = 0; // a sandbox whose warm-up fails still serves calls, only slower
  }
  setTimeout(warmUpStep, 0);
}

// init, data and run are handled one after another, in order; a tool_result must not wait
// behind the run that is waiting for it, so it is handled at once.
let queue: Promise<void> = Promise.resolve();

async function handle(message: { type: string; [key: string]: unknown }): Promise<void> {
  if (message.type === "init") {
    try {
      await init(
        message.guest_runtime as string,
        message.interruptBuffer as Uint8Array,
        message.syncState as Int32Array,
        message.syncData as SharedArrayBuffer,
        message.packagesDir as string | undefined,
        message.snapshot as string | undefined,
      );
    } catch (error) {
      post(null, JSON.stringify({ type: "fatal", message: `Pyodide failed to load: ${error}` }));
    }
  } else if (message.type === "data") {
    applyData(message.files as { path: string; bytes: Uint8Array }[], message.removed as string[]);
  } else if (message.type === "run") {
    await run(message as unknown as RunMessage);
  } else if (message.type === "warm_up") {
    if (warmUpLeft <= 0) setTimeout(warmUpStep, WARM_UP_IDLE_MS);
    warmUpLeft = message.rounds as number;
  }
}

self.onmessage = (event: MessageEvent) => {
  const message = event.data;
  if (message.type === "tool_result") {
    asyncCalls.get(message.call)?.(message.reply);
    asyncCalls.delete(message.call);
    return;
  }
  waiting++;
  queue = queue.then(() => handle(message)).catch((error) => {
    post(null, JSON.stringify({ type: "progress", line: `sandbox set-up failed: ${error}` }));
  }).finally(() => {
    waiting--;
    lastMessageAt = performance.now(); // quiet time counts from the end of the last run
  });
};
