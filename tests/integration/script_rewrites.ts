// How often each of script.ts's rewrites of Pyodide's runtime script finds its text in the file
// given (test_start_phases.py): once each, or the rewrite is left out and the start is slower.
import { REWRITES } from "../../mcp_sandbox/backends/pyodide/script.ts";

const source = Deno.readTextFileSync(Deno.args[0]);
console.log(JSON.stringify(REWRITES.map(([from]) => source.split(from).length - 1)));
