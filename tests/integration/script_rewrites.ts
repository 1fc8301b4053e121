// What rewrites.ts makes of Pyodide's runtime script, the file given (test_start_phases.py), by
// rewrite: how often each of its texts is found (once each, or it is left out whole and starts are
// slower), and what becomes of the script without its first text: a rewrite the sandbox depends
// on refuses it, any other is left out and the rest applied.
import { pyodideScript, REWRITES, unfit } from "../../mcp_sandbox/backends/pyodide/rewrites.ts";

const source = Deno.readTextFileSync(Deno.args[0]);
const count = (text: string) => source.split(text).length - 1;

function without(text: string): string {
  try {
    pyodideScript(source.replace(text, ""));
    return `made, leaving out ${JSON.stringify(unfit(source.replace(text, "")))}`;
  } catch (error) {
    return `refused: ${(error as Error).message}`;
  }
}

console.log(
  JSON.stringify(
    Object.fromEntries(
      REWRITES.map(({ why, required, replace }) => [
        why,
        { found: replace.map(([from]) => count(from)), required: required ?? false, without: without(replace[0][0]) },
      ]),
    ),
  ),
);
