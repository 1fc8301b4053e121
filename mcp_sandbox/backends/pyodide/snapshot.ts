// Makes the Pyodide memory snapshot that sandboxes start from: loading Pyodide from scratch
// takes seconds, restoring a snapshot much less. Run once per Pyodide version, by the host's
// PyodideBackend.prepare(): `deno run ... snapshot.ts <file to write>`.
import { loadPyodide } from "pyodide";
import { PYODIDE_OPTIONS } from "./options.ts";

const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _makeSnapshot: true });
// What installing a package imports, done once here rather than at each sandbox's start, or by each
// session that loads a package (its checkpoint would carry them: megabytes of pages).
for (const name of ["importlib.metadata", "email.message", "tarfile", "zipfile", "encodings.cp437"]) {
  pyodide.pyimport(name).destroy();
}
const snapshot = pyodide.makeMemorySnapshot();
Deno.writeFileSync(Deno.args[0], snapshot);
// Pyodide 314 restores a snapshot only into its initial memory (30 MB), and a larger one fails with
// "offset is out of bounds" (pyodide#6254): a snapshot that does not load is refused here (a failed
// exit; the host then deletes the file), so that sandboxes load Pyodide from scratch instead of
// failing to start at all.
await loadPyodide({ ...PYODIDE_OPTIONS, _loadSnapshot: snapshot });
