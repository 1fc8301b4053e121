"""The check of a program's tool calls before it runs: a call `tools.<server>.<tool>(name=...)`
whose server, tool or keyword the catalog does not have is refused before anything runs, so a
program does not make half its calls (sending mail, filing tickets) and then fail on a typo.

Only what the code says literally is checked. A program that binds `tools` itself, or reaches
names dynamically (getattr, globals, exec), is not checked at all; `**arguments` and positional
arguments pass as they are; a server still connecting, whose tools are not listed yet, passes.
The guest checks each call again when it is made.
"""

from __future__ import annotations

import ast
import difflib
from collections.abc import Mapping
from dataclasses import dataclass

from mcp_sandbox.bridge.catalog import ToolSpec
from mcp_sandbox.protocol import closest_hint

#: Wrong calls one refusal names at most.
MAX_REPORTED = 10
#: Builtins that can rebind or reach `tools` by a computed name: their presence stops the check.
DYNAMIC_NAMES = frozenset({"globals", "locals", "vars", "exec", "eval", "setattr", "delattr", "__import__"})


@dataclass(frozen=True)
class WrongCall:
    """One call the catalog says cannot work: where, what, and the tool's signature when known."""

    line: int
    call: str
    problem: str
    signature: str | None = None

    def explain(self) -> str:
        text = f"line {self.line}: {self.call}: {self.problem}"
        return text + (f"\n    signature: {self.signature}" if self.signature else "")


@dataclass(frozen=True)
class Catalog:
    """What the check knows: every listed tool by (server, tool) Python names, and the servers
    whose tools are not known yet (configured, still connecting)."""

    specs: Mapping[tuple[str, str], ToolSpec]
    unlisted_servers: frozenset[str] = frozenset()

    def servers(self) -> list[str]:
        return list(dict.fromkeys(server for server, _ in self.specs))

    def find(self, server: str, tool: str) -> ToolSpec | None:
        """The tool `tools.<server>.<tool>` calls, its async twin's included."""
        if (server, tool) not in self.specs and tool.endswith("_async"):
            tool = tool.removesuffix("_async")
        return self.specs.get((server, tool))

    def tools_of(self, server: str, twins: bool) -> list[str]:
        suffix = "_async" if twins else ""
        return [tool + suffix for s, tool in self.specs if s == server]


def wrong_tool_calls(code: str, catalog: Catalog) -> list[WrongCall]:
    """The calls in `code` that name a server, a tool or a keyword the catalog does not have, in
    the order they appear. Code that does not parse has none (the sandbox reports its SyntaxError)."""
    if "tools" not in code:
        return []  # most programs: no parse needed
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    nodes = list(ast.walk(tree))
    if any(_rebinds_tools(node) for node in nodes):
        return []
    wrong = [
        problem
        for node in nodes
        if isinstance(node, ast.Call) and (problem := _check_call(node, catalog)) is not None
    ]
    return sorted(wrong, key=lambda call: call.line)


def wrong_calls_message(wrong: list[WrongCall]) -> str:
    """The error of a program refused for its wrong calls: what is wrong, the closest names and
    the signature, for each (at most MAX_REPORTED)."""
    calls = "a tool call names" if len(wrong) == 1 else f"{len(wrong)} tool calls name"
    lines = [f"Nothing ran: checked before running, {calls} a server, tool or argument that does not exist."]
    lines += [call.explain() for call in wrong[:MAX_REPORTED]]
    if len(wrong) > MAX_REPORTED:
        lines.append(f"... and {len(wrong) - MAX_REPORTED} more")
    return "\n".join(lines)


def _rebinds_tools(node: ast.AST) -> bool:
    """Whether `node` may give `tools`, or an attribute of it, another value than the bridge's."""
    if isinstance(node, ast.Name):
        return (node.id == "tools" and not isinstance(node.ctx, ast.Load)) or node.id in DYNAMIC_NAMES
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return _is_tools(node.value) or (
            isinstance(node.value, ast.Attribute) and _is_tools(node.value.value)
        )
    if isinstance(node, ast.arg):
        return node.arg == "tools"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == "tools"
    if isinstance(node, ast.alias):
        return (node.asname or node.name.split(".")[0]) in ("tools", "*")
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return "tools" in node.names
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
        return node.name == "tools"
    if isinstance(node, ast.MatchMapping):
        return node.rest == "tools"
    return False


def _is_tools(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "tools"


def _check_call(node: ast.Call, catalog: Catalog) -> WrongCall | None:
    function = node.func
    if not (
        isinstance(function, ast.Attribute)
        and isinstance(function.value, ast.Attribute)
        and _is_tools(function.value.value)
    ):
        return None
    server, tool = function.value.attr, function.attr
    called = f"tools.{server}.{tool}(...)"
    if server in catalog.unlisted_servers:
        return None  # its tools are not known yet
    servers = catalog.servers()
    if server not in servers:
        problem = f"there is no upstream MCP server {server!r}{closest_hint(server, servers)}"
        likely = next(iter(difflib.get_close_matches(server, servers, n=1, cutoff=0.5)), None)
        meant = catalog.find(likely, tool) if likely is not None else None
        return WrongCall(node.lineno, called, problem, meant.signature if meant is not None else None)
    spec = catalog.find(server, tool)
    if spec is None:
        names = catalog.tools_of(server, tool.endswith("_async"))
        likely = next(iter(difflib.get_close_matches(tool, names, n=1, cutoff=0.5)), None)
        meant = catalog.find(server, likely) if likely is not None else None
        problem = f"the {server} server has no tool {tool!r}{closest_hint(tool, names)}"
        return WrongCall(node.lineno, called, problem, meant.signature if meant is not None else None)
    return _check_arguments(node, spec, called)


def _check_arguments(node: ast.Call, spec: ToolSpec, called: str) -> WrongCall | None:
    if spec.other_keywords is not None:
        return None  # its schema takes any keyword
    known = [param.py for param in spec.params]
    unknown = [k.arg for k in node.keywords if k.arg is not None and k.arg not in known]
    if not unknown:
        return None
    hints = [f"{name!r} is not one of its arguments{closest_hint(name, known)}" for name in unknown]
    if not any(isinstance(a, ast.Starred) for a in node.args) and all(k.arg for k in node.keywords):
        # Everything it is given is in sight, so a required argument left out is certain too.
        ordered = [p for p in spec.params if p.required] + [p for p in spec.params if not p.required]
        given = {p.py for p in ordered[: len(node.args)]} | {k.arg for k in node.keywords}
        hints += [
            f"{p.py!r} ({p.annotation}) is required" for p in ordered if p.required and p.py not in given
        ]
    return WrongCall(node.lineno, called, "; ".join(hints), spec.signature)
