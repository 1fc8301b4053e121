"""The upstream tools as sandboxed code sees them: Python names, signatures, docstrings, search.

Naming rule (documented in docs/bridge.md): every character that cannot appear in a Python
identifier becomes `_`; a name that starts with a digit gets a leading `_`; a keyword gets a
trailing `_` (`class` -> `class_`); a name already taken in the same place gets `_2`, `_3`, ...
The rule applies to server names, tool names and parameter names alike.
"""

from __future__ import annotations

import keyword
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcp_sandbox.protocol import ManifestParam, ManifestTool

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
    #: When the input schema allows properties it does not list (additionalProperties), the name
    #: of the guest function's **parameter that takes them (`other`); they are sent as given.
    other_keywords: str | None = None
    #: The upstream's schemas, shown by search_tools(detail="full"); never sent to a sandbox.
    input_schema: dict[str, Any] | None = field(default=None, repr=False)
    output_schema: dict[str, Any] | None = field(default=None, repr=False)
    doc: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self.doc = self._docstring()

    @property
    def signature(self) -> str:
        required = [p for p in self.params if p.required]
        optional = [p for p in self.params if not p.required]
        parts = [f"{p.py}: {p.annotation}" for p in required]
        parts += [f"{p.py}: {_optional(p.annotation)} = None" for p in optional]
        if self.other_keywords is not None:
            parts.append(f"**{self.other_keywords}")
        return f"tools.{self.server_py}.{self.name_py}({', '.join(parts)})"

    @property
    def summary(self) -> str:
        """The description's first sentence (what a search answer shows)."""
        return first_sentence(self.description) or f"The {self.name!r} tool of the {self.server!r} server."

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
            "Returns the tool's structured content as plain Python data (dict or list), else its text "
            "parsed when it is a JSON object or array, else its text. Raises ToolError with the "
            "upstream's message when the tool fails.",
            f"Upstream: server {self.server!r}, tool {self.name!r}. {twin}",
        ]
        return "\n".join(lines)

    def manifest(self) -> ManifestTool:
        """This tool's entry in the tool manifest, which the guest builds its functions from."""
        params: list[ManifestParam] = [
            {"name": p.name, "py": p.py, "annotation": p.annotation, "required": p.required}
            for p in self.params
        ]
        entry: ManifestTool = {
            "server_py": self.server_py,
            "name_py": self.name_py,
            "params": params,
            "doc": self.doc,
        }
        if self.other_keywords is not None:
            entry["other_keywords"] = self.other_keywords
        return entry


def _optional(annotation: str) -> str:
    # `= None` says it may be left out; `str | None = None` would say it twice.
    kinds = [kind for kind in annotation.split(" | ") if kind != "None"]
    return " | ".join(kinds) or "Any"


def first_sentence(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", text)
    sentence = match.group(1) if match else text
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


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


def takes_other_arguments(schema: Any) -> bool:
    """Whether an input schema says it takes properties besides those it lists. Only when it says
    so: most servers leave additionalProperties out and refuse what they did not list."""
    if not isinstance(schema, dict):
        return False
    more = schema.get("additionalProperties")
    return (
        more is True
        or (isinstance(more, dict) and more != {"not": {}})
        or bool(schema.get("patternProperties"))
    )


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
    return ToolSpec(
        server,
        server_py,
        name,
        name_py,
        params,
        description or "",
        _wraps_result(output_schema),
        other_keywords=python_name("other", taken) if takes_other_arguments(schema) else None,
        input_schema=schema if isinstance(schema, dict) else None,
        output_schema=output_schema if isinstance(output_schema, dict) else None,
    )


#: What a search that finds nothing says.
NO_MATCH = "no tool matches; try other words, or an empty query to list them"
#: Words a query carries that say nothing about which tool: "create a jira item".
STOPWORDS = frozenset(
    "a an and any all as at be by for from get i in into is it me my of on or please some the "
    "this that to up use using want we with you".split()
)
#: BM25's usual constants; name words count NAME_WEIGHT times (a tool's name says what it does).
BM25_K1, BM25_B, NAME_WEIGHT = 1.2, 0.75, 3


def words(text: str) -> list[str]:
    """Lower-case words of `text`, split at case changes, digits and punctuation
    (`createJiraItem`, `jira_create_item` -> create, jira, item), each stemmed lightly."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    return [_stem(word) for word in re.split(r"[^a-z0-9]+", spaced.lower()) if word]


def _stem(word: str) -> str:
    # Plurals and -ing/-ed forms meet their stem: items/item, issues/issue, listing/list.
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", "e"), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: len(word) - len(suffix)] + keep
    return word


def _document(spec: ToolSpec) -> list[str]:
    name = words(f"{spec.server} {spec.name}")
    text = words(f"{spec.description} {' '.join(p.name + ' ' + p.description for p in spec.params)}")
    return name * NAME_WEIGHT + text


class SearchIndex:
    """The tools ranked by BM25 over their names (weighted) and descriptions; built once per
    catalog, so a search over 1,000 tools costs milliseconds."""

    def __init__(self, specs: list[ToolSpec]) -> None:
        self.specs = specs
        self._documents = [Counter(_document(spec)) for spec in specs]
        self._lengths = [sum(document.values()) for document in self._documents]
        self._average = sum(self._lengths) / len(self._lengths) if self._lengths else 1.0
        self._having: Counter[str] = Counter(term for document in self._documents for term in document)

    def search(self, query: str, limit: int) -> list[ToolSpec]:
        """The `limit` best matches for `query`; an empty query (or stop words only) lists the first."""
        terms = [word for word in dict.fromkeys(words(query)) if word not in STOPWORDS]
        if not terms:
            return self.specs[:limit]
        count = len(self.specs)
        idf = {
            term: math.log(1 + (count - self._having[term] + 0.5) / (self._having[term] + 0.5))
            for term in terms
        }
        scored: list[tuple[float, int]] = []
        for index, (document, length) in enumerate(zip(self._documents, self._lengths, strict=True)):
            norm = BM25_K1 * (1 - BM25_B + BM25_B * length / self._average)
            score = sum(
                idf[term] * document[term] * (BM25_K1 + 1) / (document[term] + norm)
                for term in terms
                if term in document
            )
            if score > 0:
                scored.append((-score, index))
        return [self.specs[index] for _, index in sorted(scored)[:limit]]


def search(specs: list[ToolSpec], query: str, limit: int) -> list[ToolSpec]:
    """One search without keeping the index (tests, one-off callers)."""
    return SearchIndex(specs).search(query, limit)
