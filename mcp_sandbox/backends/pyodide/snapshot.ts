// Makes what sandboxes start from, once per Pyodide version, runtime script and guest runtime,
// for the host's PyodideBackend.prepare():
//   deno run ... snapshot.ts snapshot <file to write> [<guest modules>]
// the Pyodide memory snapshot (loading Pyodide from scratch takes seconds, restoring a snapshot
// much less), the guest modules a JSON file of [name, source] pairs, loaded into the snapshot too;
//   deno run --v8-flags=<the runner's> ... snapshot.ts code-cache <snapshot> <file to write>
// V8's code for Pyodide's runtime script once a start from that snapshot has compiled it
// (script.ts), which V8 takes only from a process with the same flags.
import { loadPyodide } from "pyodide";
import { loadGuestModules } from "./modules.ts";
import { PYODIDE_OPTIONS } from "./options.ts";
import { pyodideScript } from "./rewrites.ts";
import { runPyodideScript } from "./script.ts";

const [mode, ...args] = Deno.args;
if (mode === "snapshot") await makeSnapshot(args[0], args[1]);
else if (mode === "code-cache") await makeCodeCache(args[0], args[1]);
else throw new Error(`snapshot.ts: no such mode ${mode}`);

async function makeSnapshot(file: string, guestModules: string | undefined): Promise<void> {
  // The runtime script every sandbox runs (rewrites.ts), whose linker lays out the function table
  // that the snapshot's memory points into.
  await runPyodideScript(pyodideScript());
  const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _makeSnapshot: true });
  // What installing a package imports, done once here rather than at each sandbox's start, or by
  // each session that loads a package (its checkpoint would carry them: megabytes of pages).
  for (const name of ["importlib.metadata", "email.message", "tarfile", "zipfile", "encodings.cp437"]) {
    pyodide.pyimport(name).destroy();
  }
  // The guest runtime: compiling and running it took a third of a new worker's start.
  if (guestModules) loadGuestModules(pyodide, JSON.parse(Deno.readTextFileSync(guestModules)));
  const snapshot = pyodide.makeMemorySnapshot();
  Deno.writeFileSync(file, snapshot);
  // Pyodide 314 restores a snapshot only into its initial memory (30 MB), and a larger one fails
  // with "offset is out of bounds" (pyodide#6254): a snapshot that does not load is refused here (a
  // failed exit; the host then deletes the file), so that sandboxes load Pyodide from scratch
  // instead of failing to start at all.
  await loadPyodide({ ...PYODIDE_OPTIONS, _loadSnapshot: snapshot });
}

async function makeCodeCache(snapshot: string, file: string): Promise<void> {
  const script = await runPyodideScript(pyodideScript());
  const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _loadSnapshot: Deno.readFileSync(snapshot) });
  // What a sandbox's start runs past loading: Python called, and values passed both ways.
  pyodide.runPython("import sys; sys.version");
  pyodide.toPy({ limits: [1, 2] }).destroy();
  Deno.writeFileSync(file, script.codeCache());
}
