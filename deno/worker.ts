// Sandbox side: hosts Pyodide and runs programs through the guest runtime
// (mcp_sandbox/backends/guest_runtime.py), which returns each outcome as a JSON string.
// The exact Pyodide version is pinned once, in deno.json.
import { loadPyodide, type PyodideInterface } from "pyodide";

type PyCallable = ((...args: unknown[]) => unknown) & { destroy?: () => void };

let pyodide: PyodideInterface;
let runProgram: PyCallable;
let interruptBuffer: Uint8Array;
let currentId: number | null = null;
const postToMain = self.postMessage.bind(self);

function post(id: number | null, json: string, exiting = false): void {
  postToMain({ id, json, exiting });
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
      post(currentId, JSON.stringify({ type: "crashed", id: currentId, message }), true);
      return original(...args);
    },
  });
}
announceExit(Deno, "exit");
announceExit(self, "close");

async function init(guestRuntime: string, buffer: Uint8Array): Promise<void> {
  const started = performance.now();
  pyodide = await loadPyodide({ env: { HOME: "/home/sandbox" } });
  interruptBuffer = buffer;
  pyodide.setInterruptBuffer(interruptBuffer);
  const namespace = pyodide.globals.get("dict")();
  pyodide.runPython(guestRuntime, { globals: namespace, filename: "<guest_runtime>" });
  runProgram = namespace.get("run_program_json");
  namespace.destroy();
  post(null, JSON.stringify({
    type: "ready",
    pyodide_version: pyodide.version,
    load_ms: Math.round(performance.now() - started),
  }));
}

async function run(id: number, code: string, maxOutputChars: number): Promise<void> {
  interruptBuffer[0] = 0;
  currentId = id;
  let outcome: unknown;
  try {
    outcome = runProgram(code, maxOutputChars);
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
  post(id, `{"type":"result","id":${id},"outcome":${outcome as string}}`);
}

self.onmessage = async (event: MessageEvent) => {
  const message = event.data;
  if (message.type === "init") {
    try {
      await init(message.guest_runtime, message.interruptBuffer);
    } catch (error) {
      post(null, JSON.stringify({ type: "fatal", message: `Pyodide failed to load: ${error}` }));
    }
  } else if (message.type === "run") {
    await run(message.id, message.code, message.max_output_chars);
  }
};
