// Makes the Pyodide memory snapshot that sandboxes start from: loading Pyodide from scratch
// takes seconds, restoring a snapshot much less. Run once per Pyodide version and guest runtime, by
// the host's PyodideBackend.prepare(): `deno run ... snapshot.ts <file to write> [<guest modules>]`,
// the guest modules a JSON file of [name, source] pairs, loaded into the snapshot too.
import { loadPyodide } from "pyodide";
import { loadGuestModules } from "./modules.ts";
import { PYODIDE_OPTIONS } from "./options.ts";

const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _makeSnapshot: true });
// What installing a package imports, done once here rather than at each sandbox's start, or by each
// session that loads a package (its checkpoint would carry them: megabytes of pages).
for (const name of ["importlib.metadata", "email.message", "tarfile", "zipfile", "encodings.cp437"]) {
  pyodide.pyimport(name).destroy();
}
// The guest runtime: compiling and running it took a third of a new worker's start.
if (Deno.args[1]) loadGuestModules(pyodide, JSON.parse(Deno.readTextFileSync(Deno.args[1])));
const snapshot = pyodide.makeMemorySnapshot();
Deno.writeFileSync(Deno.args[0], snapshot);
// Pyodide 314 restores a snapshot only into its initial memory (30 MB), and a larger one fails with
// "offset is out of bounds" (pyodide#6254): a snapshot that does not load is refused here (a failed
// exit; the host then deletes the file), so that sandboxes load Pyodide from scratch instead of
// failing to start at all.
await loadPyodide({ ...PYODIDE_OPTIONS, _loadSnapshot: snapshot });
