// The options every Pyodide here is loaded with; a snapshot is only valid for the same ones.
export const HOME = "/home/sandbox";
export const PYODIDE_OPTIONS = { env: { HOME, MPLBACKEND: "Agg" } };
