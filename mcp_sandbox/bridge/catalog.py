"""The upstream tools as sandboxed code sees them: Python names, signatures, docstrings, search.

Naming rule (documented in the README): every character that cannot appear in a Python
identifier becomes `_`; a name that starts with a digit gets a leading `_`; a keyword gets a
trailing `_` (`class` -> `class_`); a name already taken in the same place gets `_2`, `_3`, ...
The rule applies to server names, tool names and parameter names alike.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import asdict, dataclass, field
from typing import Any

_NOT_IDENTIFIER = re.compile(r"\W", re.ASCII)
#: Where local tools (host callables) live in the guest: `tools.local`. When a bridge has local
#: tools, an upstream server of that name is named `local_2`.
LOCAL_SERVER = "local"

#: JSON Schema types and the Python annotation a signature shows for them.
JSON_TYPES = {
    "string": "str",
    "integer": "int",
    "number": "float",
    "boolean": "bool",
    "array": "list",
    "object": "dict",
    "null": "None",
}


def python_name(name: str, taken: set[str] | None = None) -> str:
    """`name` made a Python identifier, unique within `taken` (which it joins)."""
    candidate = _NOT_IDENTIFIER.sub("_", name) or "_"
    if candidate[0].isdigit():
        candidate = "_" + candidate
    if keyword.iskeyword(candidate):
        candidate += "_"
    if taken is None:
        return candidate
    unique, n = candidate, 1
    while unique in taken:
        n += 1
        unique = f"{candidate}_{n}"
    taken.add(unique)
    return unique


@dataclass
class ParamSpec:
    name: str  # as the upstream schema spells it
    py: str
    annotation: str
    required: bool
    description: str = ""


@dataclass
class ToolSpec:
    """One upstream tool: what the guest needs to build `tools.<server>.<tool>`."""

    server: str
    server_py: str
    name: str
    name_py: str
    params: list[ParamSpec]
    description: str = ""
    #: The output schema is only {"result": ...}: how Python MCP servers wrap a non-object return.
    unwrap_result: bool = False
    #: A host Python callable (bridge/local.py) rather than an upstream MCP tool.
    local: bool = False
    doc: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.doc = self._docstring()

    @property
    def signature(self) -> str:
        required = [p for p in self.params if p.required]
        optional = [p for p in self.params if not p.required]
        parts = [f"{p.py}: {p.annotation}" for p in required]
        parts += [f"{p.py}: {p.annotation} | None = None" for p in optional]
        return f"tools.{self.server_py}.{self.name_py}({', '.join(parts)})"

    def _docstring(self) -> str:
        lines = [self.description.strip() or f"The {self.name!r} tool of the {self.server!r} server."]
        if self.params:
            lines += ["", "Args:"]
            for p in self.params:
                note = p.description.strip().replace("\n", " ")
                optional = "" if p.required else ", optional"
                lines.append(f"    {p.py} ({p.annotation}{optional}): {note}".rstrip(": ").rstrip())
        twin = f"Async twin: await tools.{self.server_py}.{self.name_py}_async(...)."
        if self.local:
            lines += [
                "",
                "Runs on the host. Returns its value as plain Python data; raises ToolError with the "
                "host's message when it fails.",
                twin,
            ]
            return "\n".join(lines)
        lines += [
            "",
            "Returns the tool's structured content as plain Python data (dict or list), or its text "
            "when it has none. Raises ToolError with the upstream's message when the tool fails.",
            f"Upstream: server {self.server!r}, tool {self.name!r}. {twin}",
        ]
        return "\n".join(lines)

    def manifest(self) -> dict[str, Any]:
        """The JSON-ready form the guest runtime builds functions from."""
        return asdict(self)


def _annotation(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "Any"
    kind = schema.get("type")
    if isinstance(kind, list):
        names = [JSON_TYPES.get(k, "Any") for k in kind if isinstance(k, str)]
        return " | ".join(dict.fromkeys(names)) if names and "Any" not in names else "Any"
    if isinstance(kind, str):
        return JSON_TYPES.get(kind, "Any")
    for union in ("anyOf", "oneOf"):
        if isinstance(schema.get(union), list):
            names = [_annotation(option) for option in schema[union]]
            return " | ".join(dict.fromkeys(names)) if "Any" not in names else "Any"
    return "Any"


def _wraps_result(output_schema: Any) -> bool:
    if not isinstance(output_schema, dict) or not isinstance(output_schema.get("properties"), dict):
        return False
    return set(output_schema["properties"]) == {"result"}


def tool_spec(
    server: str,
    server_py: str,
    name: str,
    name_py: str,
    description: str | None,
    schema: Any,
    output_schema: Any = None,
) -> ToolSpec:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    required = set(schema.get("required") or []) if isinstance(schema, dict) else set()
    params: list[ParamSpec] = []
    taken: set[str] = set()
    for param_name, param_schema in (properties or {}).items():
        text = param_schema.get("description", "") if isinstance(param_schema, dict) else ""
        params.append(
            ParamSpec(
                name=param_name,
                py=python_name(param_name, taken),
                annotation=_annotation(param_schema),
                required=param_name in required,
                description=text if isinstance(text, str) else "",
            )
        )
    return ToolSpec(server, server_py, name, name_py, params, description or "", _wraps_result(output_schema))


def search(specs: list[ToolSpec], query: str, limit: int) -> list[ToolSpec]:
    """The tools whose names and descriptions best match the words of `query`."""
    words = [w for w in re.split(r"\W+", query.lower()) if w]
    if not words:
        return specs[:limit]
    scored: list[tuple[int, int, ToolSpec]] = []
    for index, spec in enumerate(specs):
        name = f"{spec.server} {spec.name} {spec.server_py} {spec.name_py}".lower()
        text = f"{spec.description} {' '.join(p.name + ' ' + p.description for p in spec.params)}".lower()
        score = sum(3 * (w in name) + (w in text) for w in words)
        if score:
            scored.append((-score, index, spec))
    return [spec for _, _, spec in sorted(scored, key=lambda item: item[:2])[:limit]]
