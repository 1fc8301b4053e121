"""The strict code policy (`MCP_SANDBOX_POLICY=strict`): an AST check before code runs.

Imports outside an allowlist, escape-hatch builtins named in any
way (not only called), and dunder or frame attributes are rejected with a reason. It is
defense in depth for the CPython backends and not a boundary: Python offers too many ways
around any syntactic check (format strings, library functions that read files or unpickle).
The sandbox's limits are what hold; this only turns away the obvious attempts early.
"""

from __future__ import annotations

import ast

#: Top-level modules a strict program may import: data analysis and pure computation.
ALLOWED_MODULES = frozenset(
    {
        "__future__",
        "bisect",
        "calendar",
        "cmath",
        "collections",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "enum",
        "fractions",
        "functools",
        "heapq",
        "itertools",
        "json",
        "math",
        "matplotlib",
        "numpy",
        "operator",
        "pandas",
        "plotly",
        "pprint",
        "random",
        "re",
        "scipy",
        "statistics",
        "statsmodels",
        "string",
        "textwrap",
        "time",
        "typing",
    }
)

#: Builtins that reach files, code objects, frames or attributes by computed name.
BLOCKED_NAMES = frozenset(
    {
        "__builtins__",
        "__import__",
        "__loader__",
        "__spec__",
        "breakpoint",
        "compile",
        "delattr",
        "eval",
        "exec",
        "exit",
        "getattr",
        "globals",
        "help",
        "input",
        "locals",
        "open",
        "quit",
        "setattr",
        "vars",
    }
)

#: Dunder attributes ordinary code needs; every other `__x__` attribute is rejected.
ALLOWED_DUNDERS = frozenset({"__init__", "__name__", "__doc__", "__version__"})

#: Attributes that lead from an object to frames and globals.
BLOCKED_ATTRIBUTES = frozenset(
    {
        "ag_frame",
        "cr_frame",
        "f_back",
        "f_builtins",
        "f_globals",
        "f_locals",
        "gi_frame",
        "tb_frame",
        "tb_next",
    }
)


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _node_violation(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] not in ALLOWED_MODULES:
                return f"import of {alias.name!r} is not allowed"
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            return "relative imports are not allowed"
        if (node.module or "").split(".")[0] not in ALLOWED_MODULES:
            return f"import from {node.module!r} is not allowed"
    elif isinstance(node, ast.Name):
        if node.id in BLOCKED_NAMES:
            return f"{node.id!r} is not allowed"
        if _is_dunder(node.id) and node.id not in ALLOWED_DUNDERS:
            return f"the name {node.id!r} is not allowed"
    elif isinstance(node, ast.Attribute):
        if node.attr in BLOCKED_ATTRIBUTES or (_is_dunder(node.attr) and node.attr not in ALLOWED_DUNDERS):
            return f"the attribute {node.attr!r} is not allowed"
    return None


def policy_violation(code: str) -> str | None:
    """Why the strict policy rejects `code`, or None when it passes.

    Code that does not parse passes, so the sandbox reports the SyntaxError as usual.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    except (RecursionError, MemoryError):
        return "Rejected by the strict code policy (MCP_SANDBOX_POLICY=strict): too deeply nested to check."
    for node in ast.walk(tree):
        reason = _node_violation(node)
        if reason is not None:
            line = getattr(node, "lineno", "?")
            return (
                f"Rejected by the strict code policy (MCP_SANDBOX_POLICY=strict), line {line}: {reason}. "
                f"Allowed imports: {', '.join(sorted(ALLOWED_MODULES - {'__future__'}))}."
            )
    return None
