// Host-facing side of the sandbox: owns stdin/stdout and one Pyodide Worker.
// Every message and constant comes from protocol.ts, generated from mcp_sandbox/protocol.py.
//
// The main thread never runs sandboxed code, so it stays free to read an `interrupt`
// while the worker is busy, and it alone knows the session token that marks genuine
// lines on stdout: code in the worker can write to stdout, but cannot forge a token.
import {
  type CheckpointedMessage,
  type ControlAnswer,
  type ControlRequest,
  type CrashedMessage,
  EXIT_SANDBOX_GONE,
  type HostMessage,
  type InitMessage,
  INTERRUPT_SIGNAL,
  MAX_TOOL_REPLY_CHARS,
  PASSING_KINDS,
  type RestoredMessage,
  type RunnerMessage,
  SIGNAL_INTERRUPT,
  SIGNAL_KILL,
  SYNC_DATA_INITIAL_BYTES,
  SYNC_INTERRUPTED,
  SYNC_LENGTH,
  SYNC_REPLY_MAX_BYTES,
  SYNC_REPLY_READY,
  SYNC_STATE,
  type WorkerData,
  type WorkerInit,
  type WorkerMessage,
  type WorkerModule,
  type WorkerPost,
  type WorkerRecycled,
  type WorkerRestore,
} from "./protocol.ts";

const PASSING = new Set<string>(PASSING_KINDS);

const encoder = new TextEncoder();
let token = "";
let runningId: number | null = null;
// Shared with the worker (the layout is in protocol.py), and new for each worker. `signals`:
// Pyodide polls its first word, where INTERRUPT_SIGNAL raises KeyboardInterrupt; the second is the
// kill flag. A blocking tool call: the worker sleeps in Atomics.wait until this thread writes the
// reply into syncData and wakes it.
let signals: Int32Array;
let syncState: Int32Array;
let syncData: SharedArrayBuffer;
newSharedMemory();
let pendingSyncCall: number | null = null;
// Pyodide's compiled WebAssembly, handed over by the first worker: a replacement starts from it.
let compiled: WebAssembly.Module | null = null;
// A replacement worker is starting: its `fatal` ends this process.
let renewing = false;
// Requests between runs (recycle, checkpoint, restore) and their answers travel on a private
// channel: sandboxed code can listen to and post on the worker's own one, but never holds this
// port, so it can neither see a request nor forge an answer. One request at a time.
let control: MessagePort | null = null;
let asked: ((answer: ControlAnswer) => void) | null = null;

function ask(message: ControlRequest, answer: (answer: ControlAnswer) => void, transfer: ArrayBuffer[] = []): void {
  asked = answer;
  control?.postMessage(message, transfer);
}

// A checkpoint file's place: a bare name in the host's checkpoint folder, nowhere else.
function checkpointPath(file: string): string | null {
  const folder = init?.checkpoint_dir;
  return folder && /^[A-Za-z0-9._-]+$/.test(file) && !file.startsWith(".") ? `${folder}/${file}` : null;
}

function wakeWorker(state: number): void {
  pendingSyncCall = null;
  Atomics.store(syncState, SYNC_STATE, state);
  Atomics.notify(syncState, SYNC_STATE);
}

function answerSyncCall(reply: string): void {
  let bytes = encoder.encode(reply);
  if (bytes.length > SYNC_REPLY_MAX_BYTES) {
    const error = `the tool's reply is over ${MAX_TOOL_REPLY_CHARS} characters`;
    bytes = encoder.encode(JSON.stringify({ ok: false, error }));
  }
  if (bytes.length > syncData.byteLength) syncData.grow(bytes.length);
  new Uint8Array(syncData).set(bytes);
  syncState[SYNC_LENGTH] = bytes.length;
  wakeWorker(SYNC_REPLY_READY);
}

function sendMessage(message: RunnerMessage): void {
  send(JSON.stringify(message));
}

function send(payload: string): void {
  // Payloads from the worker are already JSON; wrapping avoids a parse and re-encode.
  const line = `{"token":${JSON.stringify(token)},"msg":${payload}}\n`;
  const bytes = encoder.encode(line);
  let written = 0;
  while (written < bytes.length) written += Deno.stdout.writeSync(bytes.subarray(written));
}

let worker: Worker | null = null;

// A worker that ended during a run (a crash, os._exit, a kill) leaves the process as it was: a new
// worker takes its place, from the compiled module; the host hears of the crash, `renewed`, then
// of the new worker's `ready`. Ended between runs, or with no module to start from, it is the end.
function renew(crash: CrashedMessage): void {
  // Whatever of the old worker still runs stops at its next signal check, and hears nothing more.
  stopRun(true);
  control?.close();
  worker?.terminate();
  worker = null;
  runningId = null;
  pendingSyncCall = null;
  asked = null;
  if (compiled === null || init === null) gone(crash);
  newSharedMemory();
  sentData.clear(); // the new worker's data/ is empty
  sendMessage({ ...crash, renewed: true });
  renewing = true;
  worker = startWorker(init!);
}

function newSharedMemory(): void {
  signals = new Int32Array(new SharedArrayBuffer(8));
  syncState = new Int32Array(new SharedArrayBuffer(8));
  syncData = new SharedArrayBuffer(SYNC_DATA_INITIAL_BYTES, { maxByteLength: SYNC_REPLY_MAX_BYTES });
}

// KeyboardInterrupt in the running program, which a sleeping one wakes for; `kill` sets the kill
// flag too.
function stopRun(kill: boolean): void {
  if (kill) Atomics.store(signals, SIGNAL_KILL, 1);
  Atomics.store(signals, SIGNAL_INTERRUPT, INTERRUPT_SIGNAL);
  Atomics.notify(signals, SIGNAL_INTERRUPT);
  if (pendingSyncCall !== null) wakeWorker(SYNC_INTERRUPTED);
}

function gone(last: RunnerMessage | null): never {
  if (last) sendMessage(last);
  Deno.exit(EXIT_SANDBOX_GONE);
}

function crashOf(json: string): CrashedMessage {
  try {
    const message = JSON.parse(json) as RunnerMessage;
    if (message.type === "crashed") return message;
  } catch { /* not JSON: described below */ }
  return { type: "crashed", id: runningId, message: "the sandbox's worker ended" };
}

// data/: this thread copies the host's data folder into the worker (regular files only, never
// links, so nothing outside the folder is read), when a sandbox starts and when a file changes.
// The worker itself has no permission to read the folder.
const sentData = new Map<string, string>();

function dataChanges(root: string): Omit<WorkerData, "type"> {
  const files: WorkerData["files"] = [];
  const seen = new Set<string>();
  const walk = (folder: string, relative: string): void => {
    for (const entry of Deno.readDirSync(folder)) {
      const path = relative ? `${relative}/${entry.name}` : entry.name;
      if (entry.isDirectory) walk(`${folder}/${entry.name}`, path);
      if (!entry.isFile) continue;
      const info = Deno.lstatSync(`${folder}/${entry.name}`);
      const stamp = `${info.size}:${info.mtime?.getTime()}`;
      seen.add(path);
      if (sentData.get(path) === stamp) continue;
      files.push({ path, bytes: Deno.readFileSync(`${folder}/${entry.name}`) });
      sentData.set(path, stamp);
    }
  };
  walk(root, "");
  const removed = [...sentData.keys()].filter((path) => !seen.has(path));
  for (const path of removed) sentData.delete(path);
  return { files, removed };
}

function sendData(target: Worker, root: string | undefined): void {
  if (!root) return;
  try {
    const { files, removed } = dataChanges(root);
    if (files.length || removed.length) {
      const message: WorkerData = { type: "data", files, removed };
      target.postMessage(message, files.map((file) => file.bytes.buffer as ArrayBuffer));
    }
  } catch (error) {
    sendMessage({ type: "progress", line: `data/ could not be refreshed: ${error}` });
  }
}

let init: InitMessage | null = null;

function startWorker(message: InitMessage): Worker {
  // The worker runs sandboxed code: it gets less than this thread, only what loading Pyodide
  // and its packages needs, and the network hosts the operator allowed.
  const read = [new URL(".", import.meta.url).pathname, message.pyodide_dir!];
  if (message.packages_dir) read.push(message.packages_dir);
  if (message.snapshot) read.push(message.snapshot);
  const permissions = {
    read,
    net: message.allow_net ? message.allow_net.split(",") : false,
    env: false,
    run: false,
    write: false,
    ffi: false,
    sys: false,
    import: false,
  } as const;
  const started = new Worker(new URL("./worker.ts", import.meta.url), {
    type: "module",
    deno: { permissions },
  } as WorkerOptions);
  started.onmessage = (event: MessageEvent<WorkerPost>) => {
    if (started !== worker) return; // a replaced worker's last words
    const { id, json, exiting, syncCall } = event.data;
    if (id === null) {
      // Sandboxed code can post too: between results only these kinds pass, never a result.
      let kind: unknown;
      try {
        kind = JSON.parse(json)?.type;
      } catch {
        kind = undefined;
      }
      if (renewing && (kind === "ready" || kind === "fatal")) {
        renewing = false;
        if (kind === "fatal") {
          send(json);
          gone(null);
        }
      }
      if (!PASSING.has(kind as string)) {
        if (exiting) gone(null);
        return;
      }
      if (syncCall !== undefined) {
        // The interrupt came between the worker's post and now: wake it instead of calling.
        if (Atomics.load(signals, SIGNAL_INTERRUPT) !== 0) {
          wakeWorker(SYNC_INTERRUPTED);
          return;
        }
        pendingSyncCall = syncCall;
      }
    } else if (id === runningId) {
      if (exiting) return renew(crashOf(json));
      runningId = null;
      Atomics.store(signals, SIGNAL_KILL, 0); // a kill that came after the result is for nobody
    } else {
      if (exiting) gone(null);
      return; // a result for a run that is not running is forged or stale
    }
    send(json);
    // A worker that exited between runs is gone for good, and so is this sandbox.
    if (exiting) gone(null);
  };
  started.onerror = (event: ErrorEvent) => {
    event.preventDefault();
    if (started !== worker) return;
    const message = `worker error: ${event.message}`;
    if (runningId !== null) renew({ type: "crashed", id: runningId, message });
    else gone({ type: "fatal", message });
  };
  const channel = new MessageChannel();
  const port = channel.port1;
  control = port;
  control.onmessage = (event: MessageEvent<ControlAnswer | WorkerModule>) => {
    if (port !== control) return; // a replaced worker's port
    if ("module" in event.data) {
      compiled ??= event.data.module;
      return;
    }
    const answer = asked;
    asked = null;
    answer?.(event.data);
  };
  const init: WorkerInit = {
    type: "init",
    guest_modules: message.guest_modules,
    limits: message.limits,
    signals,
    syncState,
    syncData,
    control: channel.port2,
    ...(compiled ? { module: compiled } : {}),
    ...(message.memory_max_bytes ? { memoryMaxBytes: message.memory_max_bytes } : {}),
    ...(message.packages_dir ? { packagesDir: message.packages_dir } : {}),
    ...(message.snapshot ? { snapshot: message.snapshot } : {}),
    ...(message.preload ? { preload: message.preload } : {}),
  };
  started.postMessage(init, [channel.port2]);
  sendData(started, message.data_dir);
  return started;
}

function toWorker(message: WorkerMessage): void {
  worker?.postMessage(message);
}

function handle(message: HostMessage): void {
  switch (message.type) {
    case "init":
      token = message.token;
      init = message;
      worker ??= startWorker(message);
      break;
    case "run":
      runningId = message.id;
      // Cleared here, in order with `interrupt`: the worker may start the run only after its
      // interrupt has arrived (behind a data sync or a warm-up round), and must still see it.
      Atomics.store(signals, SIGNAL_INTERRUPT, 0);
      Atomics.store(signals, SIGNAL_KILL, 0);
      if (worker) sendData(worker, init?.data_dir);
      toWorker(message);
      break;
    case "jit_warm_up":
      toWorker(message);
      break;
    case "recycle":
      runningId = null;
      pendingSyncCall = null;
      Atomics.store(signals, SIGNAL_INTERRUPT, 0);
      ask({ type: "recycle", id: message.id }, ({ json }) => {
        const { dataLost, ...answer } = JSON.parse(json) as WorkerRecycled;
        if (dataLost) sentData.clear(); // the worker emptied data/: the next run sends all of it
        sendMessage(answer);
      });
      break;
    case "checkpoint": {
      const path = checkpointPath(message.file);
      const refuse = (reason: string) =>
        sendMessage({ type: "checkpointed", id: message.id, saved: false, reason, lost: [], bytes: 0, ms: 0 });
      if (path === null) {
        refuse("the host named no valid checkpoint file");
        break;
      }
      ask({ type: "checkpoint", id: message.id }, ({ json, blob }) => {
        const answer = JSON.parse(json) as CheckpointedMessage;
        if (answer.saved) {
          try {
            Deno.writeFileSync(path, blob!, { mode: 0o600 });
          } catch (error) {
            refuse(`the checkpoint could not be written: ${error}`);
            return;
          }
        }
        sendMessage(answer);
      });
      break;
    }
    case "restore": {
      const path = checkpointPath(message.file);
      let blob: Uint8Array;
      try {
        if (path === null) throw new Error("the host named no valid checkpoint file");
        blob = Deno.readFileSync(path);
        Deno.removeSync(path);
      } catch (error) {
        sendMessage({ type: "restored", id: message.id, restored: false, reason: String(error), ms: 0 });
        break;
      }
      const restore: WorkerRestore = { type: "restore", id: message.id, blob };
      ask(restore, ({ json }) => sendMessage(JSON.parse(json) as RestoredMessage), [blob.buffer as ArrayBuffer]);
      break;
    }
    case "interrupt":
      // Only the run the host means: a late interrupt must not hit the next program.
      if (runningId === message.id) stopRun(false);
      break;
    case "kill":
      // The program ignored its interrupt: the worker throws at its next signal check, or, parked
      // in an await, ends the run when the kill reaches its event loop.
      if (runningId === message.id) {
        stopRun(true);
        control?.postMessage({ type: "kill", id: message.id });
      }
      break;
    case "tool_result":
      if (message.call === pendingSyncCall) answerSyncCall(message.reply);
      else toWorker(message);
      break;
  }
}

const decoder = new TextDecoder();
let pending = "";
for await (const chunk of Deno.stdin.readable) {
  pending += decoder.decode(chunk, { stream: true });
  let newline: number;
  while ((newline = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, newline);
    pending = pending.slice(newline + 1);
    if (line.trim()) handle(JSON.parse(line) as HostMessage);
  }
}
// The host closed stdin: it is done with this sandbox.
Deno.exit(0);
