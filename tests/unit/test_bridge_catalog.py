"""Naming, signatures, search and config parsing of the tool bridge."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mcp_sandbox.bridge.catalog import SearchIndex, ToolSpec, python_name, search, tool_spec
from mcp_sandbox.bridge.config import BridgeConfigError, StdioUpstream, UrlUpstream, load_bridge_config
from tests.upstreams.many_server import tool_names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("add", "add"),
        ("get-weather", "get_weather"),
        ("web.search v2", "web_search_v2"),
        ("2fa", "_2fa"),
        ("class", "class_"),
        ("match", "match"),  # a soft keyword is a valid name
        ("", "_"),
        ("naïve", "na_ve"),
    ],
)
def test_python_name(name: str, expected: str) -> None:
    assert python_name(name) == expected


def test_python_name_keeps_names_unique() -> None:
    taken: set[str] = set()
    assert [python_name(n, taken) for n in ("a-b", "a_b", "a.b")] == ["a_b", "a_b_2", "a_b_3"]


def test_spec_signature_and_doc() -> None:
    schema = {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to find."},
            "limit": {"type": "integer"},
            "from": {"type": ["string", "null"]},
            "filters": {"anyOf": [{"type": "object"}, {"type": "array"}]},
            "blob": {},
        },
        "required": ["query"],
    }
    spec = tool_spec("docs", "docs", "find-docs", "find_docs", "Search the docs.", schema)
    assert spec.signature == (
        "tools.docs.find_docs(query: str, limit: int = None, from_: str = None, "
        "filters: dict | list = None, blob: Any = None)"
    )
    assert spec.doc.startswith("Search the docs.\n\nArgs:\n    query (str): What to find.")
    assert [p.name for p in spec.params][2] == "from"  # sent upstream under its own name


def test_a_result_only_output_schema_is_unwrapped() -> None:
    wrapped = {"type": "object", "properties": {"result": {"type": "array"}}, "required": ["result"]}
    assert tool_spec("s", "s", "t", "t", None, {}, wrapped).unwrap_result is True
    assert tool_spec("s", "s", "t", "t", None, {}, {"properties": {"sum": {}}}).unwrap_result is False


def test_search_ranks_name_matches_first() -> None:
    specs = [
        tool_spec("a", "a", "list_files", "list_files", "List the files in a folder.", {}),
        tool_spec("a", "a", "weather", "weather", "Forecast for a city.", {}),
        tool_spec("b", "b", "read", "read", "Read one of the files.", {}),
    ]
    assert [s.name for s in search(specs, "files", 10)] == ["list_files", "read"]
    assert [s.name for s in search(specs, "city weather", 1)] == ["weather"]
    assert search(specs, "zebra", 10) == []


def test_config_in_claude_desktop_format(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    servers = {
        "files": {"command": "npx", "args": ["-y", "server"], "env": {"KEY": "v"}},
        "web": {"url": "http://127.0.0.1:9000/mcp"},
        "old": {"url": "http://127.0.0.1:9001/sse"},
    }
    path.write_text(json.dumps({"mcpServers": servers, "globalShortcut": ""}))
    config = load_bridge_config(path)
    assert isinstance(config.servers["files"], StdioUpstream) and config.servers["files"].env == {"KEY": "v"}
    web, old = config.servers["web"], config.servers["old"]
    assert isinstance(web, UrlUpstream) and not web.is_sse
    assert isinstance(old, UrlUpstream) and old.is_sse


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read"),
        ("{not json", "is not JSON"),
        ('{"servers": {}}', "mcpServers"),
        ('{"mcpServers": {"x": {"args": []}}}', "needs a `command` or an http(s) `url`"),
        ('{"mcpServers": {"x": {"url": "ftp://host"}}}', "bad server entry"),
    ],
)
def test_config_errors_say_what_is_wrong(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "servers.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(BridgeConfigError, match=re.escape(message)):
        load_bridge_config(path)


def test_the_server_refuses_to_start_with_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text("{not json")
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcp_sandbox",
            "serve",
            "--backend",
            "inprocess",
            "--bridge-config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode != 0
    assert "is not JSON" in completed.stderr and "Traceback" not in completed.stderr


#: Queries an agent writes, and the tool each should find first (among many_server's 100).
RANKING_QUERIES = {
    "create a jira item": "jira_create_item",
    "issues in jira that match a text": "jira_search_items",
    "newest pull requests on github": "github_list_items",
    "a csv report of zendesk tickets": "zendesk_export_items",
    "remove a slack message for good": "slack_delete_item",
    "give a ticket to a person in zendesk": "zendesk_assign_item",
    "add a comment to a notion page": "notion_comment_item",
    "change the fields of a salesforce lead": "salesforce_update_item",
    "fetch one calendar event by its id": "calendar_get_item",
    "new email in gmail": "gmail_create_item",
    "search drive files": "drive_search_items",
}


def word_count_rank(specs: list[ToolSpec], query: str, limit: int) -> list[ToolSpec]:
    """The ranking before BM25 (kept to measure against): 3 per query word in the name, 1 in the text."""
    query_words = [w for w in re.split(r"\W+", query.lower()) if w]
    scored = []
    for index, spec in enumerate(specs):
        name = f"{spec.server} {spec.name} {spec.server_py} {spec.name_py}".lower()
        text = f"{spec.description} {' '.join(p.name + ' ' + p.description for p in spec.params)}".lower()
        score = sum(3 * (w in name) + (w in text) for w in query_words)
        if score:
            scored.append((-score, index, spec))
    return [spec for _, _, spec in sorted(scored, key=lambda item: item[:2])[:limit]]


def test_bm25_finds_what_agents_ask_for_at_least_as_well_as_word_counts() -> None:
    schema = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What it is about."}},
    }
    specs = [tool_spec("many", "many", name, name, text, schema) for name, text in tool_names(100)]
    index = SearchIndex(specs)
    hits = {query: index.search(query, 1)[0].name for query in RANKING_QUERIES}
    assert hits == RANKING_QUERIES

    # Measured against the ranking before, by the reciprocal rank of the right tool in the top 10.
    def reciprocal_ranks(rank: Callable[[str], list[ToolSpec]]) -> float:
        total = 0.0
        for query, want in RANKING_QUERIES.items():
            names = [spec.name for spec in rank(query)]
            total += 1 / (names.index(want) + 1) if want in names else 0
        return total

    bm25 = reciprocal_ranks(lambda query: index.search(query, 10))
    assert bm25 >= reciprocal_ranks(lambda query: word_count_rank(specs, query, 10))


def test_search_is_flat_and_quick_at_a_thousand_tools() -> None:
    schema = {"type": "object", "properties": {"query": {"type": "string"}}}
    index = SearchIndex([tool_spec("many", "many", n, n, t, schema) for n, t in tool_names(1000)])
    assert index.search("create a jira item", 1)[0].name == "jira_create_item"
    assert index.search("", 3) == index.specs[:3]


def test_a_schema_that_says_it_takes_other_properties_gets_other_keywords() -> None:
    listed = {"type": "object", "properties": {"other": {"type": "string"}}, "required": ["other"]}
    assert tool_spec("s", "s", "t", "t", None, listed).other_keywords is None  # left out: not said
    closed = {**listed, "additionalProperties": False}
    assert tool_spec("s", "s", "t", "t", None, closed).other_keywords is None
    for more in ({"additionalProperties": True}, {"additionalProperties": {"type": "integer"}}):
        spec = tool_spec("s", "s", "t", "t", None, {**listed, **more})
        assert spec.other_keywords == "other_2"  # a parameter is called `other` already
        assert spec.signature == "tools.s.t(other: str, **other_2)"
