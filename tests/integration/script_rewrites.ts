// How often each text of rewrites.ts's rewrites of Pyodide's runtime script is found in the file given
// (test_start_phases.py), by rewrite: once each, or that rewrite is left out whole and starts are slower.
import { REWRITES } from "../../mcp_sandbox/backends/pyodide/rewrites.ts";

const source = Deno.readTextFileSync(Deno.args[0]);
const count = (text: string) => source.split(text).length - 1;
console.log(
  JSON.stringify(Object.fromEntries(REWRITES.map(({ why, replace }) => [why, replace.map(([from]) => count(from))]))),
);
