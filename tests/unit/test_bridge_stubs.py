"""Python stubs of the bridged tools (search_tools(detail="stub"), tools.describe): JSON Schema to
TypedDicts and signatures, checked by parsing and running the text they give."""

from __future__ import annotations

import ast
import typing
from typing import Any, Literal, NotRequired, Unpack, get_args, get_type_hints

from mcp_sandbox.bridge.catalog import ToolSpec, tool_spec
from mcp_sandbox.bridge.local import local_tool_spec
from mcp_sandbox.bridge.stubs import stubs

#: What many_server's tools take (pydantic's schema of its `answer` function, as the SDK lists it).
MANY_INPUT = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "What the item is about, in words."},
        "limit": {"type": "integer", "default": 10, "description": "How many items to return at most."},
        "cursor": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "fields": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "dry_run": {"type": "boolean", "default": False},
    },
    "required": ["query"],
}


def hints_of(
    typed: Any, globalns: dict[str, Any] | None = None, include_extras: bool = True
) -> dict[str, Any]:
    """The annotations of a TypedDict or function, NotRequired kept."""
    return get_type_hints(typed, globalns=globalns, include_extras=include_extras)


def defined(text: str) -> dict[str, Any]:
    """What the stub text defines when run, after checking it parses; the typing names it uses
    are in the namespace beforehand too, as in a program that imports them."""
    ast.parse(text)
    namespace: dict[str, Any] = {name: getattr(typing, name) for name in typing.__all__}
    exec(compile(text, "<stub>", "exec", dont_inherit=True), namespace)  # no __future__ of ours
    return namespace


def spec(
    name: str, schema: dict[str, Any], output: dict[str, Any] | None = None, server: str = "s"
) -> ToolSpec:
    return tool_spec(server, server, name, name, f"Does {name}. More words here.", schema, output)


def test_a_tool_gets_its_arguments_typed_dict_and_its_function_where_code_calls_it() -> None:
    text = stubs([spec("jira_create_item", MANY_INPUT, server="many")], "1 of 100 tools")
    names = defined(text)
    arguments = names["JiraCreateItemArgs"]
    assert arguments.__required_keys__ == {"query"}
    assert arguments.__optional_keys__ == {"limit", "cursor", "fields", "dry_run"}
    hints = hints_of(arguments)
    assert hints == {
        "query": str,
        "limit": NotRequired[int],
        "cursor": NotRequired[str | None],
        "fields": NotRequired[list[str] | None],
        "dry_run": NotRequired[bool],
    }
    function = names["tools"].many.jira_create_item
    assert function.__doc__ == "Does jira_create_item."
    assert function.__annotations__["return"] is Any  # no output schema
    assert "    limit: NotRequired[int]  # How many items to return at most. Default 10.\n" in text
    assert "dry_run: NotRequired[bool]  # Default False.\n" in text
    assert text.startswith("from typing import ") and text.endswith("\n\n# 1 of 100 tools")
    assert "def jira_create_item(**arguments: Unpack[JiraCreateItemArgs]) -> Any:" in text


def test_nested_objects_enums_consts_and_unions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "priority": {"type": "string", "enum": ["low", "high"]},
            "kind": {"const": "bug"},
            "level": {"enum": [1, 2, None]},
            "ratio": {"enum": [0.5, 1.5], "type": "number"},  # floats cannot be Literal values
            "assignee": {
                "type": "object",
                "properties": {"id": {"type": "integer"}, "email": {"type": ["string", "null"]}},
                "required": ["id"],
            },
            "tags": {
                "type": "array",
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            },
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
            "scores": {"type": "object", "additionalProperties": {"type": "number"}},
            "anything": {},
            "either": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "odd": {"type": "uuid-ish"},
        },
        "required": ["priority", "assignee"],
    }
    names = defined(stubs([spec("file_bug", schema)]))
    hints = hints_of(names["FileBugArgs"])
    assert hints["priority"] == Literal["low", "high"] and hints["kind"] == NotRequired[Literal["bug"]]
    assert hints["level"] == NotRequired[Literal[1, 2, None]]
    assert hints["ratio"] == NotRequired[float]
    assignee = hints["assignee"]
    assert assignee.__name__ == "FileBugAssignee" and assignee.__required_keys__ == {"id"}
    assert hints_of(assignee)["email"] == NotRequired[str | None]
    ((item,),) = (get_args(tags) for tags in get_args(hints["tags"]))
    assert item.__name__ == "FileBugTagsItem" and hints_of(item)["name"] == NotRequired[str]
    assert hints["pair"] == NotRequired[list[str | int]]
    assert hints["scores"] == NotRequired[dict[str, float]]
    assert hints["anything"] == NotRequired[Any] and hints["odd"] == NotRequired[Any]
    assert hints["either"] == NotRequired[str | int]


def test_refs_into_defs_are_named_typed_dicts_even_when_recursive() -> None:
    schema = {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/Node"}, "state": {"$ref": "#/$defs/State"}},
        "required": ["root"],
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                    "owner": {"$ref": "#/$defs/Person"},
                },
                "required": ["name"],
            },
            "Person": {"type": "object", "properties": {"manages": {"$ref": "#/$defs/Node"}}},
            "State": {"type": "string", "enum": ["open", "closed"]},
        },
    }
    output = {
        "type": "object",
        "properties": {"node": {"$ref": "#/definitions/Node"}},
        "definitions": schema["$defs"],
    }
    text = stubs([spec("make_tree", schema, output), spec("grow_tree", schema)])
    names = defined(text)
    node, person = names["Node"], names["Person"]
    assert hints_of(node, globalns=names)["children"] == NotRequired[list[node]]
    assert hints_of(person, globalns=names)["manages"] == NotRequired[node]
    arguments = hints_of(names["MakeTreeArgs"])
    assert arguments["root"] is node and arguments["state"] == NotRequired[Literal["open", "closed"]]
    assert hints_of(names["MakeTreeResult"], globalns=names)["node"] == NotRequired[node]
    # Tools sharing a definition share its TypedDict, written once.
    assert text.count("class Node(TypedDict)") == 1 and "Node2" not in text
    assert hints_of(names["GrowTreeArgs"])["root"] is node


def test_names_that_are_not_identifiers_use_the_functional_form() -> None:
    schema = {
        "type": "object",
        "properties": {
            "issue-key": {"type": "string"},
            "filter": {
                "type": "object",
                "properties": {
                    "created-at": {"type": "string", "format": "date-time"},
                    "from": {"type": "integer"},
                },
                "required": ["from"],
            },
        },
        "required": ["issue-key"],
    }
    output = {"type": "object", "properties": {"x-total": {"type": "integer"}, "class": {"type": "string"}}}
    got = tool_spec("web search", "web_search", "get-issue", "get_issue", "Get one.", schema, output)
    text = stubs([got])
    names = defined(text)
    # The arguments are keyed as the call takes them (Python names); nested data as the upstream spells it.
    arguments = names["GetIssueArgs"]
    assert arguments.__required_keys__ == {"issue_key"}
    filters = hints_of(arguments)["filter"]
    assert get_args(filters)[0].__required_keys__ == {"from"}
    assert '"created-at": NotRequired[str],  # Format date-time.' in text
    assert names["GetIssueResult"].__optional_keys__ == {"x-total", "class"}
    assert "class web_search:  # upstream: server 'web search'" in text
    assert "# upstream: tool 'get-issue'" in text and names["tools"].web_search.get_issue


def test_result_shapes_and_tools_without_arguments() -> None:
    wrapped = {"type": "object", "properties": {"result": {"type": "array", "items": {"type": "integer"}}}}
    untyped_object = {"type": "object"}
    names = defined(
        stubs(
            [
                spec("numbers", {"type": "object", "properties": {}}, wrapped),
                spec("blob", {}, untyped_object),
            ]
        )
    )
    assert names["tools"].s.numbers.__annotations__ == {"return": list[int]}
    assert names["tools"].s.blob.__annotations__ == {"return": dict[str, Any]}
    assert "NumbersArgs" not in names


def test_same_tool_names_on_two_servers_and_awkward_descriptions() -> None:
    first = tool_spec("a", "a", "search", "search", 'Say """hi""" \\ there.', {"properties": {"q": {}}})
    second = tool_spec("b", "b", "search", "search", 'Ends with a quote "', {"properties": {"q": {}}})
    control = {"properties": {"q": {"description": "A NUL\x00 here."}}}  # a NUL in source fails a parse
    third = tool_spec("c", "c", "find", "find", "Bell\x07.", control)
    names = defined(stubs([first, second, third]))
    assert names["tools"].a.search.__doc__ == 'Say """hi""" \\ there.'
    assert names["tools"].b.search.__doc__ == 'Ends with a quote "'
    assert names["tools"].c.find.__doc__ == "Bell\x07."
    renamed = names["SearchArgs2"]  # the second `search` on another server
    assert names["tools"].b.search.__annotations__["arguments"] == Unpack[renamed]


def test_local_tools_take_their_types_from_the_callable() -> None:
    def forecast(city: str, days: int = 3, units=None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
        """The weather ahead."""
        return {}

    names = defined(stubs([local_tool_spec("forecast", forecast)]))
    hints = hints_of(names["ForecastArgs"])
    assert hints == {"city": str, "days": NotRequired[int], "units": NotRequired[Any]}
    assert names["tools"].local.forecast.__doc__ == "The weather ahead."


def test_no_match_is_a_comment() -> None:
    text = stubs([], "0 of 3 tools")
    assert defined(text) and text.startswith("# no tool matches")


def test_a_tool_that_takes_other_keywords_says_so() -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": True}
    text = stubs([spec("put", schema)])
    assert "def put(**arguments: Unpack[PutArgs]) -> Any:  # takes other keywords too" in text and defined(
        text
    )
