// Host-facing side of the sandboxes: owns stdin/stdout and one Pyodide Worker per sandbox, all of
// one principal. Every message and constant comes from protocol.ts, generated from
// mcp_sandbox/protocol.py.
//
// The main thread never runs sandboxed code, so it stays free to read an `interrupt`
// while a worker is busy, and it alone knows the process's token that marks genuine lines on
// stdout: code in a worker can write to stdout (and read stdin: node:fs reaches both), but cannot
// forge a token, which comes from this thread's environment, never from stdin. The host seals its
// lines with a key made from the token, so a worker that reads stdin learns nothing of what the
// host sends the others. Each worker's messages are read from its own Worker object, so whatever a
// worker posts acts for its sandbox only: the sandbox number on its lines is this thread's, never
// the worker's.
import { Buffer } from "node:buffer";
import { createDecipheriv, createHash } from "node:crypto";
import {
  type CheckpointedMessage,
  type ControlAnswer,
  type ControlRequest,
  type CrashedMessage,
  HOST_LINE_KEY_LABEL,
  HOST_LINE_NONCE_BYTES,
  HOST_LINE_TAG_BYTES,
  type HostEnvelope,
  type HostMessage,
  type InitMessage,
  INTERRUPT_SIGNAL,
  MAX_TOOL_REPLY_CHARS,
  PASSING_KINDS,
  type RestoredMessage,
  RUNNER_TOKEN_ENV,
  type RunnerMessage,
  SIGNAL_INTERRUPT,
  SIGNAL_KILL,
  SYNC_DATA_INITIAL_BYTES,
  SYNC_INTERRUPTED,
  SYNC_LENGTH,
  SYNC_REPLY_MAX_BYTES,
  SYNC_REPLY_READY,
  SYNC_STATE,
  type WorkerAhead,
  type WorkerCleanMemory,
  type WorkerData,
  type WorkerInit,
  type WorkerModule,
  type WorkerPost,
  type WorkerRecycled,
  type WorkerRecycledCrash,
  type WorkerRestore,
  type WorkerWarmedUp,
} from "./protocol.ts";
import { pyodideScript } from "./rewrites.ts";

const PASSING = new Set<string>(PASSING_KINDS);

const encoder = new TextEncoder();
// Only this thread may read the environment (each worker has `env: false`, startWorker): no
// program learns the token.
const token = Deno.env.get(RUNNER_TOKEN_ENV);
if (!token) {
  console.error(`the runner needs its token in ${RUNNER_TOKEN_ENV}`);
  Deno.exit(2);
}
const lineKey = createHash("sha256").update(HOST_LINE_KEY_LABEL + token).digest();
// A sealed host line's envelope (protocol.py), or null for one that does not open: a line a sandbox
// tore by reading part of stdin itself.
function unseal(line: string): HostEnvelope | null {
  const sealed = Buffer.from(line, "base64");
  if (sealed.length < HOST_LINE_NONCE_BYTES + HOST_LINE_TAG_BYTES) return null;
  const nonce = sealed.subarray(0, HOST_LINE_NONCE_BYTES);
  try {
    const decipher = createDecipheriv("aes-256-gcm", lineKey, nonce);
    decipher.setAuthTag(sealed.subarray(sealed.length - HOST_LINE_TAG_BYTES));
    const body = sealed.subarray(HOST_LINE_NONCE_BYTES, sealed.length - HOST_LINE_TAG_BYTES);
    const json = Buffer.concat([decipher.update(body), decipher.final()]).toString("utf8");
    return JSON.parse(json) as HostEnvelope;
  } catch {
    return null;
  }
}

// Pyodide's compiled WebAssembly, handed over by the first worker: every later one starts from it,
// so V8's compiled and optimised code is shared, and kept across crashes.
let compiled: WorkerModule | null = null;
// The first clean memory a worker reached (WorkerCleanMemory), shared by every later one that
// reaches the same: never written after it is made.
let clean: WorkerCleanMemory | null = null;
// Whether a worker ran a whole JIT warm-up (WorkerWarmedUp): what it tiers up is the module's
// code, which every worker runs, so one serves the whole process (a later one spent 0.2 s of CPU).
let warmedUp = false;
// V8's code cache of Pyodide's runtime script (InitMessage.code_cache), read and checked once for
// every worker: "damaged" when it is not what the host made (V8 would not notice).
let codeCacheRead: Uint8Array | "damaged" | null | undefined;
// Pyodide's runtime script as every worker runs it (script.ts), made once; or why it cannot be (a
// Pyodide that a rewrite the sandbox depends on does not fit, rewrites.ts).
let script: string | Error | undefined;
const sandboxes = new Map<number, Sandbox>();
// Sandboxes asked for while the first worker compiles: started once it hands its module over (or
// fails), so no two compile it.
const waiting = new Map<number, InitMessage>();
// How many sandboxes this process hosts at most (the host's sandboxes_per_process).
const CAPACITY = Number(Deno.args[0] ?? "1");

type Permissions = Deno.PermissionOptionsObject;

// A worker where sandboxed code runs: it gets less than this thread, only what loading Pyodide and
// its packages needs, and the network hosts the operator allowed.
function workerPermissions(message: InitMessage): Permissions {
  const read = [new URL(".", import.meta.url).pathname, message.pyodide_dir!];
  if (message.packages_dir) read.push(message.packages_dir);
  if (message.snapshot) read.push(message.snapshot);
  return {
    read,
    net: message.allow_net ? message.allow_net.split(",") : false,
    env: false,
    run: false,
    write: false,
    ffi: false,
    sys: false,
    import: false,
  };
}

function newWorker(permissions: Permissions): Worker {
  return new Worker(new URL("./worker.ts", import.meta.url), {
    type: "module",
    deno: { permissions },
  } as WorkerOptions);
}

// A worker started ahead for the process's next sandbox, while the process has room and no run
// waits on its thread: Deno's worker runtime and the modules (30-40 ms, and 11-15 ms of this
// thread's), and Pyodide's runtime script (WorkerAhead, 15-20 ms with its delivery), are then done
// before anyone needs them. It runs nothing else until a sandbox's init reaches it, and is used
// only with the permissions it was made with.
let spare: { worker: Worker; permissions: string } | null = null;
let spareTimer: ReturnType<typeof setTimeout> | undefined;

function takeWorker(permissions: Permissions): { worker: Worker; spare: boolean } {
  const ready = spare;
  spare = null;
  if (ready !== null && ready.permissions === JSON.stringify(permissions)) return { worker: ready.worker, spare: true };
  ready?.worker.terminate();
  return { worker: newWorker(permissions), spare: false };
}

// Starts the spare soon, once no sandbox of the process is running a program (a start blocks this
// thread 11-15 ms, which would delay a run's messages); retried while they are, for a few seconds.
function startSpareSoon(message: InitMessage, tries = 50): void {
  clearTimeout(spareTimer);
  spareTimer = setTimeout(() => {
    if (spare !== null || sandboxes.size === 0 || sandboxes.size >= CAPACITY) return;
    if ([...sandboxes.values()].some((sandbox) => sandbox.busy)) {
      if (tries > 1) startSpareSoon(message, tries - 1);
      return;
    }
    const permissions = workerPermissions(message);
    const made = { worker: newWorker(permissions), permissions: JSON.stringify(permissions) };
    // One that fails to load is dropped, and a sandbox starts a worker of its own.
    made.worker.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      if (spare === made) spare = null;
      made.worker.terminate();
    };
    made.worker.postMessage({ type: "ahead", ...startingScript(message) } satisfies WorkerAhead);
    spare = made;
  }, 100);
}

// What every worker starts from: Pyodide's runtime script, once a sandbox of the process has started
// (handle() refuses the sandbox otherwise), and its code cache.
function startingScript(message: InitMessage): Omit<WorkerAhead, "type"> {
  return { script: runtimeScript() as string, ...codeCache(message) };
}

function codeCache(message: InitMessage): Pick<WorkerInit, "codeCache" | "codeCacheDamaged"> {
  if (codeCacheRead === undefined) {
    try {
      const bytes = message.code_cache ? Deno.readFileSync(message.code_cache) : null;
      const digest = bytes && createHash("sha256").update(bytes).digest("hex");
      codeCacheRead = bytes && digest !== message.code_cache_sha256 ? "damaged" : bytes;
    } catch {
      codeCacheRead = "damaged"; // gone since the host made it
    }
  }
  if (codeCacheRead === "damaged") return { codeCacheDamaged: true };
  return codeCacheRead ? { codeCache: codeCacheRead } : {};
}

function runtimeScript(): string | Error {
  try {
    script ??= pyodideScript();
  } catch (error) {
    script = error instanceof Error ? error : new Error(String(error));
  }
  return script;
}

function moduleSettled(): void {
  for (const [number, init] of waiting) sandboxes.set(number, new Sandbox(number, init));
  waiting.clear();
}

function send(sandbox: number, payload: string): void {
  // Payloads from a worker are already JSON; wrapping avoids a parse and re-encode. A worker may
  // write to stdout too: the newline first ends whatever partial line it left there (the host drops
  // that as a line of its own), which would otherwise swallow this one, another sandbox's perhaps.
  const line = `\n{"token":${JSON.stringify(token)},"msg":${payload},"sandbox":${sandbox}}\n`;
  const bytes = encoder.encode(line);
  let written = 0;
  while (written < bytes.length) written += Deno.stdout.writeSync(bytes.subarray(written));
}

// A checkpoint file's place: a bare name in the sandbox's checkpoint folder, nowhere else.
function checkpointPath(folder: string | undefined, file: string): string | null {
  return folder && /^[A-Za-z0-9._-]+$/.test(file) && !file.startsWith(".") ? `${folder}/${file}` : null;
}

function crashOf(json: string, runningId: number | null): CrashedMessage {
  try {
    const message = JSON.parse(json) as RunnerMessage;
    // Only what it says: whether the sandbox is clean is the private channel's to tell.
    if (message.type === "crashed") return { type: "crashed", id: message.id, message: String(message.message) };
  } catch { /* not JSON: described below */ }
  return { type: "crashed", id: runningId, message: "the sandbox's worker ended" };
}

// data/: this thread copies the host's data folder into a worker (regular files only, never
// links, so nothing outside the folder is read), when a sandbox starts and when a file changes.
// The worker itself has no permission to read the folder. `sent`: what this worker has, by path.
function dataChanges(root: string, sent: Map<string, string>): Omit<WorkerData, "type"> {
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
      if (sent.get(path) === stamp) continue;
      files.push({ path, bytes: Deno.readFileSync(`${folder}/${entry.name}`) });
      sent.set(path, stamp);
    }
  };
  walk(root, "");
  const removed = [...sent.keys()].filter((path) => !seen.has(path));
  for (const path of removed) sent.delete(path);
  return { files, removed };
}

// One sandbox: its worker, the memory it shares with it, its private control port, its run.
class Sandbox {
  private worker: Worker | null = null;
  private runningId: number | null = null;
  // Shared with the worker (the layout is in protocol.py), and new for each worker. `signals`:
  // Pyodide polls its first word, where INTERRUPT_SIGNAL raises KeyboardInterrupt; the second is
  // the kill flag. A blocking tool call: the worker sleeps in Atomics.wait until this thread
  // writes the reply into syncData and wakes it.
  private signals = new Int32Array(new SharedArrayBuffer(8));
  private syncState = new Int32Array(new SharedArrayBuffer(8));
  private syncData = Sandbox.syncBuffer();
  private pendingSyncCall: number | null = null;
  // A replacement worker is starting: its `fatal` ends this sandbox.
  private renewing = false;
  // The worker has been given a program to run: what it offers as clean is not taken any more.
  private ranSinceStart = false;
  // Requests between runs (recycle, checkpoint, restore) and their answers travel on a private
  // channel: sandboxed code can listen to and post on the worker's own one, but never holds this
  // port, so it can neither see a request nor forge an answer. One request at a time.
  private control: MessagePort | null = null;
  private asked: ((answer: ControlAnswer) => void) | null = null;
  private readonly sentData = new Map<string, string>();

  constructor(readonly number: number, private readonly init: InitMessage) {
    this.worker = this.startWorker();
  }

  private static syncBuffer(): SharedArrayBuffer {
    return new SharedArrayBuffer(SYNC_DATA_INITIAL_BYTES, { maxByteLength: SYNC_REPLY_MAX_BYTES });
  }

  private sendMessage(message: RunnerMessage): void {
    send(this.number, JSON.stringify(message));
  }

  private ask(message: ControlRequest, answer: (answer: ControlAnswer) => void, transfer: ArrayBuffer[] = []): void {
    this.asked = answer;
    this.control?.postMessage(message, transfer);
  }

  private wakeWorker(state: number): void {
    this.pendingSyncCall = null;
    Atomics.store(this.syncState, SYNC_STATE, state);
    Atomics.notify(this.syncState, SYNC_STATE);
  }

  private answerSyncCall(reply: string): void {
    let bytes = encoder.encode(reply);
    if (bytes.length > SYNC_REPLY_MAX_BYTES) {
      const error = `the tool's reply is over ${MAX_TOOL_REPLY_CHARS} characters`;
      bytes = encoder.encode(JSON.stringify({ ok: false, error }));
    }
    if (bytes.length > this.syncData.byteLength) this.syncData.grow(bytes.length);
    new Uint8Array(this.syncData).set(bytes);
    this.syncState[SYNC_LENGTH] = bytes.length;
    this.wakeWorker(SYNC_REPLY_READY);
  }

  // KeyboardInterrupt in the running program, which a sleeping one wakes for; `kill` sets the kill
  // flag too.
  private stopRun(kill: boolean): void {
    if (kill) Atomics.store(this.signals, SIGNAL_KILL, 1);
    Atomics.store(this.signals, SIGNAL_INTERRUPT, INTERRUPT_SIGNAL);
    Atomics.notify(this.signals, SIGNAL_INTERRUPT);
    if (this.pendingSyncCall !== null) this.wakeWorker(SYNC_INTERRUPTED);
  }

  // The worker stops, and whatever of it still runs hears nothing more.
  private endWorker(): void {
    this.stopRun(true);
    this.control?.close();
    this.worker?.terminate();
    this.worker = null;
    this.control = null;
    this.runningId = null;
    this.pendingSyncCall = null;
    this.asked = null;
  }

  // The sandbox is gone for good: its last words, then `ended`. The process and its other
  // sandboxes go on.
  private gone(last: RunnerMessage | string | null, why: string): void {
    if (typeof last === "string") send(this.number, last);
    else if (last) this.sendMessage(last);
    this.close();
    this.sendMessage({ type: "ended", message: why });
  }

  close(): void {
    this.endWorker();
    sandboxes.delete(this.number);
    if (compiled === null) moduleSettled(); // the first worker failed: the next compiles its own
  }

  // A worker that ended during a run (a crash, os._exit, a kill) leaves the sandbox as it was: a
  // new worker takes its place, from the compiled module; the host hears of the crash, `renewed`,
  // then of the new worker's `ready`. Ended between runs, or with no module to start from, it is
  // the end of this sandbox.
  private renew(crash: CrashedMessage): void {
    this.endWorker();
    if (compiled === null) return this.gone(crash, crash.message);
    this.signals = new Int32Array(new SharedArrayBuffer(8));
    this.syncState = new Int32Array(new SharedArrayBuffer(8));
    this.syncData = Sandbox.syncBuffer();
    this.sentData.clear(); // the new worker's data/ is empty
    this.sendMessage({ ...crash, renewed: true });
    this.renewing = true;
    this.worker = this.startWorker();
  }

  // No run is in progress any more: a late interrupt or tool reply is for nobody.
  private forgetRun(): void {
    this.runningId = null;
    this.pendingSyncCall = null;
    Atomics.store(this.signals, SIGNAL_INTERRUPT, 0);
  }

  // The run's program ended the interpreter, and the worker went back to its clean point itself.
  private recycledCrash({ crashed: id, message, dataLost }: WorkerRecycledCrash): void {
    if (id !== this.runningId) return;
    this.forgetRun();
    Atomics.store(this.signals, SIGNAL_KILL, 0);
    if (dataLost) this.sentData.clear(); // the worker emptied data/: the next run sends all of it
    this.sendMessage({ type: "crashed", id, message, renewed: true, recycled: true });
  }

  private sendData(): void {
    const root = this.init.data_dir;
    if (!root) return;
    try {
      const { files, removed } = dataChanges(root, this.sentData);
      if (files.length || removed.length) {
        const message: WorkerData = { type: "data", files, removed };
        this.control?.postMessage(message, files.map((file) => file.bytes.buffer as ArrayBuffer));
      }
    } catch (error) {
      this.sendMessage({ type: "progress", line: `data/ could not be refreshed: ${error}` });
    }
  }

  // A program is running in it.
  get busy(): boolean {
    return this.runningId !== null;
  }

  private startWorker(): Worker {
    const message = this.init;
    const { worker: started, spare } = takeWorker(workerPermissions(message));
    // Only sandboxed code posts here: the worker itself posts on its private port.
    started.onmessage = () => {};
    started.onerror = (event: ErrorEvent) => {
      event.preventDefault();
      if (started !== this.worker) return; // a replaced worker's last words
      const message = `worker error: ${event.message}`;
      if (this.runningId !== null) this.renew({ type: "crashed", id: this.runningId, message });
      else this.gone({ type: "fatal", message }, message);
    };
    const channel = new MessageChannel();
    const port = channel.port1;
    this.control = port;
    port.onmessage = (
      event: MessageEvent<
        ControlAnswer | WorkerModule | WorkerCleanMemory | WorkerRecycledCrash | WorkerWarmedUp | WorkerPost
      >,
    ) => {
      if (port !== this.control) return; // a replaced worker's port
      if ("exiting" in event.data) return this.fromWorker(event.data);
      if ("module" in event.data) {
        compiled ??= { module: event.data.module };
        moduleSettled();
        return;
      }
      if ("warmedUp" in event.data) {
        warmedUp = true;
        return;
      }
      if ("cleanMemory" in event.data) {
        // Sent at the clean point, before `ready`: none from a worker that has run a program.
        if (!this.ranSinceStart) clean ??= event.data;
        return;
      }
      if ("crashed" in event.data) return this.recycledCrash(event.data);
      const answer = this.asked;
      this.asked = null;
      answer?.(event.data);
    };
    const init: WorkerInit = {
      type: "init",
      guest_modules: message.guest_modules,
      limits: message.limits,
      signals: this.signals,
      syncState: this.syncState,
      syncData: this.syncData,
      control: channel.port2,
      ...(compiled ?? {}),
      ...(message.memory_max_bytes ? { memoryMaxBytes: message.memory_max_bytes } : {}),
      ...(message.packages_dir ? { packagesDir: message.packages_dir } : {}),
      ...(message.snapshot ? { snapshot: message.snapshot } : {}),
      ...(message.preload ? { preload: message.preload } : {}),
      ...(clean ? { clean } : {}),
      // A worker started ahead has run the script already (WorkerAhead).
      ...(spare ? { spare } : startingScript(message)),
    };
    this.ranSinceStart = false;
    started.postMessage(init, [channel.port2]);
    this.sendData();
    return started;
  }

  private fromWorker({ id, json, exiting, syncCall }: WorkerPost): void {
    const ended = "the sandbox's worker ended between runs";
    if (id === null) {
      // Between results only these kinds pass, never a result.
      let kind: unknown;
      try {
        kind = JSON.parse(json)?.type;
      } catch {
        kind = undefined;
      }
      if (kind === "ready") startSpareSoon(this.init);
      if (this.renewing && (kind === "ready" || kind === "fatal")) {
        this.renewing = false;
        if (kind === "fatal") return this.gone(json, "its replacement worker failed to start");
      }
      if (!PASSING.has(kind as string)) {
        if (exiting) this.gone(null, ended);
        return;
      }
      if (syncCall !== undefined) {
        // The interrupt came between the worker's post and now: wake it instead of calling.
        if (Atomics.load(this.signals, SIGNAL_INTERRUPT) !== 0) {
          this.wakeWorker(SYNC_INTERRUPTED);
          return;
        }
        this.pendingSyncCall = syncCall;
      }
    } else if (id === this.runningId) {
      if (exiting) return this.renew(crashOf(json, this.runningId));
      this.runningId = null;
      Atomics.store(this.signals, SIGNAL_KILL, 0); // a kill that came after the result is for nobody
    } else {
      if (exiting) this.gone(null, ended);
      return; // a result for a run that is not running is stale
    }
    // A worker that exited between runs is gone for good, and so is this sandbox.
    if (exiting) return this.gone(json, ended);
    send(this.number, json);
  }

  private toWorker(message: ControlRequest): void {
    this.control?.postMessage(message);
  }

  handle(message: HostMessage): void {
    switch (message.type) {
      case "run":
        this.runningId = message.id;
        this.ranSinceStart = true;
        // Cleared here, in order with `interrupt`: the worker may start the run only after its
        // interrupt has arrived (behind a data sync or a warm-up round), and must still see it.
        Atomics.store(this.signals, SIGNAL_INTERRUPT, 0);
        Atomics.store(this.signals, SIGNAL_KILL, 0);
        this.sendData();
        this.toWorker(message);
        break;
      case "jit_warm_up":
        if (!warmedUp) this.toWorker(message);
        break;
      case "recycle":
        this.forgetRun();
        this.ask({ type: "recycle", id: message.id }, ({ json }) => {
          const { dataLost, ...answer } = JSON.parse(json) as WorkerRecycled;
          if (dataLost) this.sentData.clear(); // the worker emptied data/: the next run sends all of it
          this.sendMessage(answer);
        });
        break;
      case "checkpoint":
        this.checkpoint(message.id, message.file);
        break;
      case "restore":
        this.restore(message.id, message.file);
        break;
      case "interrupt":
        // Only the run the host means: a late interrupt must not hit the next program.
        if (this.runningId === message.id) this.stopRun(false);
        break;
      case "kill":
        // The program ignored its interrupt: the worker throws at its next signal check, or, parked
        // in an await, ends the run when the kill reaches its event loop.
        if (this.runningId === message.id) {
          this.stopRun(true);
          this.toWorker({ type: "kill", id: message.id });
        }
        break;
      case "tool_result":
        if (message.call === this.pendingSyncCall) this.answerSyncCall(message.reply);
        else this.toWorker(message);
        break;
      case "close":
        this.close();
        break;
    }
  }

  private checkpoint(id: number, file: string): void {
    const path = checkpointPath(this.init.checkpoint_dir, file);
    const refuse = (reason: string) =>
      this.sendMessage({ type: "checkpointed", id, saved: false, reason, lost: [], bytes: 0, ms: 0 });
    if (path === null) return refuse("the host named no valid checkpoint file");
    this.ask({ type: "checkpoint", id }, ({ json, blob }) => {
      const answer = JSON.parse(json) as CheckpointedMessage;
      if (answer.saved) {
        try {
          Deno.writeFileSync(path, blob!, { mode: 0o600 });
        } catch (error) {
          refuse(`the checkpoint could not be written: ${error}`);
          return;
        }
      }
      this.sendMessage(answer);
    });
  }

  private restore(id: number, file: string): void {
    const path = checkpointPath(this.init.checkpoint_dir, file);
    let blob: Uint8Array;
    try {
      if (path === null) throw new Error("the host named no valid checkpoint file");
      blob = Deno.readFileSync(path);
      Deno.removeSync(path);
    } catch (error) {
      this.sendMessage({ type: "restored", id, restored: false, reason: String(error), ms: 0 });
      return;
    }
    const restore: WorkerRestore = { type: "restore", id, blob };
    this.ask(restore, ({ json }) => this.sendMessage(JSON.parse(json) as RestoredMessage), [
      blob.buffer as ArrayBuffer,
    ]);
  }
}

function handle({ sandbox, msg }: HostEnvelope): void {
  if (msg.type === "init") {
    if (sandboxes.has(sandbox) || waiting.has(sandbox)) return;
    const made = runtimeScript();
    if (made instanceof Error) {
      const message = `Pyodide failed to load: ${made.message}`;
      send(sandbox, JSON.stringify({ type: "fatal", message } satisfies RunnerMessage));
      send(sandbox, JSON.stringify({ type: "ended", message } satisfies RunnerMessage));
      return;
    }
    if (compiled === null && sandboxes.size > 0) waiting.set(sandbox, msg);
    else sandboxes.set(sandbox, new Sandbox(sandbox, msg));
    return;
  }
  if (msg.type === "close") waiting.delete(sandbox);
  sandboxes.get(sandbox)?.handle(msg); // a closed sandbox's late messages are for nobody
}

const decoder = new TextDecoder();
let pending = "";
for await (const chunk of Deno.stdin.readable) {
  pending += decoder.decode(chunk, { stream: true });
  let newline: number;
  while ((newline = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, newline);
    pending = pending.slice(newline + 1);
    if (!line.trim()) continue;
    // A line torn by a sandbox that read part of stdin itself (node:fs reaches it) does not open:
    // that message is lost, not the process and every sandbox in it.
    const envelope = unseal(line);
    if (envelope !== null) handle(envelope);
  }
}
// The host closed stdin: it is done with these sandboxes.
Deno.exit(0);
