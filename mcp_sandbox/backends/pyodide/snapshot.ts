// Makes the Pyodide memory snapshot that sandboxes start from: loading Pyodide from scratch
// takes seconds, restoring a snapshot much less. Run once per Pyodide version, by the host's
// PyodideBackend.prepare(): `deno run ... snapshot.ts <file to write>`.
import { loadPyodide } from "pyodide";
import { PYODIDE_OPTIONS } from "./options.ts";

const pyodide = await loadPyodide({ ...PYODIDE_OPTIONS, _makeSnapshot: true });
Deno.writeFileSync(Deno.args[0], pyodide.makeMemorySnapshot());
