// pyodide#6254, with Pyodide's own API: a memory snapshot of a Pyodide whose Python holds
// `Deno.args[0]` MB (a bytearray), restored by a second loadPyodide({_loadSnapshot}) in the same
// process. bench_pyodide_versions.py runs it; it prints one JSON line: the snapshot's size, whether
// the restore worked (or its error), and whether the bytes survived.
import { loadPyodide } from "pyodide";

const mb = Number(Deno.args[0] ?? "40");
if (!Number.isInteger(mb) || mb < 0 || mb > 256) throw new Error("the size is 0-256 MB");
const FILL = `
import hashlib
big = bytearray(range(256)) * (${mb} * 4096)
digest = hashlib.sha256(big).hexdigest()
digest
`;
const CHECK = "import hashlib\nhashlib.sha256(big).hexdigest() == digest if 'big' in globals() else None";

const report: Record<string, unknown> = { mb };
const first = await loadPyodide({ _makeSnapshot: true });
report.heap_at_load = (first as unknown as { _module: { HEAP8: Uint8Array } })._module.HEAP8.length;
first.runPython(FILL);
const snapshot = first.makeMemorySnapshot();
report.snapshot_bytes = snapshot.length;
try {
  const started = performance.now();
  const second = await loadPyodide({ _loadSnapshot: snapshot });
  report.restore_ms = Math.round(performance.now() - started);
  report.restored = true;
  report.survived = second.runPython(CHECK) === true;
} catch (error) {
  report.restored = false;
  report.error = String(error).split("\n")[0].slice(0, 300);
}
console.log(JSON.stringify(report));
