// Host-facing side of the sandbox: owns stdin/stdout and one Pyodide Worker.
// The protocol (message names and fields) is documented in mcp_sandbox/backends/protocol.py.
//
// The main thread never runs sandboxed code, so it stays free to read an `interrupt`
// while the worker is busy, and it alone knows the session token that marks genuine
// lines on stdout: code in the worker can write to stdout, but cannot forge a token.

type HostMessage =
  | { type: "init"; token: string; guest_runtime: string; data_dir?: string; packages_dir?: string }
  | { type: "run"; id: number; code: string; max_output_chars: number; tools?: string }
  | { type: "interrupt"; id: number }
  | { type: "tool_result"; call: number; reply: string };

// `id` is set only on the message that ends run `id` (its result, or a crash).
type WorkerMessage = { id: number | null; json: string; exiting: boolean; syncCall?: number };

const encoder = new TextEncoder();
let token = "";
let runningId: number | null = null;
// Pyodide polls this byte; writing 2 (SIGINT) raises KeyboardInterrupt in the running code.
const interruptBuffer = new Uint8Array(new SharedArrayBuffer(1));

// A blocking tool call: the worker sleeps in Atomics.wait on syncState[0] until this thread
// writes the reply into syncData (grown to fit) and sets it to REPLY_READY, or to INTERRUPTED.
const REPLY_READY = 1;
const INTERRUPTED = 2;
const MAX_REPLY_BYTES = 8 * 1024 * 1024 * 4 + 65_536;
const syncState = new Int32Array(new SharedArrayBuffer(8));
const syncData = new SharedArrayBuffer(65_536, { maxByteLength: MAX_REPLY_BYTES });
let pendingSyncCall: number | null = null;

function wakeWorker(state: number): void {
  pendingSyncCall = null;
  Atomics.store(syncState, 0, state);
  Atomics.notify(syncState, 0);
}

function answerSyncCall(reply: string): void {
  let bytes = encoder.encode(reply);
  if (bytes.length > MAX_REPLY_BYTES) {
    bytes = encoder.encode(JSON.stringify({ ok: false, error: "the tool's reply is too large" }));
  }
  if (bytes.length > syncData.byteLength) syncData.grow(bytes.length);
  new Uint8Array(syncData).set(bytes);
  syncState[1] = bytes.length;
  wakeWorker(REPLY_READY);
}

function send(payload: string): void {
  // Payloads from the worker are already JSON; wrapping avoids a parse and re-encode.
  const line = `{"token":${JSON.stringify(token)},"msg":${payload}}\n`;
  const bytes = encoder.encode(line);
  let written = 0;
  while (written < bytes.length) written += Deno.stdout.writeSync(bytes.subarray(written));
}

let worker: Worker | null = null;

function startWorker(init: Extract<HostMessage, { type: "init" }>): Worker {
  const started = new Worker(new URL("./worker.ts", import.meta.url), { type: "module" });
  started.onmessage = (event: MessageEvent<WorkerMessage>) => {
    if (event.data.syncCall !== undefined) pendingSyncCall = event.data.syncCall;
    else if (event.data.id !== null && event.data.id === runningId) runningId = null;
    send(event.data.json);
    // A worker that crashed or exited is gone for good, and so is this sandbox.
    if (event.data.exiting) Deno.exit(70);
  };
  started.onerror = (event: ErrorEvent) => {
    event.preventDefault();
    send(JSON.stringify({ type: "fatal", message: `worker error: ${event.message}` }));
    Deno.exit(70);
  };
  started.postMessage({
    type: "init",
    guest_runtime: init.guest_runtime,
    interruptBuffer,
    syncState,
    syncData,
    dataDir: init.data_dir,
    packagesDir: init.packages_dir,
  });
  return started;
}

function handle(message: HostMessage): void {
  switch (message.type) {
    case "init":
      token = message.token;
      worker ??= startWorker(message);
      break;
    case "run":
      runningId = message.id;
      worker?.postMessage(message);
      break;
    case "interrupt":
      // Only the run the host means: a late interrupt must not hit the next program.
      if (runningId === message.id) {
        Atomics.store(interruptBuffer, 0, 2);
        if (pendingSyncCall !== null) wakeWorker(INTERRUPTED);
      }
      break;
    case "tool_result":
      if (message.call === pendingSyncCall) answerSyncCall(message.reply);
      else worker?.postMessage(message);
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
