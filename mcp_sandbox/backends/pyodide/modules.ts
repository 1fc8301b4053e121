// The guest's modules (mcp_sandbox.protocol, then the guest runtime), installed from their source
// as the CPython worker's load_module does, calling Python's own types.ModuleType, compile and
// exec: by snapshot.ts into the memory snapshot, and by a worker whose interpreter lacks them.
import type { PyodideInterface } from "pyodide";

// Loads those of `modules` the interpreter does not hold yet. A snapshot holds exactly these
// sources (its file's name is made from them, PyodideBackend._make_snapshot), so a module found
// is the one given.
export function loadGuestModules(pyodide: PyodideInterface, modules: [string, string][]): void {
  const builtins = pyodide.pyimport("builtins");
  const types = pyodide.pyimport("types");
  const sys = pyodide.pyimport("sys");
  const loaded = sys.modules;
  for (const [name, source] of modules) {
    if (loaded.has(name)) continue;
    const module = types.ModuleType(name);
    const namespace = module.__dict__;
    namespace.set("__file__", `<${name}>`);
    loaded.set(name, module);
    const code = builtins.compile(source, `<${name}>`, "exec");
    builtins.exec(code, namespace);
    for (const proxy of [code, namespace, module]) proxy.destroy();
  }
  for (const proxy of [loaded, sys, types, builtins]) proxy.destroy();
}
