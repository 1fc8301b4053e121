"""The tools as Python stubs (`search_tools(detail="stub")`, `tools.describe(...)` in a sandbox):
for each tool a TypedDict of its arguments, one of its result when it has an output schema, and
its function where code calls it, `tools.<server>.<tool>`. The text is valid Python: a model reads
it as the code it is about to write, and a type checker could check that code against it.

JSON Schema maps to annotations as closely as Python says it: string/integer/number/boolean/null
to str/int/float/bool/None, arrays to list[items], objects with properties to TypedDicts (keys
that are not identifiers in the functional form), other objects to dict[str, values], enum and
const to Literal, anyOf/oneOf and type lists to unions, $ref into $defs (or definitions) to a
TypedDict named after the definition; anything else is Any.
"""

from __future__ import annotations

import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from mcp_sandbox.bridge.catalog import NO_MATCH, ToolSpec, first_sentence, python_name

#: Enums longer than this show their type, not every value (a list of 200 countries).
MAX_LITERAL_VALUES = 50
#: A property's comment: its description's first sentence, cut to this many characters.
MAX_COMMENT_CHARS = 100
#: Nested schemas deeper than this show as Any (a schema can nest without end).
MAX_DEPTH = 12
_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_TYPING_NAMES = ("Any", "Literal", "NotRequired", "TypedDict", "Unpack")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def camel(name: str) -> str:
    """`jira_create_item` -> `JiraCreateItem`: a class name from any tool, field or definition name."""
    parts = [part for part in re.split(r"[^A-Za-z0-9]+", name) if part]
    return python_name("".join(part[0].upper() + part[1:] for part in parts) or "T")


@dataclass
class _Root:
    """The schema a $ref resolves in: the input or output schema it came from."""

    definitions: dict[str, Any]

    @classmethod
    def of(cls, schema: Any) -> _Root:
        found: dict[str, Any] = {}
        if isinstance(schema, dict):
            for key in ("definitions", "$defs"):
                if isinstance(schema.get(key), dict):
                    found |= schema[key]
        return cls(found)


@dataclass
class StubWriter:
    """Writes one stub text: the TypedDicts first, each after the ones it uses (a recursive one
    names itself in quotes), then `class tools:` with one class per server."""

    #: Class names in use; a second `Item` is `Item2`.
    taken: set[str] = field(default_factory=lambda: {"tools", *_TYPING_NAMES})
    definitions: list[str] = field(default_factory=list)
    #: Names being written (a reference to one is a forward reference, so it is quoted).
    _open: set[str] = field(default_factory=set)
    #: $defs already written, by their content: tools sharing a model share its TypedDict.
    _written_refs: dict[str, str] = field(default_factory=dict)
    _used: set[str] = field(default_factory=set)

    def class_name(self, wanted: str) -> str:
        name, n = wanted, 1
        while name in self.taken or keyword.iskeyword(name):
            n += 1
            name = f"{wanted}{n}"
        self.taken.add(name)
        return name

    def annotation(self, schema: Any, hint: str, root: _Root, depth: int = 0) -> str:
        """The Python annotation of `schema`; objects with properties become TypedDicts named from `hint`."""
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return self._any()
        ref = schema.get("$ref")
        if isinstance(ref, str):
            return self._reference(ref, root, depth)
        if "const" in schema and _literal_value(schema["const"]):
            return self._literal([schema["const"]])
        values = schema.get("enum")
        if isinstance(values, list) and values and len(values) <= MAX_LITERAL_VALUES:
            if all(_literal_value(value) for value in values):
                return self._literal(values)
        for union in ("anyOf", "oneOf"):
            options = schema.get(union)
            if isinstance(options, list) and options:
                return self._union(
                    [
                        self.annotation(option, hint, root, depth + 1)
                        for option in options
                        if option is not None
                    ]
                )
        every = schema.get("allOf")
        if isinstance(every, list) and len(every) == 1:
            return self.annotation(every[0], hint, root, depth + 1)
        kind = schema.get("type")
        if kind is None:
            kind = "object" if "properties" in schema else "array" if "items" in schema else None
        if isinstance(kind, list):
            return self._union([self._typed(schema, k, hint, root, depth) for k in kind])
        return self._typed(schema, kind, hint, root, depth)

    def _typed(self, schema: dict[str, Any], kind: Any, hint: str, root: _Root, depth: int) -> str:
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array":
            items = schema.get("items", schema.get("prefixItems"))
            if isinstance(items, list):  # a tuple's items: JSON gives a list of them
                options = [self.annotation(item, hint + "Item", root, depth + 1) for item in items]
                return f"list[{self._union(options)}]"
            if isinstance(items, dict):
                return f"list[{self.annotation(items, hint + 'Item', root, depth + 1)}]"
            return f"list[{self._any()}]"
        if kind == "object":
            properties = schema.get("properties")
            if isinstance(properties, dict) and properties:
                return self.typed_dict(self.class_name(hint), schema, root, depth)
            values = schema.get("additionalProperties")
            if isinstance(values, dict) and values:
                return f"dict[str, {self.annotation(values, hint + 'Value', root, depth + 1)}]"
            return f"dict[str, {self._any()}]"
        return self._any()

    def _reference(self, ref: str, root: _Root, depth: int) -> str:
        name = ref.rsplit("/", 1)[-1]
        target = root.definitions.get(name) if ref.startswith(("#/$defs/", "#/definitions/")) else None
        if target is None:
            return self._any()
        key = json.dumps([name, root.definitions], sort_keys=True, default=str)
        written = self._written_refs.get(key)
        if written is not None:
            return written
        if isinstance(target, dict) and isinstance(target.get("properties"), dict) and target["properties"]:
            class_name = self.class_name(camel(name))
            self._written_refs[key] = class_name  # a recursive reference finds it while it is written
            return self.typed_dict(class_name, target, root, depth)
        self._written_refs[key] = self._any()  # a definition that refers to itself without an object
        text = self.annotation(target, camel(name), root, depth + 1)
        self._written_refs[key] = text
        return text

    def typed_dict(self, name: str, schema: dict[str, Any], root: _Root, depth: int) -> str:
        """Write the TypedDict `name` of an object schema's properties; returns `name`."""
        required = set(schema.get("required") or [])
        self._open.add(name)
        fields = [
            _Field(
                key,
                key in required,
                schema["properties"][key],
                self.annotation(schema["properties"][key], name + camel(key), root, depth + 1),
            )
            for key in schema["properties"]
        ]
        return self._write(name, fields)

    def arguments(self, spec: ToolSpec) -> str | None:
        """Write `<Tool>Args`, keyed by the Python names the call takes; None for a tool without any."""
        if not spec.params:
            return None
        name = self.class_name(camel(spec.name_py) + "Args")
        self._open.add(name)
        root = _Root.of(spec.input_schema)
        properties = (spec.input_schema or {}).get("properties") or {}
        fields = []
        for param in spec.params:
            schema = properties.get(param.name)
            if isinstance(schema, dict):
                text = self.annotation(schema, camel(spec.name_py) + camel(param.py), root, 1)
            else:  # a local tool: its annotation comes from the host callable
                text, schema = param.annotation, {"description": param.description}
                self._used.update(word for word in _WORD.findall(text) if word in _TYPING_NAMES)
            fields.append(_Field(param.py, param.required, schema, text))
        return self._write(name, fields)

    def result(self, spec: ToolSpec) -> str:
        """The annotation of what a call returns: its output schema's (unwrapped, when the tool only
        wraps its value in {"result": ...}), else Any."""
        schema = spec.output_schema
        if schema is None:
            return self._any()
        root = _Root.of(schema)
        if spec.unwrap_result:
            return self.annotation(schema["properties"]["result"], camel(spec.name_py) + "Result", root, 1)
        hint = camel(spec.name_py) + "Result"
        if isinstance(schema.get("properties"), dict) and schema["properties"]:
            return self.typed_dict(self.class_name(hint), schema, root, 1)
        return self.annotation(schema, hint, root, 1)

    def _write(self, name: str, fields: list[_Field]) -> str:
        """Append the TypedDict `name` (opened by the caller before its fields were annotated)."""
        self._used.add("TypedDict")
        lines = []
        for item in fields:
            text = item.annotation
            if any(word in self._open for word in _WORD.findall(text)):
                text = repr(text)  # a forward reference: the class is not defined yet
            if not item.required:
                self._used.add("NotRequired")
                text = f"NotRequired[{text}]"
            lines.append((item.key, text, item.comment))
        self._open.discard(name)
        if all(key.isidentifier() and not keyword.iskeyword(key) for key, _, _ in lines):
            body = [
                f"    {key}: {text}" + (f"  # {comment}" if comment else "") for key, text, comment in lines
            ]
            self.definitions.append(f"class {name}(TypedDict):\n" + "\n".join(body))
        else:  # keys that cannot be attribute names: the functional form takes any string
            body = [
                f"    {json.dumps(key, ensure_ascii=False)}: {text}," + (f"  # {comment}" if comment else "")
                for key, text, comment in lines
            ]
            self.definitions.append(f"{name} = TypedDict({name!r}, {{\n" + "\n".join(body) + "\n})")
        return name

    def _literal(self, values: list[Any]) -> str:
        self._used.add("Literal")
        shown = [json.dumps(v, ensure_ascii=False) if isinstance(v, str) else repr(v) for v in values]
        return f"Literal[{', '.join(dict.fromkeys(shown))}]"

    def _union(self, options: list[str]) -> str:
        if not options or "Any" in options:
            return self._any()
        return " | ".join(dict.fromkeys(options))

    def _any(self) -> str:
        self._used.add("Any")
        return "Any"

    def header(self) -> str:
        used = sorted(self._used)
        return f"from typing import {', '.join(used)}" if used else ""

    def function(self, spec: ToolSpec) -> list[str]:
        """The tool's `def`, its arguments unpacked from `<Tool>Args`, its docstring the first sentence."""
        arguments = self.arguments(spec)
        returns = self.result(spec)
        parameters = ""
        if arguments is not None:
            self._used.add("Unpack")
            parameters = f"**arguments: Unpack[{arguments}]"
        lines = []
        if spec.name != spec.name_py:
            lines.append(f"# upstream: tool {spec.name!r}")
        other = "  # takes other keywords too (additionalProperties)" if spec.other_keywords else ""
        lines.append(f"def {spec.name_py}({parameters}) -> {returns}:{other}")
        lines.append(f"    {_docstring(spec.summary)}")
        return lines


@dataclass
class _Field:
    key: str
    required: bool
    schema: Any
    annotation: str

    @property
    def comment(self) -> str:
        """The property's description's first sentence, its format and its default."""
        schema = self.schema if isinstance(self.schema, dict) else {}
        text = schema.get("description")
        parts = [first_sentence(text, MAX_COMMENT_CHARS)] if isinstance(text, str) and text.strip() else []
        parts = ["".join(c if c.isprintable() else " " for c in part) for part in parts]  # a NUL ends a parse
        if isinstance(schema.get("format"), str):
            parts.append(f"Format {schema['format']}.")
        if "default" in schema and schema["default"] is not None:
            default = repr(schema["default"])  # as Python writes it: False, not false
            if len(default) <= 40:
                parts.append(f"Default {default}.")
        return " ".join(parts)


def _literal_value(value: Any) -> bool:
    return value is None or isinstance(value, (str, int))  # bool is an int


def _docstring(text: str) -> str:
    if '"""' in text or "\\" in text or text.endswith('"') or not text.isprintable():
        return json.dumps(text, ensure_ascii=False)  # still a string literal, so still a docstring
    return f'"""{text}"""'


def stubs(specs: list[ToolSpec], note: str = "") -> str:
    """Python stubs for `specs`, grouped by server in the order given; `note` ends the text as a
    comment (how many of how many tools)."""
    writer = StubWriter()
    servers: dict[tuple[str, str], list[str]] = {}
    for spec in specs:
        servers.setdefault((spec.server_py, spec.server), []).extend(writer.function(spec))
    blocks = [writer.header(), *writer.definitions] if specs else [f"# {NO_MATCH}"]
    if servers:
        namespace = [
            "class tools:  # each tool also has an async twin: await tools.<server>.<tool>_async(...)"
        ]
        for (server_py, server), lines in servers.items():
            upstream = f"  # upstream: server {server!r}" if server != server_py else ""
            namespace.append(f"    class {server_py}:{upstream}")
            namespace += [f"        {line}" for line in lines]
        blocks.append("\n".join(namespace))
    if note:
        blocks.append(f"# {note}")
    return "\n\n".join(block for block in blocks if block)
